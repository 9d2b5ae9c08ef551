#include "data/iterable.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "data/process_shard.h"

namespace accel::data {

namespace {

thread_local const WorkerInfo* t_worker = nullptr;

// Sets the thread's worker info and sample context for a call into the dataset.
struct WorkerScope {
  explicit WorkerScope(const WorkerInfo* w) { t_worker = w; }
  ~WorkerScope() {
    t_worker = nullptr;
    set_current_sample(SampleContext{});
  }
};

class FnIterable final : public IterableDataset {
 public:
  FnIterable(std::function<std::unique_ptr<SampleStream>(int64_t)> open, bool self)
      : open_(std::move(open)), self_(self) {}
  std::unique_ptr<SampleStream> iter(int64_t epoch) const override { return open_(epoch); }
  bool shards_itself() const override { return self_; }

 private:
  std::function<std::unique_ptr<SampleStream>(int64_t)> open_;
  bool self_;
};

class FnStream final : public SampleStream {
 public:
  explicit FnStream(std::function<bool(Example&)> next) : next_(std::move(next)) {}
  bool next(Example& out) override { return next_(out); }

 private:
  std::function<bool(Example&)> next_;
};

// One shard's reading state: its stream, the stream position, and whether it has ended.
struct Shard {
  WorkerInfo info;
  std::unique_ptr<SampleStream> stream;
  int64_t position = 0;  // next stream position (default mode) / examples taken (self-sharding)
  bool ended = false;
};

}  // namespace

const WorkerInfo* get_worker_info() { return t_worker; }

IterableDatasetPtr make_iterable(std::function<std::unique_ptr<SampleStream>(int64_t epoch)> open,
                                 bool shards_itself) {
  ACCEL_CHECK(bool(open), ValueError, "make_iterable", "the open function is empty");
  return std::make_shared<FnIterable>(std::move(open), shards_itself);
}

std::unique_ptr<SampleStream> make_stream(std::function<bool(Example&)> next) {
  ACCEL_CHECK(bool(next), ValueError, "make_stream", "the next function is empty");
  return std::make_unique<FnStream>(std::move(next));
}

struct IterableDataLoader::Run {
  struct Item {
    Batch batch;
    std::exception_ptr error;
    bool end = false;
  };

  const IterableDataLoader* loader;
  int64_t epoch;
  std::vector<Shard> shards;  // one per worker of this rank
  std::vector<bool> active;
  size_t cursor = 0;
  int64_t next_index = 0;

  // With worker threads: one bounded queue per worker.
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::vector<std::deque<Item>> queues;
  std::vector<std::thread> threads;

  Run(const IterableDataLoader* l, int64_t e) : loader(l), epoch(e) {
    const DataLoaderOptions& o = l->options_;
    const int64_t nw = std::max<int64_t>(1, o.num_workers);
    shards.resize(size_t(nw));
    active.assign(size_t(nw), true);
    for (int64_t w = 0; w < nw; ++w) {
      WorkerInfo& wi = shards[size_t(w)].info;
      wi.id = w;
      wi.num_workers = nw;
      wi.rank = l->rank_;
      wi.world_size = l->world_size_;
      wi.seed = o.seed;
      wi.epoch = e;
    }
    if (o.num_workers <= 0) return;
    queues.resize(size_t(nw));
    try {
      for (int64_t w = 0; w < nw; ++w) threads.emplace_back([this, w] { work(size_t(w)); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ~Run() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }

  // The next batch of shard `s` into `out`; false when its stream has ended with nothing left.
  bool produce(Shard& s, Batch& out) const {
    const DataLoaderOptions& o = loader->options_;
    NoGradGuard no_grad;
    WorkerScope scope(&s.info);
    if (!s.stream && !s.ended) {
      s.stream = loader->dataset_->iter(epoch);
      ACCEL_CHECK(s.stream != nullptr, ValueError, "IterableDataLoader", "iter(", epoch,
                  ") returned a null stream");
    }
    const bool self = loader->dataset_->shards_itself();
    const int64_t n = s.info.num_shards(), me = s.info.shard();
    std::vector<Example> examples;
    std::vector<int64_t> positions;
    while (!s.ended && int64_t(examples.size()) < o.batch_size) {
      if (!self) {
        // Pass over the positions of the other shards up to ours.
        while (s.position % n != me) {
          if (!s.stream->skip()) {
            s.ended = true;
            break;
          }
          ++s.position;
        }
        if (s.ended) break;
      }
      // Self-sharding streams: the k-th example of shard s is numbered k * N + s (unique).
      const int64_t pos = self ? s.position * n + me : s.position;
      set_current_sample(SampleContext{o.seed, epoch, pos});
      Example e;
      if (!s.stream->next(e)) {
        s.ended = true;
        break;
      }
      ++s.position;
      examples.push_back(std::move(e));
      positions.push_back(pos);
    }
    if (s.ended) s.stream.reset();  // release files early
    if (examples.empty() || (o.drop_last && int64_t(examples.size()) < o.batch_size)) return false;
    set_current_sample(SampleContext{o.seed, epoch, -1});
    out = Batch{};
    out.indices = std::move(positions);
    out.epoch = epoch;
    out.data = o.collate ? o.collate(std::move(examples)) : collate_stack(examples, loader->alloc_);
    return true;
  }

  void work(size_t w) {
    for (;;) {
      Item it;
      try {
        it.end = !produce(shards[w], it.batch);
      } catch (...) {
        it.error = std::current_exception();
      }
      const bool last = it.end || it.error;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] {
          return stop || int64_t(queues[w].size()) < loader->options_.prefetch_factor;
        });
        if (stop) return;
        queues[w].push_back(std::move(it));
      }
      cv.notify_all();
      if (last) return;
    }
  }

