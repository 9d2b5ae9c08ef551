// DataLoader: batches a Dataset in the order of a (sharded) BatchSampler, optionally on
// background worker threads with bounded prefetch, and keeps a resumable position.
//
//   DataLoaderOptions o;  o.batch_size = 256;  o.shuffle = true;  o.num_workers = 2;
//   DataLoader loader(dataset, o);
//   for (int e = 0; e < epochs; ++e)
//     for (auto& batch : loader) { Tensor x = batch[0], y = batch[1]; ... }
//
// Note [Loader position]: the loader owns its position (epoch, batches consumed). Each batch
// handed out counts as consumed (so state_dict() inside the loop body counts the batch being
// processed). The loop that reaches the end of an epoch moves the position to (epoch + 1, 0).
// A loop left early resumes where it stopped at the next begin(). set_epoch(e) jumps to the
// start of e unless e is already the current epoch, so a torch-style loop that calls
// set_epoch(e) at the top of every epoch still resumes mid-epoch after load_state_dict().
// A loader with the same dataset and options that loads state_dict() yields exactly the
// batches the uninterrupted loader would have, in every later epoch too. The position is global
// (Note [global loader position] in sampler.cc): a loader with another number of ranks or
// another batch size resumes at the same sample, exactly when the global batch divides it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace accel::data {

struct Batch {
  Example data;                  // fields stacked along a new dim 0
  std::vector<int64_t> indices;  // dataset index of each row
  int64_t num_padding = 0;       // trailing rows duplicated by even_batches: drop in metrics
  int64_t epoch = 0;
  int64_t index = 0;  // position of this batch in this rank's epoch

  int64_t size() const { return int64_t(indices.size()); }
  int64_t num_valid() const { return size() - num_padding; }
  Tensor& operator[](size_t i) { return data[i]; }
  const Tensor& operator[](size_t i) const { return data[i]; }
  const Tensor& operator[](const std::string& name) const { return data[name]; }
};

// Where a loader is in its data, the same on every rank (Note [global loader position] in
// sampler.cc): epoch `epoch` has handed out the global samples [0, samples) of its order, plus
// what resume() needs to check that another loader would read the same order. The end of an
// epoch is samples == sampler_size, whatever the batching dropped or padded.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t samples = 0;       // global step * global_batch, or sampler_size at the epoch's end
  int64_t global_batch = 1;  // of the loader that saved it (informational)
  int64_t sampler_size = 0;
  bool drop_last = false;
  bool even_batches = true;
  uint64_t seed = 0;  // the loader's seed (shuffle, sample_generator())
  StateDict sampler;  // the sampler's state_dict()
};

// The position as a flat StateDict (what DataLoader::state_dict() returns; see docs/data.md),
// and back. position_from_state also reads the per-rank state of earlier versions (version 1:
// batches_consumed, batch_size, world_size, split_batches), converting it to the global
// position. ValueError (prefixed with `op`) naming a missing or malformed key.
StateDict position_state(const LoaderPosition& p);
LoaderPosition position_from_state(const StateDict& s,
                                   const char* op = "DataLoader.load_state_dict");

// Custom collate: receives the examples of one batch, in order.
using CollateFn = std::function<Example(std::vector<Example>)>;

// Seed of shuffling and of sample_generator() when none is given. A constant, not a draw from
// the global generator, so that every rank of a distributed run agrees on the order.
constexpr uint64_t kDefaultLoaderSeed = 0;

