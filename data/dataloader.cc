#include "data/dataloader.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#include "autograd/context_attention.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/warning.h"
#include "data/process_shard.h"

namespace accel::data {

namespace {

ShardOptions resolve_shard(const DataLoaderOptions& o) {
  ShardOptions s;
  if (o.rank < 0 && o.world_size < 0) {
    s = ShardOptions::from_env();
  } else {
    ACCEL_CHECK(o.rank >= 0 && o.world_size >= 1, ValueError, "DataLoader",
                "give both rank and world_size (got rank ", o.rank, ", world_size ", o.world_size,
                "), or neither to read RANK/WORLD_SIZE");
    s.rank = o.rank;
    s.world_size = o.world_size;
  }
  s.even_batches = o.even_batches;
  s.split_batches = o.split_batches;
  return s;
}

SamplerPtr resolve_sampler(const DatasetPtr& ds, const DataLoaderOptions& o) {
  ACCEL_CHECK(ds != nullptr, ValueError, "DataLoader", "dataset is null");
  if (o.sampler) return o.sampler;
  if (o.shuffle) return std::make_shared<RandomSampler>(ds->size(), o.seed);
  return std::make_shared<SequentialSampler>(ds->size());
}

// Restores the fetching thread's sample context however the fetch exits.
struct SampleScope {
  ~SampleScope() { set_current_sample(SampleContext{}); }
};

// The integer at `key`, parsed whole; ValueError prefixed with `op` when missing or malformed.
template <typename T>
T parse_int(const StateDict& s, const std::string& key, const char* op) {
  auto it = s.find(key);
  ACCEL_CHECK(it != s.end(), ValueError, op, "state has no key '", key, "'");
  size_t used = 0;
  T v = 0;
  try {
    if constexpr (std::is_signed_v<T>) {
      v = T(std::stoll(it->second, &used));
    } else {
      v = T(std::stoull(it->second, &used));
    }
  } catch (const std::exception&) {
    used = 0;
  }
  const bool sign_ok = std::is_signed_v<T> || it->second.find('-') == std::string::npos;
  ACCEL_CHECK(used == it->second.size() && used > 0 && sign_ok, ValueError, op, "key '", key,
              "' = '", it->second, "' is not ", std::is_signed_v<T> ? "an" : "an unsigned",
              " integer");
  return v;
}
int64_t parse_i64(const StateDict& s, const std::string& key, const char* op) {
  return parse_int<long long>(s, key, op);
}
uint64_t parse_u64(const StateDict& s, const std::string& key, const char* op) {
  return parse_int<unsigned long long>(s, key, op);
}

}  // namespace

// One pass over (the rest of) an epoch. With workers: batch k goes to slot k % window, and a
// worker only starts batch k while k < next_yield + window, so slots never collide, at most
// `window` batches are in memory, and batches come out in order however the threads race.
struct DataLoader::Run {
  struct Slot {
    int64_t index = -1;
    Batch batch;
    std::exception_ptr error;
  };

  const DataLoader* loader;
  int64_t epoch;
  std::vector<int64_t> order;
  int64_t end;         // batches in the epoch
  int64_t next_yield;  // next batch handed to the consumer

  int64_t window = 0;
  std::mutex mu;
  std::condition_variable cv_work, cv_ready;
  int64_t next_task = 0;
  bool stop = false;
  std::vector<Slot> slots;
  std::vector<std::thread> threads;

  Run(const DataLoader* l, int64_t e, int64_t start)
      : loader(l),
        epoch(e),
        order(l->batch_sampler_.order(e)),
        end(l->size()),
        next_yield(start),
        next_task(start) {
    const int nw = l->options_.num_workers;
    if (nw <= 0 || start >= end) return;
    window = int64_t(nw) * std::max(1, l->options_.prefetch_factor);
    slots.resize(size_t(window));
    threads.reserve(size_t(nw));
    try {
      for (int w = 0; w < nw; ++w) threads.emplace_back([this] { work(); });
    } catch (...) {
      shutdown();  // a constructor that throws runs no destructor: join what was started
      throw;
    }
  }

  ~Run() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv_work.notify_all();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }

  void work() {
    for (;;) {
      int64_t k;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv_work.wait(lk,
                     [&] { return stop || next_task >= end || next_task < next_yield + window; });
        if (stop || next_task >= end) return;
        k = next_task++;
      }
      Slot s;
      s.index = k;
      try {
        s.batch = loader->fetch(loader->batch_sampler_.plan(order, k), epoch, k);
      } catch (...) {
        s.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        slots[size_t(k % window)] = std::move(s);
      }
      cv_ready.notify_all();
    }
  }

  // Batch next_yield; rethrows a worker's exception for that batch.
  void take(Batch& out) {
    const int64_t k = next_yield;
    if (threads.empty()) {
      out = loader->fetch(loader->batch_sampler_.plan(order, k), epoch, k);
      ++next_yield;
      return;
    }
    Slot s;
    {
      std::unique_lock<std::mutex> lk(mu);
      Slot& slot = slots[size_t(k % window)];
      cv_ready.wait(lk, [&] { return slot.index == k; });
      s = std::move(slot);
      slot.index = -1;
      ++next_yield;
    }
    cv_work.notify_all();
    if (s.error) std::rethrow_exception(s.error);
    out = std::move(s.batch);
  }
};

DataLoader::DataLoader(DatasetPtr dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(std::move(options)),
      batch_sampler_(resolve_sampler(dataset_, options_), options_.batch_size, options_.drop_last,
                     resolve_shard(options_)) {
  ACCEL_CHECK(options_.num_workers >= 0, ValueError, "DataLoader", "num_workers must be >= 0, got ",
              options_.num_workers);
  ACCEL_CHECK(options_.prefetch_factor >= 1, ValueError, "DataLoader",
              "prefetch_factor must be >= 1, got ", options_.prefetch_factor);
  ACCEL_CHECK(!(options_.sampler && options_.shuffle), ValueError, "DataLoader",
              "give either shuffle or a sampler, not both");
  if (options_.pin_memory) {
    alloc_ = get_pinned_allocator();
    // Without a pinned allocator (no CUDA) get_pinned_allocator() is the CPU one: no re-copy.
    repin_custom_ = bool(options_.collate) && alloc_ != get_allocator(kCPU);
  }
}

DataLoader::~DataLoader() { stop_run(); }

void DataLoader::stop_run() { run_.reset(); }

Batch DataLoader::fetch(const BatchPlan& plan, int64_t epoch, int64_t index) const {
  NoGradGuard no_grad;
  SampleScope scope;
  Batch b;
  b.indices = plan.indices;
  b.num_padding = plan.num_padding;
  b.epoch = epoch;
  b.index = index;
  set_current_sample(SampleContext{options_.seed, epoch, -1});
  if (!options_.collate && dataset_->get_batch(b.indices, alloc_, b.data)) return b;
  std::vector<Example> examples;
  examples.reserve(b.indices.size());
  for (int64_t i : b.indices) {
    set_current_sample(SampleContext{options_.seed, epoch, i});
    examples.push_back(dataset_->get(i));
  }
  set_current_sample(SampleContext{options_.seed, epoch, -1});
  if (!options_.collate) {
    b.data = collate_stack(examples, alloc_);
    return b;
  }
  b.data = options_.collate(std::move(examples));
  if (repin_custom_) {
    for (Tensor& t : b.data.fields) {
      if (!t.defined() || !t.device().is_cpu()) continue;
      Tensor p = empty_with_allocator(t.sizes(), t.dtype(), alloc_);
      if (t.is_contiguous()) {
        std::memcpy(p.data_ptr(), t.data_ptr(), t.nbytes());
      } else {
        p.copy_(t);
      }
      t = std::move(p);
    }
  }
  return b;
}

DataLoader::Iterator DataLoader::begin() {
  stop_run();
  return Iterator(this);
}

bool DataLoader::next(Batch& out) {
  if (!run_) {
    // Note [process data shard] in data/process_shard.h
    if (options_.rank < 0 && options_.world_size < 0)
      check_env_shard(batch_sampler_.shard(), "DataLoader");
    run_ = std::make_unique<Run>(this, epoch_, consumed_);
  }
  if (run_->next_yield >= run_->end) {
    // End of the epoch: the position moves on (Note [Loader position]).
    stop_run();
    ++epoch_;
    consumed_ = 0;
    return false;
  }
  try {
    run_->take(out);
    shard_sequence(out);
    place(out);
  } catch (...) {
    // The failed batch (fetch or device copy) is not consumed; the next begin() retries it.
    stop_run();
    throw;
  }
  consumed_ = run_->next_yield;
  return true;
}

// Note [Batch device placement]
// With options.device set, next() moves each batch to it on the consuming thread, after the
// worker built it (pinned when pin_memory; Accelerator::prepare pins on CUDA). The copies are
// non-blocking: from pinned memory they only enqueue on the consumer's current stream, the stream
// the training step then runs on, so they overlap the GPU's work on earlier batches and are
// ordered before the step that reads them without any synchronisation. The host buffer is freed
// right after the enqueue; the pinned allocator records an event at free time and reuses the block
// only once the copy is done (kernels/cuda/allocator.cc), so a worker cannot overwrite it early.
// From pageable memory the copy returns once the bytes are staged. Workers do not copy: a copy on
// a worker thread's stream would need an event per batch for the consumer's stream to wait on.
// Tensors already on the device (and every batch on a CPU target) are left as they are: free.
// A copy that fails (device out of memory) propagates like a failed fetch: the batch is not
// consumed and the next begin() retries it.
void DataLoader::place(Batch& b) const {
  if (!options_.device) return;
  const Device d = *options_.device;
  for (Tensor& t : b.data.fields) {
    if (t.defined() && t.device() != d) t = t.to(d, /*non_blocking=*/true);
  }
}

void DataLoader::shard_sequence(Batch& b) const {
  const DataLoaderOptions::SequenceShard& sh = options_.sequence_shard;
  if (sh.size <= 1) return;
  const int64_t c = sh.size, d = sh.dim;
  for (size_t i = 0; i < b.data.fields.size(); ++i) {
    Tensor& t = b.data.fields[i];
    if (!t.defined() || t.dim() <= d) continue;
    const int64_t T = t.size(d);
    ACCEL_CHECK(T % (2 * c) == 0, ShapeError, "DataLoader", "context parallelism (cp_size ", c,
                ") splits dim ", d,
                " of every batch field, "
                "but field ",
                b.data.names.size() > i ? "'" + b.data.names[i] + "'" : std::to_string(i),
                " of shape ", t.sizes(), " has ", T,
                " there, not divisible by 2 x cp_size = ", 2 * c,
                " (each rank holds two chunks of the sequence)");
    NoGradGuard ng;
    t = zigzag_part(t, d, sh.rank, sh.size);
  }
}

void DataLoader::set_epoch(int64_t e) {
  if (e == epoch_) return;
  seek(e, 0);
}

void DataLoader::seek(int64_t epoch, int64_t batch) {
  ACCEL_CHECK(epoch >= 0, ValueError, "DataLoader.seek", "negative epoch ", epoch);
  ACCEL_CHECK(batch >= 0 && batch <= size(), ValueError, "DataLoader.seek", "batch ", batch,
              " out of range: this rank has ", size(), " batches per epoch");
  stop_run();
  epoch_ = epoch;
  consumed_ = batch;
}

// Note [global loader position] in sampler.cc.
LoaderPosition DataLoader::position() const {
  LoaderPosition p;
  p.epoch = epoch_;
  p.sampler_size = batch_sampler_.sampler().size();
  p.global_batch = batch_sampler_.global_batch_size();
  // consumed_ == size(): every batch of the epoch is out (the loop has not yet moved on).
  p.samples = consumed_ >= size() ? p.sampler_size : consumed_ * p.global_batch;
  p.drop_last = batch_sampler_.drop_last();
  p.even_batches = batch_sampler_.shard().even_batches;
  p.seed = options_.seed;
  p.sampler = batch_sampler_.sampler().state_dict();
  return p;
}

int64_t DataLoader::resume(const LoaderPosition& p, const char* say) {
  const char* op = "DataLoader.resume";
  auto expect = [&](const char* key, int64_t theirs, int64_t mine) {
    ACCEL_CHECK(theirs == mine, ValueError, op, "the position was saved with ", key, " = ", theirs,
                ", this loader has ", mine, "; its order or batches would differ");
  };
  const Sampler& sampler = batch_sampler_.sampler();
  expect("sampler_size", p.sampler_size, sampler.size());
  expect("drop_last", p.drop_last, batch_sampler_.drop_last());
  expect("even_batches", p.even_batches, batch_sampler_.shard().even_batches);
  auto keys = [](const StateDict& s) {
    std::string k(1, '{');
    for (const auto& kv : s) {
      if (k.size() > 1) k.append(", ");
      k.append(kv.first);
    }
    k.push_back('}');
    return k;
  };
  const StateDict mine = sampler.state_dict();
  ACCEL_CHECK(keys(p.sampler) == keys(mine), ValueError, op,
              "the position's sampler state has keys ", keys(p.sampler),
              ", this loader's sampler has ", keys(mine),
              ": another kind of sampler, whose order would differ");
  ACCEL_CHECK(p.epoch >= 0, ValueError, op, "negative epoch ", p.epoch);
  ACCEL_CHECK(p.samples >= 0 && p.samples <= p.sampler_size, ValueError, op, "samples ", p.samples,
              " out of range: an epoch has ", p.sampler_size);
  ACCEL_CHECK(p.global_batch >= 1, ValueError, op, "global_batch ", p.global_batch,
              " must be >= 1");
  const int64_t global = batch_sampler_.global_batch_size();
  int64_t batch = size(), repeated = 0;
  if (p.samples < batch_sampler_.epoch_samples()) {
    batch = p.samples / global;
    repeated = p.samples % global;
  }
  // The sampler is shared with whoever built it; load into it so its orders match the saved run.
  // First: it is the one step that can still throw (a malformed value).
  const_cast<Sampler&>(sampler).load_state_dict(p.sampler);
  seek(p.epoch, std::min(batch, size()));
  options_.seed = p.seed;
  if (repeated > 0 && say)
    ACCEL_WARN_ONCE(say, "the data loader was saved at sample ", p.samples, " of epoch ", p.epoch,
                    ", not a multiple of this loader's global batch ", global, ": it resumes at ",
                    p.samples - repeated, ", so ", repeated, " samples are read twice");
  return repeated;
}

StateDict position_state(const LoaderPosition& p) {
  StateDict s;
  s["version"] = std::to_string(2);
  s["epoch"] = std::to_string(p.epoch);
  s["samples"] = std::to_string(p.samples);
  s["global_batch"] = std::to_string(p.global_batch);
  s["sampler_size"] = std::to_string(p.sampler_size);
  // Booleans as 0/1 through to_string: assigning a short literal trips a GCC 12 -Wrestrict bug.
  s["drop_last"] = std::to_string(int(p.drop_last));
  s["even_batches"] = std::to_string(int(p.even_batches));
  s["seed"] = std::to_string(p.seed);
  for (const auto& [k, v] : p.sampler) s["sampler." + k] = v;
  return s;
}

LoaderPosition position_from_state(const StateDict& s, const char* op) {
  const int64_t version = parse_i64(s, "version", op);
  ACCEL_CHECK(version == 1 || version == 2, ValueError, op, "unsupported state version ", version);
  auto flag = [&](const char* key) {
    const int64_t v = parse_i64(s, key, op);
    ACCEL_CHECK(v == 0 || v == 1, ValueError, op, "key '", key, "' = ", v, " is not 0 or 1");
    return v == 1;
  };
  LoaderPosition p;
  p.epoch = parse_i64(s, "epoch", op);
  p.sampler_size = parse_i64(s, "sampler_size", op);
  p.drop_last = flag("drop_last");
  p.even_batches = flag("even_batches");
  p.seed = parse_u64(s, "seed", op);
  for (const auto& [k, v] : s) {
    if (k.rfind("sampler.", 0) == 0) p.sampler[k.substr(8)] = v;
  }
  if (version == 2) {
    p.samples = parse_i64(s, "samples", op);
    p.global_batch = parse_i64(s, "global_batch", op);
    return p;
  }
  // Version 1 (before the position was global): this rank's batches consumed, per-rank batch
  // and sharding. Global step j covered j * G samples with G the global batch of that loader.
  const int64_t consumed = parse_i64(s, "batches_consumed", op);
  const int64_t batch = parse_i64(s, "batch_size", op);
  const int64_t world = parse_i64(s, "world_size", op);
  // Bounds that keep the arithmetic below from overflowing, whatever the file says.
  constexpr int64_t kMaxCount = int64_t(1) << 31;
  ACCEL_CHECK(batch >= 1 && batch < kMaxCount && world >= 1 && world < kMaxCount &&
                  p.sampler_size >= 0 && p.sampler_size < (int64_t(1) << 62),
              ValueError, op, "batch_size ", batch, ", world_size ", world, ", sampler_size ",
              p.sampler_size, " out of range");
  p.global_batch = flag("split_batches") ? batch : batch * world;
  const int64_t batches = (p.sampler_size + p.global_batch - 1) / p.global_batch;
  ACCEL_CHECK(consumed >= 0 && consumed <= batches, ValueError, op, "batches_consumed ", consumed,
              " out of range: an epoch had ", batches, " global batches");
  // The end of the epoch: past the partial step, or at the last full one under drop_last.
  const bool at_end =
      consumed == batches || (p.drop_last && consumed >= p.sampler_size / p.global_batch);
  p.samples = at_end ? p.sampler_size : consumed * p.global_batch;
  return p;
}

StateDict DataLoader::state_dict() const { return position_state(position()); }

void DataLoader::load_state_dict(const StateDict& s) {
  resume(position_from_state(s),
         batch_sampler_.shard().rank == 0 ? "DataLoader.load_state_dict" : nullptr);
}

}  // namespace accel::data
