// Storage: a ref-counted device buffer. Tensors and their views share one Storage.
// Memory comes from a per-device Allocator; the CPU one caches freed blocks by size class so
// that steady-state training does no malloc per op (see Note [CPU caching allocator]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/device.h"
#include "core/intrusive_ptr.h"
#include "core/small_pool.h"

namespace accel {

struct AllocatorStats {
  size_t bytes_in_use = 0;    // handed out to live storages
  size_t bytes_reserved = 0;  // in use + cached for reuse
  size_t alloc_count = 0;     // calls that reached the system allocator
  size_t cache_hits = 0;
  size_t peak_bytes_in_use = 0;  // largest bytes_in_use since start or reset_peak_stats()
  // Blocks handed back to the system (released from the cache by a bound or empty_cache(), or
  // too large to cache), and their bytes.
  size_t release_count = 0;
  size_t bytes_released = 0;
  // The bound the CPU allocator keeps bytes_reserved under by releasing cached blocks
  // (Note [CPU caching allocator]); 0 where an allocator has none.
  size_t reserved_limit = 0;
  // Free blocks kept for reuse.
  size_t bytes_cached() const {
    return bytes_reserved > bytes_in_use ? bytes_reserved - bytes_in_use : 0;
  }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `device` is where the memory must live (a CUDA allocator allocates on device.index whatever
  // the current device is; host allocators ignore it).
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Return cached blocks to the system. The CPU allocator also restarts the high-water mark its
  // cache is bounded by (CpuCacheLimits) from the bytes in use now.
  virtual void empty_cache() {}
  // Restart peak_bytes_in_use from the current bytes_in_use.
  virtual void reset_peak_stats() {}
};

// How much the CPU caching allocator may keep for reuse (Note [CPU caching allocator]).
// Reserved bytes (in use + cached) stay within a slack of the high-water mark of bytes in use
// since start or the last empty_cache():
//   bytes_reserved <= H + max(slack_min_bytes, slack_fraction * H)
// so the process footprint tracks what tensors really needed; an allocation that would break the
// bound first releases the least recently freed cached blocks. max_cached_bytes caps the cached
// bytes outright (0: only the per-thread caches keep blocks). The per-thread caches in front of
// the global lists (at most 4 blocks of up to 1 MiB per size class and thread) are not counted
// against either bound.
struct CpuCacheLimits {
  size_t slack_min_bytes = size_t(64) << 20;
  double slack_fraction = 0.125;
  size_t max_cached_bytes = SIZE_MAX;
};
// Applies at once (releases cached blocks down to the new bounds). ValueError for a negative or
// non-finite slack_fraction.
void set_cpu_cache_limits(const CpuCacheLimits& limits);
CpuCacheLimits cpu_cache_limits();

// Per device type; CUDA registers its allocator when the backend is built and a device exists.
Allocator* get_allocator(Device d);
void set_allocator(DeviceType t, Allocator* a);
// Pinned (page-locked) host memory for fast async copies; falls back to the CPU allocator.
Allocator* get_pinned_allocator();
void set_pinned_allocator(Allocator* a);

class Storage : public RefCounted {
 public:
  // Owned buffer from the device allocator.
  Storage(size_t nbytes, Device device, Allocator* alloc = nullptr);
  // Borrowed buffer (from_blob): `deleter` runs when the last reference goes (may be empty).
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  // An owned buffer of nbytes that is not allocated yet (materialize() allocates it).
  struct Unallocated {};
  Storage(size_t nbytes, Device device, Unallocated);
  ~Storage() override;
  // Note [small object pool] (core/small_pool.cc).
  static void* operator new(size_t n) { return small_pool_alloc(n); }
  static void operator delete(void* p, size_t n) noexcept { small_pool_free(p, n); }

  // Note [released storage]: an owned storage can give its memory back and get it again while
  // every tensor and view of it (autograd's saved tensors included) keeps pointing at it. ZeRO-3
  // frees a unit's gathered parameters this way between uses (dist/fsdp.h); deferred init
  // creates parameters unallocated. Reading the data of a released storage throws ValueError
  // instead of touching a null pointer. materialize() allocates uninitialised memory (without
  // bumping the version: a refill restores values, it does not modify them); the caller fills it.
  void release();
  void materialize();
  bool allocated() const { return data_ != nullptr || nbytes_ == 0; }
  void* data() const {
    if (data_ == nullptr && nbytes_ != 0) [[unlikely]]
      throw_released();
    return data_;
  }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Bumped by in-place ops; autograd checks saved tensors against it.
  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }
  // Puts the counter back after a write that restores the values saved tensors saw (ZeRO-3's
  // re-gather of a released parameter, Note [released storage]); any other write must bump.
  void set_version(uint32_t v) { version_ = v; }

 private:
  [[noreturn]] void throw_released() const;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* alloc_ = nullptr;  // null for borrowed buffers
  std::function<void(void*)> deleter_;
  uint32_t version_ = 0;
};

using StoragePtr = IntrusivePtr<Storage>;

}  // namespace accel