struct DataLoaderOptions {
  int64_t batch_size = 1;  // per rank; the global batch with split_batches
  bool shuffle = false;    // RandomSampler(seed) when no sampler is given
  bool drop_last = false;
  uint64_t seed = kDefaultLoaderSeed;
  SamplerPtr sampler{};     // custom order (replaces shuffle)
  CollateFn collate{};      // empty: stack, with a memcpy fast path for TensorDataset & co.
  int num_workers = 0;      // 0: fetch on the calling thread
  int prefetch_factor = 2;  // batches in flight per worker
  bool pin_memory = false;  // allocate batches from get_pinned_allocator() (CUDA targets)
  // Sharding: rank/world_size < 0 take RANK/WORLD_SIZE from the environment (single process
  // when unset). See Note [Batch layout across ranks] in sampler.cc.
  int64_t rank = -1;
  int64_t world_size = -1;
  bool even_batches = true;
  bool split_batches = false;
  // Put every tensor of every batch on this device before handing the batch out (what
  // Accelerator::prepare sets: Accelerate's device_placement); empty keeps batches where the
  // dataset and collate made them. See Note [Batch device placement] in dataloader.cc.
  std::optional<Device> device{};
  // Context parallelism (parallel/context_parallel.h; Accelerator::prepare sets it at cp_size >
  // 1): every batch tensor with a dimension `dim` keeps this rank's tokens of it, chunks `rank`
  // and 2 size - 1 - rank of 2 size (Note [zig-zag sequence sharding]); tensors of fewer
  // dimensions (per-sample labels) stay whole. A length not divisible by 2 size is a ShapeError
  // naming the field. size 1: off.
  struct SequenceShard {
    int64_t dim = 1;
    int rank = 0;
    int size = 1;
  } sequence_shard{};
};

class DataLoader {
 public:
  DataLoader(DatasetPtr dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  class Iterator;
  struct Sentinel {};
  // Starts (or resumes) the current epoch; see Note [Loader position].
  Iterator begin();
  Sentinel end() { return {}; }

  // Batches of this rank per epoch.
  int64_t size() const { return batch_sampler_.num_batches(); }
  int64_t epoch() const { return epoch_; }
  int64_t batches_consumed() const { return consumed_; }
  // Jump to the start of epoch `e`; no-op when e is the current epoch (see above).
  void set_epoch(int64_t e);
  // Position at batch `batch` (0..size()) of epoch `epoch`; seek(epoch(), 0) restarts.
  void seek(int64_t epoch, int64_t batch);
  // Skip the next n batches of the current epoch without loading them.
  void skip_first_batches(int64_t n) { seek(epoch_, consumed_ + n); }

  // The global position (Note [global loader position] in sampler.cc).
  LoaderPosition position() const;
  // Seeks to the global batch holding sample p.samples of epoch p.epoch and restores the seeds
  // and the sampler's state. Returns how many samples the next batches repeat: 0 when this
  // loader's global batch divides p.samples (always with the same global batch, at any number
  // of ranks), else p.samples rounded down to a whole global batch is where it resumes.
  // ValueError naming the field when sampler_size, drop_last, even_batches or the kind of
  // sampler (its state's keys) differ: the order would not be the saved run's. Nothing changes
  // when it throws. With `say` (an op name; give it on one rank only) repeated samples are said
  // once, in a warning naming that op.
  int64_t resume(const LoaderPosition& p, const char* say = nullptr);

  // Torch-style: position_state(position()); load_state_dict is resume(position_from_state(s))
  // and warns (on rank 0) when samples repeat. Reads states of earlier versions too.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& s);

  const BatchSampler& batch_sampler() const { return batch_sampler_; }
  const DataLoaderOptions& options() const { return options_; }
  const DatasetPtr& dataset() const { return dataset_; }

  // Builds batch `plan` of `epoch` on the calling thread (what a worker does).
  Batch fetch(const BatchPlan& plan, int64_t epoch, int64_t index) const;

 private:
  struct Run;
  friend class Iterator;
  bool next(Batch& out);                // false at the end of the epoch
  void place(Batch& b) const;           // options_.device
  void shard_sequence(Batch& b) const;  // options_.sequence_shard
  void stop_run();

  DatasetPtr dataset_;
  DataLoaderOptions options_;
  BatchSampler batch_sampler_;
  Allocator* alloc_ = nullptr;
  bool repin_custom_ = false;  // copy custom-collated batches into pinned memory
  int64_t epoch_ = 0;
  int64_t consumed_ = 0;
  std::unique_ptr<Run> run_;
};

class DataLoader::Iterator {
 public:
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;

  Iterator() = default;
  Batch& operator*() { return batch_; }
  Batch* operator->() { return &batch_; }
  Iterator& operator++() {
    if (!loader_->next(batch_)) loader_ = nullptr;
    return *this;
  }
  bool operator==(Sentinel) const { return loader_ == nullptr; }
  bool operator!=(Sentinel s) const { return !(*this == s); }

 private:
  friend class DataLoader;
  explicit Iterator(DataLoader* l) : loader_(l) { ++*this; }
  DataLoader* loader_ = nullptr;
  Batch batch_;
};

}  // namespace accel::data
