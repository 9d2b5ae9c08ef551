#include "data/sampler.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/env_contract.h"
#include "core/error.h"
#include "core/generator.h"
#include "data/dataset.h"
#include "data/process_shard.h"

namespace accel::data {

// Note [Pure epoch orders]
// Random samplers do not keep a generator that advances from epoch to epoch. Each epoch's
// order comes from a generator seeded with mix_seed(seed, epoch), so the only RNG state to
// checkpoint is the seed, the order of any epoch can be recomputed (resume lands mid-epoch
// with the exact order the interrupted run had), and every rank derives the same order
// without communicating. Custom samplers must keep the same property.

namespace {

// Uniform integer in [0, n) without modulo bias (Lemire's multiply-shift with rejection).
uint64_t uniform_below(Generator& g, uint64_t n) {
  unsigned __int128 m = (unsigned __int128)g.next_u64() * n;
  uint64_t lo = uint64_t(m);
  if (lo < n) {
    const uint64_t threshold = (0 - n) % n;
    while (lo < threshold) {
      m = (unsigned __int128)g.next_u64() * n;
      lo = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

void shuffle(std::vector<int64_t>& v, Generator& g) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = size_t(uniform_below(g, i));
    std::swap(v[i - 1], v[j]);
  }
}

Generator epoch_generator(uint64_t seed, int64_t epoch) {
  return Generator(mix_seed(seed, uint64_t(epoch)));
}

uint64_t parse_u64(const StateDict& s, const std::string& key, const char* op) {
  auto it = s.find(key);
  ACCEL_CHECK(it != s.end(), ValueError, op, "state has no key '", key, "'");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(it->second.c_str(), &end, 10);
  ACCEL_CHECK(errno == 0 && end != it->second.c_str() && *end == '\0', ValueError, op, "key '", key,
              "' = '", it->second, "' is not an unsigned integer");
  return uint64_t(v);
}

}  // namespace

// ---- StateDict <-> JSON ----

std::string state_to_json(const StateDict& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : s) j[k] = v;
  return j.dump();
}

StateDict state_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ACCEL_THROW(ValueError, "state_from_json", "not valid JSON: ", e.what());
  }
  ACCEL_CHECK(j.is_object(), ValueError, "state_from_json", "expected a JSON object, got ",
              j.type_name());
  StateDict s;
  for (auto it = j.begin(); it != j.end(); ++it) {
    ACCEL_CHECK(it->is_string(), ValueError, "state_from_json", "value of '", it.key(), "' is a ",
                it->type_name(), ", expected a string");
    s[it.key()] = it->get<std::string>();
  }
  return s;
}

// ---- SequentialSampler ----

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  ACCEL_CHECK(n >= 0, ValueError, "SequentialSampler", "negative size ", n);
}

std::vector<int64_t> SequentialSampler::epoch_indices(int64_t) const {
  std::vector<int64_t> v(static_cast<size_t>(n_));
  std::iota(v.begin(), v.end(), int64_t(0));
  return v;
}

// ---- RandomSampler ----

RandomSampler::RandomSampler(int64_t n, uint64_t seed, bool replacement, int64_t num_samples)
    : n_(n),
      seed_(seed),
      replacement_(replacement),
      num_samples_(num_samples < 0 ? n : num_samples) {
  ACCEL_CHECK(n >= 0, ValueError, "RandomSampler", "negative size ", n);
  ACCEL_CHECK(replacement || num_samples_ == n, ValueError, "RandomSampler", "num_samples ",
              num_samples_, " differs from dataset size ", n,
              " without replacement (a permutation has exactly n indices)");
  ACCEL_CHECK(n > 0 || num_samples_ == 0, ValueError, "RandomSampler", "cannot draw ", num_samples_,
              " samples from an empty dataset");
}

std::vector<int64_t> RandomSampler::epoch_indices(int64_t epoch) const {
  Generator g = epoch_generator(seed_, epoch);
  if (replacement_) {
    std::vector<int64_t> v(static_cast<size_t>(num_samples_));
    for (auto& x : v) x = int64_t(uniform_below(g, uint64_t(n_)));
    return v;
  }
  std::vector<int64_t> v(static_cast<size_t>(n_));
  std::iota(v.begin(), v.end(), int64_t(0));
  shuffle(v, g);
  return v;
}

