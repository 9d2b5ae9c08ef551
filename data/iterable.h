// Streaming datasets (torch.utils.data.IterableDataset) and the loader that shards them across
// ranks and workers.
//
//   struct Lines : IterableDataset {
//     std::unique_ptr<SampleStream> iter(int64_t epoch) const override { ... }
//   };
//   DataLoaderOptions o;  o.batch_size = 32;  o.num_workers = 2;   // rank/world from the env
//   IterableDataLoader loader(std::make_shared<Lines>(), o);
//   for (auto& batch : loader) { ... }   // Batch, as DataLoader's; indices = stream positions
//
// Note [iterable sharding]: the R ranks x W workers of a run are N = R * W shards; worker w of
// rank r is shard s = r * W + w (num_workers 0 counts as one worker, on the calling thread).
// Every shard opens the epoch's stream with iter(epoch) and keeps the examples at positions
// p = s, s + N, s + 2N, ... passing over the others with SampleStream::skip() (which a stream
// overrides when it can skip without decoding). So each example of the epoch is in exactly one
// shard: seen once across all ranks and workers, none lost, none repeated - provided iter(epoch)
// yields the same sequence each time it is called for that epoch. A dataset that shards itself
// (reads get_worker_info() inside iter(), torch style, e.g. to open only its own files) returns
// true from shards_itself(); the loader then keeps everything its stream yields.
//
// Each worker batches its own share (batch_size examples, the last batch of each worker may be
// short; drop_last drops those, losing examples as torch does), and the loader hands batches out
// round-robin over the workers, skipping workers that have finished, as torch does: the order is
// deterministic. Ranks may end with different numbers of batches (the stream length is unknown in
// advance, so there is no even_batches padding); a training loop whose collectives need equal
// counts must handle the tail (e.g. stop at the minimum, which Accelerate's join does).
//
// Randomness: before each example is produced, the fetching thread's sample context is
// (seed, epoch, position), so sample_generator() and the image transforms draw the same numbers
// for the same example whatever the number of workers or ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "data/dataloader.h"
#include "data/dataset.h"

namespace accel::data {

struct WorkerInfo {
  int64_t id = 0;           // worker on this rank
  int64_t num_workers = 1;  // workers per rank (1 when the loader has num_workers 0)
  int64_t rank = 0;
  int64_t world_size = 1;
  uint64_t seed = 0;  // the loader seed
  int64_t epoch = 0;
  int64_t shard() const { return rank * num_workers + id; }
  int64_t num_shards() const { return world_size * num_workers; }
};

// The shard of the calling thread while an IterableDataLoader runs the dataset's iter() or the
// stream's next()/skip() for it; nullptr elsewhere (torch's get_worker_info()).
const WorkerInfo* get_worker_info();

class SampleStream {
 public:
  virtual ~SampleStream() = default;
  // The next example into `out`; false at the end of the stream.
  virtual bool next(Example& out) = 0;
  // Passes over one example; false at the end. Override when skipping is cheaper than next().
  virtual bool skip() {
    Example e;
    return next(e);
  }
};

class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  // The stream of epoch `epoch`, the same sequence on every call (Note [iterable sharding]).
  virtual std::unique_ptr<SampleStream> iter(int64_t epoch) const = 0;
  // True when iter() yields only the calling shard's examples (get_worker_info()).
  virtual bool shards_itself() const { return false; }
};
using IterableDatasetPtr = std::shared_ptr<const IterableDataset>;

// An IterableDataset from a function that opens the stream of an epoch.
IterableDatasetPtr make_iterable(std::function<std::unique_ptr<SampleStream>(int64_t epoch)> open,
                                 bool shards_itself = false);
// A stream from a function returning the next example, or nothing at the end.
std::unique_ptr<SampleStream> make_stream(std::function<bool(Example&)> next);

// Batches an IterableDataset on num_workers threads (Note [iterable sharding]). Uses batch_size,
// drop_last, seed, collate, num_workers, prefetch_factor, pin_memory, rank/world_size (from
// RANK/WORLD_SIZE when both are < 0) and device of DataLoaderOptions; shuffle, sampler and
// split_batches are ValueErrors (a stream has no random access), even_batches is not applied.
// A loop that ends moves to the next epoch; a loop left early restarts its epoch at the next
// begin() (a stream has no position to resume from).
class IterableDataLoader {
 public:
  IterableDataLoader(IterableDatasetPtr dataset, DataLoaderOptions options = {});
  ~IterableDataLoader();
  IterableDataLoader(const IterableDataLoader&) = delete;
  IterableDataLoader& operator=(const IterableDataLoader&) = delete;

  class Iterator;
  struct Sentinel {};
  Iterator begin();
  Sentinel end() { return {}; }

  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t e);
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  struct Run;
  bool next(Batch& out);
  void stop_run();

  IterableDatasetPtr dataset_;
  DataLoaderOptions options_;
  int64_t rank_ = 0, world_size_ = 1;
  Allocator* alloc_ = nullptr;
  int64_t epoch_ = 0;
  std::unique_ptr<Run> run_;
};

class IterableDataLoader::Iterator {
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
  friend class IterableDataLoader;
  explicit Iterator(IterableDataLoader* l) : loader_(l) { ++*this; }
  IterableDataLoader* loader_ = nullptr;
  Batch batch_;
};

}  // namespace accel::data