  // The next batch round-robin over the workers still producing; false at the end of the epoch.
  bool take(Batch& out) {
    const size_t nw = shards.size();
    for (;;) {
      size_t tried = 0;
      while (tried < nw && !active[cursor]) {
        cursor = (cursor + 1) % nw;
        ++tried;
      }
      if (tried == nw) return false;
      const size_t w = cursor;
      Item it;
      if (threads.empty()) {
        it.end = !produce(shards[w], it.batch);
      } else {
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return !queues[w].empty(); });
          it = std::move(queues[w].front());
          queues[w].pop_front();
        }
        cv.notify_all();
        if (it.error) std::rethrow_exception(it.error);
      }
      if (it.end) {
        active[w] = false;
        continue;
      }
      cursor = (w + 1) % nw;
      out = std::move(it.batch);
      out.index = next_index++;
      return true;
    }
  }
};

IterableDataLoader::IterableDataLoader(IterableDatasetPtr dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  const char* op = "IterableDataLoader";
  ACCEL_CHECK(dataset_ != nullptr, ValueError, op, "dataset is null");
  ACCEL_CHECK(options_.batch_size >= 1, ValueError, op, "batch_size must be >= 1, got ",
              options_.batch_size);
  ACCEL_CHECK(options_.num_workers >= 0, ValueError, op, "num_workers must be >= 0, got ",
              options_.num_workers);
  ACCEL_CHECK(options_.prefetch_factor >= 1, ValueError, op, "prefetch_factor must be >= 1, got ",
              options_.prefetch_factor);
  ACCEL_CHECK(!options_.shuffle && !options_.sampler, ValueError, op,
              "a streaming dataset has no random access: shuffle and sampler are not supported "
              "(shuffle inside the stream, e.g. with a buffer)");
  ACCEL_CHECK(!options_.split_batches, ValueError, op,
              "split_batches is not supported for streaming datasets");
  if (options_.rank < 0 && options_.world_size < 0) {
    const ShardOptions s = ShardOptions::from_env();
    rank_ = s.rank;
    world_size_ = s.world_size;
  } else {
    ACCEL_CHECK(
        options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
        ValueError, op, "need 0 <= rank < world_size, got rank ", options_.rank, ", world_size ",
        options_.world_size);
    rank_ = options_.rank;
    world_size_ = options_.world_size;
  }
  if (options_.pin_memory) alloc_ = get_pinned_allocator();
}

IterableDataLoader::~IterableDataLoader() { stop_run(); }

void IterableDataLoader::stop_run() { run_.reset(); }

IterableDataLoader::Iterator IterableDataLoader::begin() {
  stop_run();
  return Iterator(this);
}

void IterableDataLoader::set_epoch(int64_t e) {
  ACCEL_CHECK(e >= 0, ValueError, "IterableDataLoader.set_epoch", "negative epoch ", e);
  if (e == epoch_) return;
  stop_run();
  epoch_ = e;
}

bool IterableDataLoader::next(Batch& out) {
  if (!run_) {
    // Note [process data shard] in data/process_shard.h
    if (options_.rank < 0 && options_.world_size < 0) {
      ShardOptions s;
      s.rank = rank_;
      s.world_size = world_size_;
      check_env_shard(s, "IterableDataLoader");
    }
    run_ = std::make_unique<Run>(this, epoch_);
  }
  bool got = false;
  try {
    got = run_->take(out);
  } catch (...) {
    stop_run();  // the epoch restarts at the next begin()
    throw;
  }
  if (!got) {
    stop_run();
    ++epoch_;
    return false;
  }
  if (options_.device) {
    const Device d = *options_.device;
    for (Tensor& t : out.data.fields) {
      if (t.defined() && t.device() != d) t = t.to(d, /*non_blocking=*/true);
    }
  }
  return true;
}

}  // namespace accel::data
