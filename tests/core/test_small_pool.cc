// The small-object pool behind TensorImpl, Storage, AutogradMeta and autograd nodes (Note [small
// object pool] in core/small_pool.cc): blocks are reused, objects may die on another thread than
// the one that made them, a thread's lists go back to the system when it exits, nothing leaks.
// Counter checks only (SmallPoolStats), no timing. Each case runs its work on fresh threads so the
// main thread's lists do not move under the global count.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "accel.h"

using namespace accel;

namespace {

// Runs fn on a new thread and waits for it (the thread's lists are given back when it exits).
template <typename F>
void on_thread(F&& fn) {
  std::thread t(std::forward<F>(fn));
  t.join();
}

}  // namespace

TEST_CASE("a freed tensor's blocks serve the next tensor on the same thread") {
  const int64_t before = small_pool_stats().system_blocks;
  on_thread([] {
    Tensor a = ones({16});
    Tensor b = ones({16});
    TensorImpl* first = nullptr;
    {
      Tensor c = a + b;
      first = c.impl();
    }
    const SmallPoolStats s0 = small_pool_stats();
    Tensor d = a + b;  // same sizes: its TensorImpl and Storage come from the lists
    const SmallPoolStats s1 = small_pool_stats();
    CHECK(d.impl() == first);
    CHECK(s1.thread_hits >= s0.thread_hits + 2);
    CHECK(s1.thread_misses == s0.thread_misses);
    CHECK(s1.system_blocks == s0.system_blocks);
  });
  CHECK(small_pool_stats().system_blocks == before);
}

TEST_CASE("tensors and graphs made on one thread and freed on another do not leak") {
  const int64_t before = small_pool_stats().system_blocks;
  constexpr int kCount = 2000;  // far past the lists' bound: most frees go back at once
  std::vector<Tensor> made;
  int64_t made_blocks = 0;
  on_thread([&] {
    Tensor w = ones({8}).requires_grad_(true);
    for (int i = 0; i < kCount; ++i) made.push_back(w * 2 + 1);  // two nodes, their metas
    made_blocks = small_pool_stats().system_blocks - before;
  });
  CHECK(made_blocks > 4 * kCount);  // two tensors, two storages, two nodes... per entry
  int64_t cached_on_freeing_thread = 0;
  on_thread([&] {
    std::vector<Tensor> mine = std::move(made);
    mine.clear();
    const SmallPoolStats s = small_pool_stats();
    cached_on_freeing_thread = s.thread_cached;
  });
  CHECK(cached_on_freeing_thread > 0);
  CHECK(cached_on_freeing_thread < 1000);  // the lists' bound, not everything freed
  CHECK(small_pool_stats().system_blocks == before);
}

TEST_CASE("a backward on another thread than the forward frees its graph without a leak") {
  const int64_t before = small_pool_stats().system_blocks;
  Tensor loss;
  Tensor w;
  on_thread([&] {
    w = ones({4}).requires_grad_(true);
    loss = (w * w).sum();
  });
  on_thread([&] { loss.backward(); });
  CHECK(w.grad().tolist() == std::vector<double>{2, 2, 2, 2});
  loss = Tensor();
  w = Tensor();
  on_thread([] {});
  // The main thread freed the tensors above into its own lists; give them back.
  small_pool_trim();
  CHECK(small_pool_stats().system_blocks <= before);
}

TEST_CASE("objects freed after the thread's lists are gone go straight back to the system") {
  const int64_t before = small_pool_stats().system_blocks;
  on_thread([] {
    // Constructed before the thread's first pooled allocation, so destroyed after its lists
    // (thread_local destructors run in reverse order of construction).
    static thread_local std::vector<Tensor> late;
    late.reserve(4);
    Tensor w = ones({4}).requires_grad_(true);
    late.push_back(w * 3);
    late.push_back(w);
  });
  CHECK(small_pool_stats().system_blocks == before);
}

TEST_CASE("empty_cache gives the calling thread's cached blocks back") {
  on_thread([] {
    { Tensor t = ones({3}) + ones({3}); }
    CHECK(small_pool_stats().thread_cached > 0);
    get_allocator(kCPU)->empty_cache();
    CHECK(small_pool_stats().thread_cached == 0);
  });
}