StateDict RandomSampler::state_dict() const { return {{"seed", std::to_string(seed_)}}; }
void RandomSampler::load_state_dict(const StateDict& s) {
  seed_ = parse_u64(s, "seed", "RandomSampler.load_state_dict");
}

// ---- WeightedRandomSampler ----

WeightedRandomSampler::WeightedRandomSampler(std::vector<double> weights, int64_t num_samples,
                                             bool replacement, uint64_t seed)
    : weights_(std::move(weights)),
      num_samples_(num_samples),
      replacement_(replacement),
      seed_(seed) {
  ACCEL_CHECK(num_samples >= 0, ValueError, "WeightedRandomSampler", "negative num_samples ",
              num_samples);
  ACCEL_CHECK(!weights_.empty() || num_samples == 0, ValueError, "WeightedRandomSampler",
              "no weights given");
  double total = 0;
  int64_t positive = 0;
  cumulative_.reserve(weights_.size());
  for (size_t i = 0; i < weights_.size(); ++i) {
    const double w = weights_[i];
    ACCEL_CHECK(std::isfinite(w) && w >= 0, ValueError, "WeightedRandomSampler", "weight ", i,
                " is ", w, "; weights must be finite and non-negative");
    total += w;
    positive += w > 0;
    cumulative_.push_back(total);
  }
  ACCEL_CHECK(num_samples == 0 || total > 0, ValueError, "WeightedRandomSampler", "all ",
              weights_.size(), " weights are zero");
  ACCEL_CHECK(replacement || num_samples <= positive, ValueError, "WeightedRandomSampler",
              "cannot draw ", num_samples, " samples without replacement: only ", positive, " of ",
              weights_.size(), " weights are positive");
}

std::vector<int64_t> WeightedRandomSampler::epoch_indices(int64_t epoch) const {
  Generator g = epoch_generator(seed_, epoch);
  std::vector<int64_t> v;
  v.reserve(size_t(num_samples_));
  if (replacement_) {
    const double total = cumulative_.back();
    for (int64_t k = 0; k < num_samples_; ++k) {
      const double u = g.next_double() * total;
      auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
      size_t i = size_t(it - cumulative_.begin());
      if (i >= weights_.size()) i = weights_.size() - 1;  // u rounded up to total
      while (weights_[i] == 0) --i;  // never land on a zero-weight entry through rounding
      v.push_back(int64_t(i));
    }
    return v;
  }
  // Efraimidis-Spirakis: key log(u)/w; the num_samples largest keys are a weighted sample
  // without replacement, and sorting by key gives the order of sequential weighted draws.
  std::vector<std::pair<double, int64_t>> keys;
  keys.reserve(weights_.size());
  for (size_t i = 0; i < weights_.size(); ++i) {
    const double u = 1.0 - g.next_double();  // (0, 1]
    if (weights_[i] > 0) keys.emplace_back(std::log(u) / weights_[i], int64_t(i));
  }
  std::partial_sort(keys.begin(), keys.begin() + num_samples_, keys.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first || (a.first == b.first && a.second < b.second);
                    });
  for (int64_t k = 0; k < num_samples_; ++k) v.push_back(keys[size_t(k)].second);
  return v;
}

StateDict WeightedRandomSampler::state_dict() const { return {{"seed", std::to_string(seed_)}}; }
void WeightedRandomSampler::load_state_dict(const StateDict& s) {
  seed_ = parse_u64(s, "seed", "WeightedRandomSampler.load_state_dict");
}

// ---- SubsetRandomSampler ----

SubsetRandomSampler::SubsetRandomSampler(std::vector<int64_t> indices, uint64_t seed)
    : indices_(std::move(indices)), seed_(seed) {}

std::vector<int64_t> SubsetRandomSampler::epoch_indices(int64_t epoch) const {
  Generator g = epoch_generator(seed_, epoch);
  std::vector<int64_t> v = indices_;
  shuffle(v, g);
  return v;
}

StateDict SubsetRandomSampler::state_dict() const { return {{"seed", std::to_string(seed_)}}; }
void SubsetRandomSampler::load_state_dict(const StateDict& s) {
  seed_ = parse_u64(s, "seed", "SubsetRandomSampler.load_state_dict");
}

