#include "core/storage.h"

#include <atomic>
#include <memory>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"

namespace accel {

// Note [CPU caching allocator]
// Training allocates the same sizes every step. Blocks are rounded up to a size class (powers of
// two split in 4 steps above 4 KiB, 64-byte granules below) and a freed block goes to a free list
// for its class instead of back to malloc. Each thread keeps a small lock-free cache in front of
// the global, mutex-protected lists, so the per-op cost is a few loads and stores. Memory cached
// per class is capped so a one-off huge allocation is not kept forever. Blocks above 1 MiB skip
// the per-thread caches (kThreadCacheMaxBytes).
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kSmallMax = 4096;
constexpr int kNumClasses = 64 + 4 * 40;  // 64 small granules + 4 steps per power of two
constexpr size_t kMaxCachedPerClassBytes = size_t(256) << 20;
constexpr int kThreadCacheSlots = 4;
// Blocks above this skip the per-thread caches: a large block freed on another thread (a
// collective's worker releasing its buffer) would otherwise sit in that thread's slots where the
// allocating thread can never reuse it, up to 4 blocks per size class (RSS far above the bytes
// in use under ZeRO). Large allocations are rare enough for the global list's lock.
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

struct FreeList {
  std::vector<void*> blocks;
  size_t bytes = 0;
};

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
      account_hit(rounded);
      return p;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      FreeList& fl = lists_[c];
      if (!fl.blocks.empty()) {
        void* p = fl.blocks.back();
        fl.blocks.pop_back();
        fl.bytes -= rounded;
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
      std::free(p);
      std::lock_guard<std::mutex> lk(mu_);
      in_use_ -= rounded;
      reserved_ -= rounded;
      return;
    }
    ThreadCache& tc = thread_cache();
    if (tc.alive && rounded <= kThreadCacheMaxBytes && tc.count[c] < kThreadCacheSlots) {
      tc.slots[c][tc.count[c]++] = p;
      in_use_.fetch_sub(rounded, std::memory_order_relaxed);
      return;
    }
    std::lock_guard<std::mutex> lk(mu_);
    in_use_ -= rounded;
    FreeList& fl = lists_[c];
    if (fl.bytes + rounded > kMaxCachedPerClassBytes) {
      std::free(p);
      reserved_ -= rounded;
      return;
    }
    fl.blocks.push_back(p);
    fl.bytes += rounded;
  }

  AllocatorStats stats() const override {
    AllocatorStats s;
    s.bytes_in_use = in_use_.load();
    s.bytes_reserved = reserved_.load();
    s.alloc_count = allocs_.load();
    s.cache_hits = hits_.load();
    s.peak_bytes_in_use = peak_.load();
    return s;
  }

  void reset_peak_stats() override { peak_.store(in_use_.load()); }

  void empty_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (int c = 0; c < kNumClasses; ++c) {
      for (void* p : lists_[c].blocks) std::free(p);
      reserved_ -= lists_[c].bytes;
      lists_[c].blocks.clear();
      lists_[c].bytes = 0;
    }
  }

 private:
  struct ThreadCache {
    void* slots[kNumClasses][kThreadCacheSlots];
    uint8_t count[kNumClasses] = {};
    bool alive = true;
    CpuCachingAllocator* owner = nullptr;
    ~ThreadCache() {
      alive = false;
      if (!owner) return;
      tls_slot() = &dead_cache();
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
    tls_slot() = owner.get();
    return *owner;
  }

  void return_block(int c, void* p) {
    size_t rounded = class_bytes(c);
    std::lock_guard<std::mutex> lk(mu_);
    lists_[c].blocks.push_back(p);
    lists_[c].bytes += rounded;
  }

  static size_t class_bytes(int c) {
    if (c < 64) return size_t(c + 1) * kAlign;
    const int p = (c - 64) / 4 + 12;
    const size_t k = size_t((c - 64) % 4 + 1);
    const size_t base = size_t(1) << p;
    return base + k * (base / 4);
  }

  void account_hit(size_t rounded) {
    in_use_.fetch_add(rounded, std::memory_order_relaxed);
    note_peak();
    hits_.fetch_add(1, std::memory_order_relaxed);
  }

  void* system_alloc(size_t rounded, size_t requested) {
    void* p = std::aligned_alloc(kAlign, rounded);
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
  // Stats are relaxed atomics so the thread-cache fast path takes no lock.
  // peak_ is raised after the fact (a racing pair of allocations may record the larger of the
  // two sums a moment late, never a value that was not reached).
  void note_peak() {
    const size_t now = in_use_.load(std::memory_order_relaxed);
    size_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  std::atomic<size_t> in_use_{0}, reserved_{0}, allocs_{0}, hits_{0}, peak_{0};
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
