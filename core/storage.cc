#include "core/storage.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/error.h"

namespace accel {

// Note [CPU caching allocator]
// Training allocates the same sizes every step. Blocks are rounded up to a size class (powers of
// two split in 4 steps above 4 KiB, 64-byte granules below) and a freed block goes to a free list
// for its class instead of back to the system. Each thread keeps a small lock-free cache in front
// of the global, mutex-protected lists, so the per-op cost is a few loads and stores. Blocks above
// 1 MiB skip the per-thread caches (kThreadCacheMaxBytes) and come straight from mmap, so that
// releasing one gives its pages back to the OS at once (glibc would serve them from its heap
// after the first free raises its mmap threshold, and keep them after free()).
//
// What the cache may keep. Caching by size class has a cost: a block serves only its own class,
// so a program whose phases use different sizes needs sum over classes of each class's peak,
// which can be far above the peak bytes in use. Measured with ZeRO-2 on the 49.6M GPT at N = 4
// (bench/workloads zero-memory): peak in use 563 MiB, yet 781 MiB reserved, 423 MiB of it cached
// at the start of a step; the cached 7 MiB blocks (21, the full gradients of backward) and 20 MiB
// ones (10, the reduce-scatter buckets) were all reused every step, only never at the same time.
// Nothing in the cache was dead, so no age-based release would help; the RSS (769 MiB) was
// above ZeRO-1's (766) although ZeRO-2 needs 148 MiB less (now: 627 MiB, reserved 623, ZeRO-1
// unchanged at 757; docs/performance.md has the table). So the cache is bounded by what
// the program needs, as the reserved bytes relative to the high-water mark H of bytes in use
// (since start or empty_cache()), see CpuCacheLimits in core/storage.h:
//   bytes_reserved <= H + max(64 MiB, H / 8)
// An allocation the cache cannot serve that would break the bound first releases cached blocks,
// least recently freed first (one stamp order across all classes), the ones least likely to be
// wanted soon. A steady loop whose classes fit the bound never releases anything (every
// allocation after the first step is a hit: mlp, cnn, gpt of bench/workloads release nothing);
// one that does not trades a page fault per 4 KiB of re-faulted memory for the bound (ZeRO-2
// above: 254 releases, 523 MiB, over prepare and 7 steps, < 80 MiB a step against 4 s steps).
// Limits: the high-water mark includes one-off peaks (construction, loading) until
// empty_cache(); blocks over 256 MiB are never cached; the per-thread caches (<= 4 blocks of
// <= 1 MiB per class and thread) sit outside the bound. Stats count releases
// (release_count, bytes_released) and report the bound (reserved_limit).
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kSmallMax = 4096;
constexpr int kNumClasses = 64 + 4 * 40;  // 64 small granules + 4 steps per power of two
constexpr size_t kMaxCachedPerClassBytes = size_t(256) << 20;
constexpr int kThreadCacheSlots = 4;
// Blocks above this skip the per-thread caches: a large block freed on another thread (a
// collective's worker releasing its buffer) would otherwise sit in that thread's slots where the
// allocating thread can never reuse it, up to 4 blocks per size class (RSS far above the bytes
// in use under ZeRO). Large allocations are rare enough for the global list's lock. They are
// also the ones mapped directly (a multiple of 256 KiB, so of the page size).
constexpr size_t kThreadCacheMaxBytes = size_t(1) << 20;

int size_class(size_t n, size_t* rounded) {
  if (n <= kSmallMax) {
    const size_t g = (n + kAlign - 1) / kAlign;  // 0..64
    *rounded = std::max<size_t>(g, 1) * kAlign;
    return int(std::max<size_t>(g, 1) - 1);
  }
  // n > 4096: p = floor(log2(n-1)), four steps between 2^p and 2^(p+1).
  const int p = 63 - __builtin_clzll(n - 1);
  const size_t base = size_t(1) << p;
  const size_t step = base / 4;
  const size_t k = (n - base + step - 1) / step;  // 1..4
  *rounded = base + k * step;
  return 64 + (p - 12) * 4 + int(k) - 1;
}

void* system_block(size_t rounded) {
  if (rounded > kThreadCacheMaxBytes) {
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  return std::aligned_alloc(kAlign, rounded);
}

void release_block(void* p, size_t rounded) {
  if (rounded > kThreadCacheMaxBytes) {
    ::munmap(p, rounded);
  } else {
    std::free(p);
  }
}

struct CachedBlock {
  void* p;
  uint64_t stamp;  // when it was freed (global order, for releasing the oldest first)
};

struct FreeList {
  std::deque<CachedBlock> blocks;  // back: most recently freed (reused first, still warm)
  size_t bytes = 0;
};

size_t slack_for(const CpuCacheLimits& l, size_t high_water) {
  return std::max(l.slack_min_bytes, size_t(l.slack_fraction * double(high_water)));
}

class CpuCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) nbytes = 1;
    size_t rounded;
    const int c = size_class(nbytes, &rounded);
    if (c >= kNumClasses) return system_alloc(rounded, nbytes);
    ThreadCache& tc = thread_cache();
    if (tc.count[c] > 0) {
      void* p = tc.slots[c][--tc.count[c]];
      account_hit(rounded, tc);
      return p;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      FreeList& fl = lists_[c];
      if (!fl.blocks.empty()) {
        void* p = fl.blocks.back().p;
        fl.blocks.pop_back();
        fl.bytes -= rounded;
        cached_ -= rounded;
        in_use_ += rounded;
        note_peak();
        ++hits_;
        return p;
      }
    }
    return system_alloc(rounded, nbytes);
  }

  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    if (nbytes == 0) nbytes = 1;
    size_t rounded;
    const int c = size_class(nbytes, &rounded);
    if (c >= kNumClasses) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        in_use_ -= rounded;
        note_release(rounded);
      }
      release_block(p, rounded);
      return;
    }
    ThreadCache& tc = thread_cache();
    if (tc.alive && rounded <= kThreadCacheMaxBytes && tc.count[c] < kThreadCacheSlots) {
      tc.slots[c][tc.count[c]++] = p;
      in_use_.fetch_sub(rounded, std::memory_order_relaxed);
      return;
    }
    Victims victims;
    {
      std::lock_guard<std::mutex> lk(mu_);
      in_use_ -= rounded;
      if (lists_[c].bytes + rounded > kMaxCachedPerClassBytes) {
        note_release(rounded);
        victims.push_back({p, rounded});
      } else {
        push_block(c, p, rounded);
        trim_to_max_cached(victims);
      }
    }
    release_all(victims);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);  // reserved_ first, so that in_use_ <= reserved_
    AllocatorStats s;
    s.bytes_reserved = reserved_.load();
    s.bytes_in_use = in_use_.load();
    s.alloc_count = allocs_.load();
    s.cache_hits = hits_.load();
    for (const ThreadCache* tc : caches_) s.cache_hits += tc->hits.load(std::memory_order_relaxed);
    s.peak_bytes_in_use = peak_.load();
    s.release_count = releases_;
    s.bytes_released = bytes_released_;
    const size_t h = high_water_.load();
    s.reserved_limit = h + slack_for(limits_, h);
    return s;
  }

  void reset_peak_stats() override { peak_.store(in_use_.load()); }

  void empty_cache() override {
    Victims victims;
    ThreadCache& tc = thread_cache();
    {
      std::lock_guard<std::mutex> lk(mu_);
      // The calling thread's slots too: every other thread's cache is private to it.
      for (int c = 0; c < kNumClasses; ++c) {
        for (int i = 0; i < tc.count[c]; ++i) {
          note_release(class_bytes(c));
          victims.push_back({tc.slots[c][i], class_bytes(c)});
        }
        tc.count[c] = 0;
        for (const CachedBlock& b : lists_[c].blocks) {
          note_release(class_bytes(c));
          victims.push_back({b.p, class_bytes(c)});
        }
        lists_[c].blocks.clear();
        lists_[c].bytes = 0;
      }
      cached_ = 0;
      high_water_.store(in_use_.load());
    }
    release_all(victims);
    small_pool_trim();  // the calling thread's cached TensorImpl / Storage / node blocks
#if defined(__GLIBC__)
    malloc_trim(0);  // the small blocks went back to glibc; let it return what it can
#endif
  }

  void set_limits(const CpuCacheLimits& l) {
    ACCEL_CHECK(std::isfinite(l.slack_fraction) && l.slack_fraction >= 0, ValueError,
                "set_cpu_cache_limits", "slack_fraction must be finite and >= 0, got ",
                l.slack_fraction);
    Victims victims;
    {
      std::lock_guard<std::mutex> lk(mu_);
      limits_ = l;
      trim_to_max_cached(victims);
      trim_to_reserved_limit(0, victims);
    }
    release_all(victims);
  }

  CpuCacheLimits limits() const {
    std::lock_guard<std::mutex> lk(mu_);
    return limits_;
  }

 private:
  struct ThreadCache {
    void* slots[kNumClasses][kThreadCacheSlots];
    uint8_t count[kNumClasses] = {};
    bool alive = true;
    CpuCachingAllocator* owner = nullptr;
    // Hits served from the slots: written by this thread only (a load and a store, no locked
    // instruction on the fast path), summed by stats() over the registered caches.
    std::atomic<size_t> hits{0};
    ~ThreadCache() {
      alive = false;
      if (!owner) return;
      tls_slot() = &dead_cache();
      {
        std::lock_guard<std::mutex> lk(owner->mu_);
        owner->hits_ += hits.load(std::memory_order_relaxed);
        std::erase(owner->caches_, this);
      }
      // Hand cached blocks back to the global lists so other threads can reuse them.
      for (int c = 0; c < kNumClasses; ++c) {
        for (int i = 0; i < count[c]; ++i) owner->return_block(c, slots[c][i]);
        count[c] = 0;
      }
    }
  };

  // Note [TLS in a shared library]: a plain thread_local in libaccel.so goes through
  // __tls_get_addr on every access. The fast path reads one initial-exec pointer instead; the
  // cache itself lives on the heap, owned by a second thread_local whose destructor hands the
  // blocks back when the thread exits.
  static ThreadCache*& tls_slot() {
    static thread_local ThreadCache* tc __attribute__((tls_model("initial-exec"))) = nullptr;
    return tc;
  }
  // Used by a thread after its cache was destroyed (frees from other thread_local destructors):
  // never alive, never holds blocks, so every call takes the global path.
  static ThreadCache& dead_cache() {
    static ThreadCache* dead = [] {
      auto* d = new ThreadCache();
      d->alive = false;
      return d;
    }();
    return *dead;
  }
  ThreadCache& thread_cache() {
    ThreadCache* tc = tls_slot();
    if (ACCEL_LIKELY(tc != nullptr)) return *tc;
    static thread_local std::unique_ptr<ThreadCache> owner;
    owner = std::make_unique<ThreadCache>();
    owner->owner = this;
    {
      std::lock_guard<std::mutex> lk(mu_);
      caches_.push_back(owner.get());
    }
    tls_slot() = owner.get();
    return *owner;
  }

  struct Victim {
    void* p;
    size_t rounded;
  };
  // Blocks to give back to the system once the lock is dropped (munmap takes a while).
  using Victims = std::vector<Victim>;
  static void release_all(const Victims& v) {
    for (const Victim& b : v) release_block(b.p, b.rounded);
  }

  void return_block(int c, void* p) {
    Victims victims;
    {
      std::lock_guard<std::mutex> lk(mu_);
      push_block(c, p, class_bytes(c));
      trim_to_max_cached(victims);
    }
    release_all(victims);
  }

  // Under mu_.
  void push_block(int c, void* p, size_t rounded) {
    lists_[c].blocks.push_back({p, ++stamp_});
    lists_[c].bytes += rounded;
    cached_ += rounded;
  }
  void note_release(size_t rounded) {
    reserved_ -= rounded;
    ++releases_;
    bytes_released_ += rounded;
  }
  // Under mu_: moves the least recently freed block of the global lists to `victims`; false when
  // the lists are empty. A scan of the classes' oldest blocks: only on the slow path.
  bool release_oldest(Victims& victims) {
    int best = -1;
    for (int c = 0; c < kNumClasses; ++c) {
      if (!lists_[c].blocks.empty() &&
          (best < 0 || lists_[c].blocks.front().stamp < lists_[best].blocks.front().stamp))
        best = c;
    }
    if (best < 0) return false;
    const size_t rounded = class_bytes(best);
    victims.push_back({lists_[best].blocks.front().p, rounded});
    lists_[best].blocks.pop_front();
    lists_[best].bytes -= rounded;
    cached_ -= rounded;
    note_release(rounded);
    return true;
  }
  void trim_to_max_cached(Victims& victims) {
    while (cached_ > limits_.max_cached_bytes && release_oldest(victims)) {
    }
  }
  // Under mu_: makes room for `incoming` more reserved bytes within the bound (the high-water
  // mark counts the incoming allocation, which will be in use).
  void trim_to_reserved_limit(size_t incoming, Victims& victims) {
    const size_t h = std::max(high_water_.load(), in_use_.load() + incoming);
    const size_t limit = h + slack_for(limits_, h);
    while (reserved_ + incoming > limit && release_oldest(victims)) {
    }
  }

  static size_t class_bytes(int c) {
    if (c < 64) return size_t(c + 1) * kAlign;
    const int p = (c - 64) / 4 + 12;
    const size_t k = size_t((c - 64) % 4 + 1);
    const size_t base = size_t(1) << p;
    return base + k * (base / 4);
  }

  void account_hit(size_t rounded, ThreadCache& tc) {
    in_use_.fetch_add(rounded, std::memory_order_relaxed);
    note_peak();
    tc.hits.store(tc.hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  void* system_alloc(size_t rounded, size_t requested) {
    Victims victims;
    {
      std::lock_guard<std::mutex> lk(mu_);
      trim_to_reserved_limit(rounded, victims);
    }
    release_all(victims);
    void* p = system_block(rounded);
    if (!p) {
      ACCEL_THROW(Error, "allocate", "out of memory allocating ", requested, " bytes on cpu");
    }
    std::lock_guard<std::mutex> lk(mu_);
    in_use_ += rounded;
    reserved_ += rounded;
    note_peak();
    ++allocs_;
    return p;
  }

  mutable std::mutex mu_;
  FreeList lists_[kNumClasses];
  // Under mu_: the live threads' caches (their hit counters); hits_ adds those of exited threads
  // and of the global lists.
  std::vector<ThreadCache*> caches_;
  // Under mu_: bytes in the global lists, the stamp of the last freed block, limits, releases.
  size_t cached_ = 0;
  uint64_t stamp_ = 0;
  CpuCacheLimits limits_;
  size_t releases_ = 0, bytes_released_ = 0;
  // Stats are relaxed atomics so the thread-cache fast path takes no lock.
  // peak_ is raised after the fact (a racing pair of allocations may record the larger of the
  // two sums a moment late, never a value that was not reached). high_water_ is the same mark
  // for the cache bound, restarted only by empty_cache().
  void note_peak() {
    const size_t now = in_use_.load(std::memory_order_relaxed);
    raise(peak_, now);
    raise(high_water_, now);
  }
  static void raise(std::atomic<size_t>& mark, size_t now) {
    size_t seen = mark.load(std::memory_order_relaxed);
    while (now > seen && !mark.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  std::atomic<size_t> in_use_{0}, reserved_{0}, allocs_{0}, hits_{0}, peak_{0}, high_water_{0};
};

CpuCachingAllocator& cpu_allocator() {
  static CpuCachingAllocator* a = new CpuCachingAllocator();  // never destroyed: outlives statics
  return *a;
}

std::atomic<Allocator*> g_allocators[kNumDeviceTypes] = {};
std::atomic<Allocator*> g_pinned{nullptr};

}  // namespace

Allocator* get_allocator(Device d) {
  if (d.is_cpu()) return &cpu_allocator();
  Allocator* a = g_allocators[int(d.type)].load(std::memory_order_acquire);
  ACCEL_CHECK(a != nullptr, DeviceError, "allocate", "no allocator for device ", d,
              " (accel was built without CUDA, or no CUDA device is present)");
  return a;
}

void set_allocator(DeviceType t, Allocator* a) { g_allocators[int(t)].store(a); }

void set_cpu_cache_limits(const CpuCacheLimits& limits) { cpu_allocator().set_limits(limits); }
CpuCacheLimits cpu_cache_limits() { return cpu_allocator().limits(); }

Allocator* get_pinned_allocator() {
  Allocator* a = g_pinned.load(std::memory_order_acquire);
  return a ? a : &cpu_allocator();
}
void set_pinned_allocator(Allocator* a) { g_pinned.store(a); }

Storage::Storage(size_t nbytes, Device device, Allocator* alloc)
    : nbytes_(nbytes), device_(device), alloc_(alloc ? alloc : get_allocator(device)) {
  data_ = alloc_->allocate(nbytes, device);
}

Storage::Storage(size_t nbytes, Device device, Unallocated)
    : nbytes_(nbytes), device_(device), alloc_(get_allocator(device)) {}

void Storage::release() {
  ACCEL_CHECK(alloc_ != nullptr, ValueError, "Storage.release",
              "a borrowed buffer (from_blob) cannot be released");
  if (!data_) return;
  alloc_->deallocate(data_, nbytes_);
  data_ = nullptr;
}

void Storage::materialize() {
  ACCEL_CHECK(alloc_ != nullptr, ValueError, "Storage.materialize",
              "a borrowed buffer (from_blob) cannot be re-allocated");
  if (data_ || nbytes_ == 0) return;
  data_ = alloc_->allocate(nbytes_, device_);
}

void Storage::throw_released() const {
  ACCEL_THROW(ValueError, "tensor data", "the storage of this tensor is not allocated (", nbytes_,
              " bytes on ", device_,
              "): it was released (a ZeRO-3 parameter outside its unit's forward or backward, "
              "see Note [unit lifecycle] in dist/fsdp.h) or created deferred (nn::DeferredInit) "
              "and never materialized");
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (alloc_) {
    if (!data_) return;
    alloc_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace accel
