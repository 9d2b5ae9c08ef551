// Samplers decide the order in which dataset indices are visited in each epoch; BatchSampler
// groups that order into batches and shards them across distributed ranks.
//
// Contract (see Note [Pure epoch orders] in sampler.cc): a sampler's order for epoch e is a
// pure function of its construction arguments, its state_dict() and e. That is what lets every
// rank compute the same order independently, and lets a resumed run recompute the order of the
// interrupted epoch instead of storing it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::data {

// Checkpointable state: flat string keys and values (numbers printed in decimal). Nested
// components prefix their keys ("sampler.seed"). Serialise it however the checkpoint does
// (e.g. one JSON object); state_to_json()/state_from_json() give the canonical JSON text.
using StateDict = std::map<std::string, std::string>;
std::string state_to_json(const StateDict& s);
StateDict state_from_json(const std::string& json);

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Number of indices in every epoch.
  virtual int64_t size() const = 0;
  // The order of epoch `epoch` (see the contract above).
  virtual std::vector<int64_t> epoch_indices(int64_t epoch) const = 0;
  // Seeds and other state needed to reproduce the orders; default none.
  virtual StateDict state_dict() const { return {}; }
  virtual void load_state_dict(const StateDict& /*s*/) {}

  // Torch-style convenience: the order of the epoch last passed to set_epoch().
  void set_epoch(int64_t e) { epoch_ = e; }
  int64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices() const { return epoch_indices(epoch_); }

 protected:
  int64_t epoch_ = 0;
};

using SamplerPtr = std::shared_ptr<Sampler>;

// 0, 1, ..., n-1 every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A fresh permutation of 0..n-1 each epoch, drawn from a generator seeded with (seed, epoch).
// With replacement: num_samples uniform draws instead.
class RandomSampler final : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0, bool replacement = false,
                         int64_t num_samples = -1);  // -1: n
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& s) override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
  bool replacement_;
  int64_t num_samples_;
};

// Index i drawn with probability weights[i] / sum(weights). Without replacement each index is
// drawn at most once (num_samples <= number of positive weights), in weighted-random order.
class WeightedRandomSampler final : public Sampler {
 public:
  WeightedRandomSampler(std::vector<double> weights, int64_t num_samples, bool replacement = true,
                        uint64_t seed = 0);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& s) override;

 private:
  std::vector<double> weights_;
  std::vector<double> cumulative_;  // inclusive prefix sums, for draws with replacement
  int64_t num_samples_;
  bool replacement_;
  uint64_t seed_;
};

// A fixed list of indices visited in random order (seeded like RandomSampler).
class SubsetRandomSampler final : public Sampler {
 public:
  SubsetRandomSampler(std::vector<int64_t> indices, uint64_t seed = 0);
  int64_t size() const override { return int64_t(indices_.size()); }
  std::vector<int64_t> epoch_indices(int64_t epoch) const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& s) override;

 private:
  std::vector<int64_t> indices_;
  uint64_t seed_;
};

// ---- distributed sharding ----

struct ShardOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  // Pad the last global batch by wrapping to the start of the epoch order, so every rank has
  // the same number of batches (collectives stay matched). Padding is recorded per batch.
  bool even_batches = true;
  // batch_size is the global batch, split evenly across ranks (must divide by world_size);
  // otherwise batch_size is per rank and the global batch is batch_size * world_size.
  bool split_batches = false;

  // RANK / WORLD_SIZE from the environment (the launcher's contract); rank 0 of 1 when neither
  // is set. Malformed or half-set variables are a ValueError.
  static ShardOptions from_env();
};

// One rank's batch: dataset indices in order, the last `num_padding` of which are duplicates
// added by even_batches (drop them from evaluation metrics).
struct BatchPlan {
  std::vector<int64_t> indices;
  int64_t num_padding = 0;
};

// Note [Batch layout across ranks] in sampler.cc: global step s covers order[s*G, (s+1)*G) with
// G = per-rank batch * world_size; rank r takes its contiguous block of it. So W ranks see the
// same global batches as one process with batch G, whatever the sampler.
class BatchSampler {
 public:
  BatchSampler(SamplerPtr sampler, int64_t batch_size, bool drop_last = false,
               ShardOptions shard = {});

  const Sampler& sampler() const { return *sampler_; }
  Sampler& sampler() { return *sampler_; }
  const SamplerPtr& sampler_ptr() const { return sampler_; }
  const ShardOptions& shard() const { return shard_; }
  int64_t batch_size() const { return batch_size_; }         // as given
  int64_t local_batch_size() const { return local_batch_; }  // full batch of this rank
  int64_t global_batch_size() const { return local_batch_ * shard_.world_size; }
  bool drop_last() const { return drop_last_; }

  // Batches of this rank per epoch (the same every epoch).
  int64_t num_batches() const { return num_batches_; }
  // Samples an epoch hands out on all ranks together, padding not counted: the complete global
  // batches' and the partial step's (none with drop_last).
  int64_t epoch_samples() const { return full_steps_ * global_batch_size() + tail_; }
  // The epoch order this rank shards (identical on every rank).
  std::vector<int64_t> order(int64_t epoch) const { return sampler_->epoch_indices(epoch); }
  // Batch b (0 <= b < num_batches()) of this rank, given the epoch order.
  BatchPlan plan(const std::vector<int64_t>& order, int64_t b) const;
  // All of this rank's batches of an epoch.
  std::vector<BatchPlan> batches(int64_t epoch) const;

 private:
  SamplerPtr sampler_;
  int64_t batch_size_;
  bool drop_last_;
  ShardOptions shard_;
  int64_t local_batch_ = 0;
  int64_t n_ = 0;           // sampler size
  int64_t full_steps_ = 0;  // complete global batches
  int64_t tail_ = 0;        // samples in the partial last global batch (0 when dropped)
  int64_t num_batches_ = 0;
};

}  // namespace accel::data