// ---- ShardOptions ----

namespace {
std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  ACCEL_CHECK(errno == 0 && *end == '\0', ValueError, "ShardOptions.from_env", name, "='", v,
              "' is not an integer");
  return int64_t(x);
}
}  // namespace

ShardOptions ShardOptions::from_env() {
  const auto rank = env_int(env::kRank);
  const auto world = env_int(env::kWorldSize);
  ShardOptions s;
  if (!rank && !world) return s;
  ACCEL_CHECK(rank && world, ValueError, "ShardOptions.from_env",
              "RANK and WORLD_SIZE must be set together (RANK ", rank ? "set" : "unset",
              ", WORLD_SIZE ", world ? "set" : "unset", ")");
  ACCEL_CHECK(*world >= 1 && *rank >= 0 && *rank < *world, ValueError, "ShardOptions.from_env",
              "RANK=", *rank, " is not in [0, WORLD_SIZE=", *world, ")");
  s.rank = *rank;
  s.world_size = *world;
  return s;
}

namespace {
std::mutex& shard_mutex() {
  static std::mutex m;
  return m;
}
std::optional<ProcessDataShard>& shard_slot() {
  static std::optional<ProcessDataShard> s;
  return s;
}
}  // namespace

void set_process_data_shard(ProcessDataShard shard) {
  std::lock_guard<std::mutex> lock(shard_mutex());
  shard_slot() = std::move(shard);
}

void clear_process_data_shard(const void* owner) {
  std::lock_guard<std::mutex> lock(shard_mutex());
  if (shard_slot() && shard_slot()->owner == owner) shard_slot().reset();
}

std::optional<ProcessDataShard> process_data_shard() {
  std::lock_guard<std::mutex> lock(shard_mutex());
  return shard_slot();
}

void check_env_shard(const ShardOptions& s, const char* op) {
  const std::optional<ProcessDataShard> p = process_data_shard();
  if (!p || (p->rank == s.rank && p->size == s.world_size)) return;
  ACCEL_THROW(ValueError, op, "this loader shards over WORLD_SIZE = ", s.world_size,
              " ranks (it was built without rank / world_size, so it took RANK = ", s.rank,
              " / WORLD_SIZE), but ", p->source, ": this process reads data shard ", p->rank,
              " of ", p->size,
              ", and ranks of one shard (tp peers) must read the same batches. Pass the loader "
              "through acc.prepare(loader), or give rank / world_size from acc.mesh() "
              "(coordinate(\"dp\"), size(\"dp\"))");
}

// ---- BatchSampler ----

