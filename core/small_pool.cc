#include "core/small_pool.h"

#include <atomic>
#include <memory>

namespace accel {

// Note [small object pool]
// Every op makes and frees a TensorImpl and a Storage, and with grad an AutogradMeta, its node
// and (for a leaf input) an AccumulateGrad: five malloc/free pairs, a fifth of a 16-element add
// (docs/performance.md, "Op overhead"). They come from here instead: a free list per 16-byte size
// class and thread, so allocating is a TLS load and a pop, freeing a push. A block is pushed on
// the list of the thread that frees it, whoever allocated it: every block comes from
// ::operator new and is handed back with ::operator delete, so blocks may move between threads
// freely (a DataLoader worker's batch freed by the training thread, a DDP hook's tensors) and no
// list is ever shared, hence no lock and no atomic on the fast path. Each list keeps at most
// kMaxPerClass blocks (the rest go back at once), so a thread caches at most ~540 KiB however
// many objects it frees, and nothing when idle after small_pool_trim(). A thread's lists are given
// back when it exits; a free after that (another thread_local's destructor) goes straight to
// ::operator delete.
namespace {

constexpr size_t kGranule = 16;
constexpr int kClasses = int(kSmallPoolMax / kGranule);  // 16 .. 512 bytes
constexpr int kMaxPerClass = 64;

struct FreeBlock {
  FreeBlock* next;
};

struct ThreadLists {
  FreeBlock* head[kClasses] = {};
  int32_t count[kClasses] = {};
  int64_t hits = 0, misses = 0;
  void trim();
  ~ThreadLists();
};

std::atomic<int64_t> g_system_blocks{0};

// Note [TLS in a shared library] (core/storage.cc): the fast path reads initial-exec TLS only.
thread_local ThreadLists* t_lists __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local bool t_dead __attribute__((tls_model("initial-exec"))) = false;

void ThreadLists::trim() {
  for (int c = 0; c < kClasses; ++c) {
    int64_t n = 0;
    for (FreeBlock* b = head[c]; b != nullptr;) {
      FreeBlock* next = b->next;
      ::operator delete(static_cast<void*>(b), size_t(c + 1) * kGranule);
      b = next;
      ++n;
    }
    head[c] = nullptr;
    count[c] = 0;
    g_system_blocks.fetch_sub(n, std::memory_order_relaxed);
  }
}

ThreadLists::~ThreadLists() {
  t_lists = nullptr;
  t_dead = true;
  trim();
}

ThreadLists* make_lists() {
  if (t_dead) return nullptr;
  static thread_local std::unique_ptr<ThreadLists> owner;
  owner = std::make_unique<ThreadLists>();
  t_lists = owner.get();
  return t_lists;
}

inline int class_of(size_t n) { return int((n + kGranule - 1) / kGranule) - 1; }

}  // namespace

void* small_pool_alloc(size_t n) {
  if (n == 0 || n > kSmallPoolMax) [[unlikely]]
    return ::operator new(n);
  const int c = class_of(n);
  ThreadLists* l = t_lists;
  if (l != nullptr) [[likely]] {
    if (FreeBlock* b = l->head[c]) {
      l->head[c] = b->next;
      --l->count[c];
      ++l->hits;
      return b;
    }
  } else {
    l = make_lists();
  }
  void* p = ::operator new(size_t(c + 1) * kGranule);
  g_system_blocks.fetch_add(1, std::memory_order_relaxed);
  if (l != nullptr) ++l->misses;
  return p;
}

void small_pool_free(void* p, size_t n) noexcept {
  if (p == nullptr) return;
  if (n == 0 || n > kSmallPoolMax) [[unlikely]] {
    ::operator delete(p);
    return;
  }
  const int c = class_of(n);
  ThreadLists* l = t_lists;
  if (l == nullptr) [[unlikely]]
    l = make_lists();
  if (l != nullptr && l->count[c] < kMaxPerClass) [[likely]] {
    auto* b = static_cast<FreeBlock*>(p);
    b->next = l->head[c];
    l->head[c] = b;
    ++l->count[c];
    return;
  }
  ::operator delete(p, size_t(c + 1) * kGranule);
  g_system_blocks.fetch_sub(1, std::memory_order_relaxed);
}

SmallPoolStats small_pool_stats() {
  SmallPoolStats s;
  s.system_blocks = g_system_blocks.load(std::memory_order_relaxed);
  if (const ThreadLists* l = t_lists) {
    for (int c = 0; c < kClasses; ++c) s.thread_cached += l->count[c];
    s.thread_hits = l->hits;
    s.thread_misses = l->misses;
  }
  return s;
}

void small_pool_trim() {
  if (ThreadLists* l = t_lists) l->trim();
}

}  // namespace accel
