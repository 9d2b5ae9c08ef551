// The CPU caching allocator's bounds (Note [CPU caching allocator] in core/storage.cc): what the
// cache keeps, what it gives back to the system, and that reuse still hits it. Every test uses
// the allocator from this (the only) thread, so the per-thread caches hold nothing unexpected.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "accel.h"

using namespace accel;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

Allocator* cpu() { return get_allocator(kCPU); }

// Starts from an empty cache and puts the default limits back whatever the test did.
struct FreshCache {
  FreshCache() { cpu()->empty_cache(); }
  ~FreshCache() {
    set_cpu_cache_limits(CpuCacheLimits{});
    cpu()->empty_cache();
  }
};

CpuCacheLimits no_slack() {
  CpuCacheLimits l;
  l.slack_min_bytes = 0;
  l.slack_fraction = 0;
  return l;
}

void* touch(void* p, size_t n) {
  std::memset(p, 1, n);
  return p;
}

// Resident bytes of this process (/proc/self/statm: pages).
size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * size_t(sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("reusing one size allocates from the system once, whatever the size") {
  FreshCache fresh;
  for (size_t n : {size_t(200), size_t(3000), size_t(100000), 3 * kMiB, 40 * kMiB}) {
    CAPTURE(n);
    const AllocatorStats before = cpu()->stats();
    for (int i = 0; i < 200; ++i) {
      void* p = cpu()->allocate(n, kCPU);
      static_cast<char*>(p)[n - 1] = 1;
      cpu()->deallocate(p, n);
    }
    const AllocatorStats after = cpu()->stats();
    CHECK(after.alloc_count == before.alloc_count + 1);
    CHECK(after.cache_hits == before.cache_hits + 199);
    CHECK(after.release_count == before.release_count);
    CHECK(after.bytes_in_use == before.bytes_in_use);
  }
}

TEST_CASE("the cache keeps reserved bytes within the slack of the high-water mark") {
  FreshCache fresh;
  set_cpu_cache_limits(no_slack());
  const AllocatorStats s0 = cpu()->stats();
  const size_t base = s0.bytes_in_use;
  CHECK(s0.reserved_limit == base);  // empty_cache restarted the high-water mark

  // Phase 1: 4 x 8 MiB in use at once, then freed: all cached, reserved = the high-water mark.
  std::vector<void*> eight;
  for (int i = 0; i < 4; ++i) eight.push_back(touch(cpu()->allocate(8 * kMiB, kCPU), 8 * kMiB));
  for (void* p : eight) cpu()->deallocate(p, 8 * kMiB);
  AllocatorStats s = cpu()->stats();
  CHECK(s.bytes_cached() == 32 * kMiB);
  CHECK(s.bytes_reserved == base + 32 * kMiB);
  CHECK(s.reserved_limit == base + 32 * kMiB);

  // Phase 2: another size class. Each miss must first release cached 8 MiB blocks.
  std::vector<void*> ten;
  for (int i = 0; i < 3; ++i) {
    ten.push_back(touch(cpu()->allocate(10 * kMiB, kCPU), 10 * kMiB));
    s = cpu()->stats();
    CHECK(s.bytes_reserved <= s.reserved_limit);
    CHECK(s.reserved_limit == base + 32 * kMiB);
  }
  CHECK(s.release_count == s0.release_count + 4);  // 30 + 8 > 32: none of the 8 MiB blocks left
  CHECK(s.bytes_released == s0.bytes_released + 32 * kMiB);
  CHECK(s.bytes_in_use == base + 30 * kMiB);
  CHECK(s.bytes_reserved == base + 30 * kMiB);
  for (void* p : ten) cpu()->deallocate(p, 10 * kMiB);

  // Phase 2 again: a steady loop within the bound only hits the cache.
  const AllocatorStats s1 = cpu()->stats();
  for (int step = 0; step < 5; ++step) {
    for (void*& p : ten) p = cpu()->allocate(10 * kMiB, kCPU);
    for (void* p : ten) cpu()->deallocate(p, 10 * kMiB);
  }
  s = cpu()->stats();
  CHECK(s.alloc_count == s1.alloc_count);
  CHECK(s.release_count == s1.release_count);
  CHECK(s.cache_hits == s1.cache_hits + 15);
}

TEST_CASE("the default slack keeps a phase change in the cache") {
  FreshCache fresh;  // default limits: 64 MiB slack at this size
  const AllocatorStats s0 = cpu()->stats();
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(cpu()->allocate(8 * kMiB, kCPU));
  for (void* p : blocks) cpu()->deallocate(p, 8 * kMiB);
  for (void*& p : blocks) p = cpu()->allocate(10 * kMiB, kCPU);
  for (void* p : blocks) cpu()->deallocate(p, 10 * kMiB);
  const AllocatorStats s = cpu()->stats();
  CHECK(s.release_count == s0.release_count);
  CHECK(s.bytes_reserved == s0.bytes_reserved + 72 * kMiB);
  CHECK(s.bytes_reserved <= s.reserved_limit);
}

TEST_CASE("the least recently freed block is released first") {
  FreshCache fresh;
  set_cpu_cache_limits(no_slack());
  const AllocatorStats s0 = cpu()->stats();
  void* a = cpu()->allocate(8 * kMiB, kCPU);
  void* b = cpu()->allocate(5 * kMiB, kCPU);
  cpu()->deallocate(a, 8 * kMiB);  // older
  cpu()->deallocate(b, 5 * kMiB);
  // 6 MiB more within a 13 MiB high-water mark: releasing the older 8 MiB block is enough.
  void* c = cpu()->allocate(6 * kMiB, kCPU);
  AllocatorStats s = cpu()->stats();
  CHECK(s.release_count == s0.release_count + 1);
  CHECK(s.bytes_released == s0.bytes_released + 8 * kMiB);
  b = cpu()->allocate(5 * kMiB, kCPU);  // still cached
  s = cpu()->stats();
  CHECK(s.alloc_count == s0.alloc_count + 3);
  CHECK(s.bytes_cached() == 0);
  cpu()->deallocate(b, 5 * kMiB);
  cpu()->deallocate(c, 6 * kMiB);
}

TEST_CASE("max_cached_bytes: the cache never holds more after frees") {
  FreshCache fresh;
  CpuCacheLimits l;
  l.max_cached_bytes = 16 * kMiB;
  set_cpu_cache_limits(l);
  CHECK(cpu_cache_limits().max_cached_bytes == 16 * kMiB);
  const AllocatorStats s0 = cpu()->stats();
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(cpu()->allocate(3 * kMiB, kCPU));
  for (void* p : blocks) {
    cpu()->deallocate(p, 3 * kMiB);
    CHECK(cpu()->stats().bytes_cached() <= 16 * kMiB);
  }
  AllocatorStats s = cpu()->stats();
  CHECK(s.bytes_cached() == 15 * kMiB);  // 5 blocks fit
  CHECK(s.release_count == s0.release_count + 3);
  CHECK(s.bytes_reserved == s.bytes_in_use + s.bytes_cached());
  // Lowering the limit applies at once.
  l.max_cached_bytes = 0;
  set_cpu_cache_limits(l);
  s = cpu()->stats();
  CHECK(s.bytes_cached() == 0);
  CHECK(s.release_count == s0.release_count + 8);
  CHECK(s.bytes_released == s0.bytes_released + 24 * kMiB);

  l.slack_fraction = -1;
  CHECK_THROWS_AS(set_cpu_cache_limits(l), ValueError);
}

TEST_CASE("empty_cache returns every cached block, and the pages leave the process") {
  FreshCache fresh;
  const AllocatorStats s0 = cpu()->stats();
  const size_t big = 64 * kMiB;
  void* p = touch(cpu()->allocate(big, kCPU), big);
  std::vector<std::pair<void*, size_t>> small;
  for (size_t n : {size_t(100), size_t(5000), size_t(200000), size_t(900000)})
    for (int i = 0; i < 6; ++i) small.push_back({touch(cpu()->allocate(n, kCPU), n), n});
  cpu()->deallocate(p, big);
  for (auto [q, n] : small) cpu()->deallocate(q, n);
  const AllocatorStats full = cpu()->stats();
  CHECK(full.bytes_in_use == s0.bytes_in_use);
  CHECK(full.bytes_cached() >= big);
  CHECK(full.bytes_reserved == full.bytes_in_use + full.bytes_cached());
  const size_t rss_full = rss_bytes();

  cpu()->empty_cache();
  const AllocatorStats s = cpu()->stats();
  CHECK(s.bytes_cached() == 0);
  CHECK(s.bytes_reserved == s.bytes_in_use);
  CHECK(s.bytes_released == full.bytes_released + full.bytes_cached());
  CHECK(s.release_count == full.release_count + 1 + small.size());
  CHECK(s.reserved_limit == s.bytes_in_use + CpuCacheLimits{}.slack_min_bytes);
  // The large block was mapped on its own: unmapping it shrinks the resident set.
  CHECK(rss_bytes() + 48 * kMiB <= rss_full);
}