// Note [Batch layout across ranks]
// Let N = sampler size, W = world size, B = this rank's full batch (batch_size, or
// batch_size / W with split_batches) and G = B * W the global batch. Global step s covers
// order[s*G, (s+1)*G) and rank r takes the contiguous block [s*G + r*B, s*G + (r+1)*B).
// The last M = N mod G samples form a partial global step:
//  - drop_last: dropped on every rank.
//  - even_batches: padded to W * ceil(M / W) by wrapping to order[0], order[1], ...; each rank
//    takes ceil(M / W) of them. Every rank has the same number of batches; padding sits at the
//    end of the step, so only the last ranks' last batches hold padding, and num_padding
//    counts it. With W = 1 nothing is padded.
//  - otherwise: the M samples are split as evenly as possible (the first M mod W ranks take
//    one more); a rank whose share is empty has one batch fewer.
// Either way the non-padding samples of all ranks cover each position of the order exactly
// once, and the global batches are those a single process with batch G would see.
// Note [global loader position]
// The order of epoch e is a pure function of the sampler's state and e (Note [Pure epoch
// orders]): the same on every rank, whatever the world size, the rank, the batch size or the
// number of workers (workers only fetch the batches the consuming thread plans; tested in
// tests/data/test_loader_position.cc). With the layout above, global step s of any world size
// covers order[s*G, (s+1)*G), so where a run is in its data is one pair for all ranks: (e,
// samples = s*G), the samples of the order handed out so far (DataLoader::position(); at the end
// of an epoch samples = N, the whole order, whatever drop_last dropped). A checkpoint stores it
// once.
// A loader with global batch G' (any W', split_batches or not) resumes it (DataLoader::resume):
//  - samples % G' == 0 (always when G' == G, e.g. split_batches at another world size): at
//    global step samples / G' of epoch e; every later global batch is exactly the one the
//    uninterrupted run would have read;
//  - otherwise at step floor(samples / G'): samples % G' samples are read twice, and the
//    caller says so once (a warning);
//  - samples >= this loader's epoch_samples() (the end of the epoch): at the end of e.
// Checked, since they change the order or its batching: sampler_size, drop_last, even_batches
// and the kind of sampler (its state's keys). Restored, like torch's stateful loaders restore
// their generators: the loader seed and the sampler's state. Not compared: world size, rank,
// per-rank batch size, split_batches (the point of a global position).
BatchSampler::BatchSampler(SamplerPtr sampler, int64_t batch_size, bool drop_last,
                           ShardOptions shard)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last), shard_(shard) {
  ACCEL_CHECK(sampler_ != nullptr, ValueError, "BatchSampler", "sampler is null");
  ACCEL_CHECK(batch_size >= 1, ValueError, "BatchSampler", "batch_size must be >= 1, got ",
              batch_size);
  ACCEL_CHECK(shard.world_size >= 1 && shard.rank >= 0 && shard.rank < shard.world_size, ValueError,
              "BatchSampler", "rank ", shard.rank, " is not in [0, world_size=", shard.world_size,
              ")");
  if (shard.split_batches) {
    ACCEL_CHECK(batch_size % shard.world_size == 0, ValueError, "BatchSampler",
                "split_batches: global batch size ", batch_size, " is not divisible by world size ",
                shard.world_size);
    local_batch_ = batch_size / shard.world_size;
  } else {
    local_batch_ = batch_size;
  }
  n_ = sampler_->size();
  ACCEL_CHECK(n_ >= 0, ValueError, "BatchSampler", "sampler reports negative size ", n_);
  const int64_t g = global_batch_size();
  full_steps_ = n_ / g;
  tail_ = drop_last ? 0 : n_ % g;
  num_batches_ = full_steps_;
  if (tail_ > 0) {
    const int64_t w = shard.world_size;
    const int64_t share =
        shard.even_batches ? (tail_ + w - 1) / w : tail_ / w + (shard.rank < tail_ % w ? 1 : 0);
    if (share > 0) ++num_batches_;
  }
}

BatchPlan BatchSampler::plan(const std::vector<int64_t>& order, int64_t b) const {
  ACCEL_CHECK(int64_t(order.size()) == n_, ValueError, "BatchSampler", "sampler returned ",
              order.size(), " indices but reports size ", n_,
              " (epoch orders must have a constant length)");
  ACCEL_CHECK(b >= 0 && b < num_batches_, IndexError, "BatchSampler", "batch ", b,
              " out of range: rank ", shard_.rank, " has ", num_batches_, " batches per epoch");
  const int64_t r = shard_.rank, w = shard_.world_size, g = global_batch_size();
  BatchPlan p;
  if (b < full_steps_) {
    const auto first = order.begin() + (b * g + r * local_batch_);
    p.indices.assign(first, first + local_batch_);
    return p;
  }
  const int64_t base = full_steps_ * g;  // first position of the partial step
  int64_t begin, count;
  if (shard_.even_batches) {
    count = (tail_ + w - 1) / w;
    begin = r * count;
  } else {
    const int64_t q = tail_ / w, extra = tail_ % w;
    count = q + (r < extra ? 1 : 0);
    begin = r * q + std::min(r, extra);
  }
  p.indices.reserve(size_t(count));
  for (int64_t k = begin; k < begin + count; ++k) {
    if (k < tail_) {
      p.indices.push_back(order[size_t(base + k)]);
    } else {
      // Wrap to the start of this epoch's order (modulo: N may be smaller than the padding).
      p.indices.push_back(order[size_t((k - tail_) % n_)]);
      ++p.num_padding;
    }
  }
  return p;
}

std::vector<BatchPlan> BatchSampler::batches(int64_t epoch) const {
  const std::vector<int64_t> ord = order(epoch);
  std::vector<BatchPlan> out;
  out.reserve(size_t(num_batches_));
  for (int64_t b = 0; b < num_batches_; ++b) out.push_back(plan(ord, b));
  return out;
}

}  // namespace accel::data
