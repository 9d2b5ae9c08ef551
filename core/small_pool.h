// Per-thread free lists for the small objects every op makes and frees: TensorImpl, Storage,
// AutogradMeta and autograd nodes (Note [small object pool] in core/small_pool.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace accel {

// Blocks of up to kSmallPoolMax bytes come from the calling thread's free list for their size
// class (16-byte steps) when it has one, else from ::operator new; small_pool_free() keeps the
// block on the calling thread's list (whatever thread allocated it) up to a bound per class and
// gives the rest back with ::operator delete. Larger sizes go straight to new/delete. `n` must be
// the size the block was allocated with.
constexpr size_t kSmallPoolMax = 512;
void* small_pool_alloc(size_t n);
void small_pool_free(void* p, size_t n) noexcept;

struct SmallPoolStats {
  // Blocks obtained from ::operator new and not yet given back, over all threads (held by live
  // objects or cached in some thread's lists). Counted only on the slow paths.
  int64_t system_blocks = 0;
  // The calling thread's cached blocks, and its allocations served from / past its lists.
  int64_t thread_cached = 0;
  int64_t thread_hits = 0;
  int64_t thread_misses = 0;
};
SmallPoolStats small_pool_stats();
// Gives the calling thread's cached blocks back to the system (empty_cache() calls it; a thread's
// lists are also given back when it exits).
void small_pool_trim();

// std::allocator for std::allocate_shared: the node and its control block in one pooled block.
template <typename T>
struct SmallPoolAllocator {
  using value_type = T;
  SmallPoolAllocator() = default;
  template <typename U>
  SmallPoolAllocator(const SmallPoolAllocator<U>&) {}  // NOLINT
  T* allocate(size_t n) {
    if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
      return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
    } else {
      return static_cast<T*>(small_pool_alloc(n * sizeof(T)));
    }
  }
  void deallocate(T* p, size_t n) noexcept {
    if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
      ::operator delete(p, n * sizeof(T), std::align_val_t(alignof(T)));
    } else {
      small_pool_free(p, n * sizeof(T));
    }
  }
  template <typename U>
  bool operator==(const SmallPoolAllocator<U>&) const {
    return true;
  }
};

}  // namespace accel
