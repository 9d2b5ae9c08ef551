#include "dist/shm_allreduce.h"

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "dist/control_plane.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ACCEL_CPU_RELAX() _mm_pause()
#else
#define ACCEL_CPU_RELAX() ((void)0)
#endif

// Note [shm all-reduce]
// The segment holds a header (magic, nonce, one arrival counter per rank on its own cache line)
// and one slot of slot_bytes per rank. A tensor is reduced in chunks of slot_bytes:
//   1. every rank copies its chunk into its own slot;               barrier A
//   2. rank r reduces elements [m r / N, m (r + 1) / N) of the chunk over all slots, writes the
//      result into slot 0 at the same place and into its own tensor; barrier B
//   3. every rank copies the rest of the reduced chunk from slot 0;  barrier C
// Ranks read and write disjoint ranges between barriers, so there are no data races; barrier C
// keeps a fast rank from overwriting slot 0 with the next chunk while others still copy. Per
// rank that is about 4 bytes of memory traffic per byte reduced, against 4 kernel copies per byte
// plus a wakeup per segment for loopback TCP. A barrier is a generation counter per rank
// (release store, acquire loads): spin briefly, then yield, then sleep in short steps, checking
// the deadline and whether the peers are still alive, so a dead or stopped rank becomes a
// PeerError naming it instead of a hang. The segment is unlinked as soon as every rank has
// mapped it: nothing is left in /dev/shm, even after a crash.

namespace accel::dist {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x41434353484d3031ull;  // "ACCSHM01"
constexpr size_t kLine = 64;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

struct ShmAllReduce::Header {
  uint64_t magic;
  uint64_t nonce;
  int64_t size;
  int64_t slot_bytes;
};

namespace {
std::atomic<uint64_t>* counter(void* map, int r) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map) + kLine * size_t(1 + r));
}
}  // namespace

std::unique_ptr<ShmAllReduce> ShmAllReduce::create(const std::shared_ptr<Store>& store, int rank,
                                                   int size, size_t slot_bytes,
                                                   Milliseconds timeout) {
  if (size < 2 || slot_bytes == 0) return nullptr;
  slot_bytes = align_up(slot_bytes, kLine);
  const size_t header_bytes = kLine * size_t(1 + size);
  const size_t map_bytes = align_up(header_bytes, 4096) + slot_bytes * size_t(size);
  std::unique_ptr<ShmAllReduce> self(new ShmAllReduce());
  self->rank_ = rank;
  self->size_ = size;
  self->slot_bytes_ = slot_bytes;
  self->map_bytes_ = map_bytes;
  bool ok = false;
  std::string name;
  uint64_t nonce = 0;
  if (rank == 0) {
    std::random_device rd;
    nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
    std::ostringstream os;
    os << "/accel-" << getpid() << "-" << std::hex << nonce;
    name = os.str();
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    // posix_fallocate reserves the pages now: a full /dev/shm is an error here, not a SIGBUS
    // in the middle of a collective.
    if (fd >= 0 && ftruncate(fd, off_t(map_bytes)) == 0 &&
        posix_fallocate(fd, 0, off_t(map_bytes)) == 0) {
      void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        self->map_ = m;
        auto* h = static_cast<Header*>(m);
        h->magic = kMagic;
        h->nonce = nonce;
        h->size = size;
        h->slot_bytes = int64_t(slot_bytes);
        for (int q = 0; q < size; ++q) counter(m, q)->store(0, std::memory_order_relaxed);
        ok = true;
      }
    }
    if (fd >= 0) close(fd);
    if (!ok && fd >= 0) shm_unlink(name.c_str());
    std::ostringstream v;
    v << (ok ? name : std::string()) << "\n" << nonce;
    store->set("shm/name", v.str());
  } else {
    std::string v = store->get("shm/name");
    auto nl = v.find('\n');
    name = v.substr(0, nl);
    nonce = nl == std::string::npos ? 0 : std::stoull(v.substr(nl + 1));
    if (!name.empty()) {
      int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd >= 0) {
        struct stat st {};
        if (fstat(fd, &st) == 0 && size_t(st.st_size) == map_bytes) {
          void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (m != MAP_FAILED) {
            auto* h = static_cast<Header*>(m);
            // Same host and same segment: another container's /dev/shm would not have it.
            if (h->magic == kMagic && h->nonce == nonce && h->size == size &&
                h->slot_bytes == int64_t(slot_bytes)) {
              self->map_ = m;
              ok = true;
            } else {
              munmap(m, map_bytes);
            }
          }
        }
        close(fd);
      }
    }
  }
  // Everyone reports; shm is used only if all ranks mapped it.
  store->set("shm/ok/" + std::to_string(rank), std::string(ok ? "1" : "0") + " " +
                                                   std::to_string(getpid()));
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back("shm/ok/" + std::to_string(q));
  store->wait(keys, timeout);
  bool all_ok = true;
  std::vector<int> pids;
  for (auto& k : keys) {
    std::string v = store->get(k);
    all_ok = all_ok && v.rfind("1 ", 0) == 0;
    pids.push_back(std::atoi(v.c_str() + std::min<size_t>(2, v.size())));
  }
  if (rank == 0 && !name.empty()) shm_unlink(name.c_str());  // every rank has mapped or failed
  if (!all_ok) return nullptr;  // the destructor unmaps
  // Peer pids let a waiting rank notice a dead peer at once; only trusted if they are visible
  // from here (same pid namespace).
  bool pids_visible = true;
  for (int q = 0; q < size; ++q)
    if (q != rank && (pids[size_t(q)] <= 0 || kill(pids[size_t(q)], 0) != 0)) pids_visible = false;
  if (pids_visible) self->pids_ = pids;
  self->header_ = static_cast<Header*>(self->map_);
  self->slots_ = static_cast<char*>(self->map_) + align_up(header_bytes, 4096);
  return self;
}

ShmAllReduce::~ShmAllReduce() {
  if (map_) munmap(map_, map_bytes_);
}

void ShmAllReduce::abort(const std::string& reason) {
  std::lock_guard<std::mutex> g(abort_mu_);
  if (aborted_.load(std::memory_order_relaxed)) return;
  abort_reason_ = reason;
  aborted_.store(true, std::memory_order_release);
}

void ShmAllReduce::barrier(Milliseconds timeout, const char* phase) {
  ++generation_;
  counter(map_, rank_)->store(generation_, std::memory_order_release);
  const auto deadline = Clock::now() + timeout;
  auto next_check = Clock::now() + std::chrono::milliseconds(1);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    auto* c = counter(map_, q);
    int spins = 0;
    while (c->load(std::memory_order_acquire) < generation_) {
      if (spins < 4000) {
        ++spins;
        ACCEL_CPU_RELAX();
        continue;
      }
      if (spins < 4200) {
        ++spins;
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      auto now = Clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(1);
      if (aborted_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> g(abort_mu_);
        throw PeerError(abort_reason_ + " (shared-memory all-reduce, " + phase + ")");
      }
      if (!pids_.empty() && kill(pids_[size_t(q)], 0) != 0 && errno == ESRCH)
        throw PeerError("rank " + std::to_string(q) + " died (shared-memory all-reduce, " + phase +
                        ")");
      if (now > deadline) {
        std::vector<int> late;
        for (int p = 0; p < size_; ++p)
          if (p != rank_ && counter(map_, p)->load(std::memory_order_acquire) < generation_)
            late.push_back(p);
        std::ostringstream os;
        os << (late.size() == 1 ? "rank " : "ranks ");
        for (size_t i = 0; i < late.size(); ++i) os << (i ? ", " : "") << late[i];
        os << " did not reach the shared-memory all-reduce (" << phase << ") within "
           << timeout.count() << " ms (stopped, hung, or far behind)";
        throw PeerError(os.str());
      }
    }
  }
}

void ShmAllReduce::all_reduce(void* data, size_t n, size_t es, ReduceFn fn, Milliseconds timeout) {
  char* d = static_cast<char*>(data);
  const size_t per_chunk = slot_bytes_ / es;
  const size_t N = size_t(size_), r = size_t(rank_);
  auto slot = [&](size_t q) { return slots_ + q * slot_bytes_; };
  for (size_t off = 0; off < n; off += per_chunk) {
    const size_t m = std::min(per_chunk, n - off);
    char* mine = d + off * es;
    std::memcpy(slot(r), mine, m * es);
    barrier(timeout, "gather");
    const size_t lo = m * r / N, hi = m * (r + 1) / N;
    if (hi > lo) {
      char* dst = slot(0) + lo * es;
      fn(dst, slot(0) + lo * es, slot(1) + lo * es, hi - lo);
      for (size_t q = 2; q < N; ++q) fn(dst, dst, slot(q) + lo * es, hi - lo);
      std::memcpy(mine + lo * es, dst, (hi - lo) * es);
    }
    barrier(timeout, "reduce");
    if (lo > 0) std::memcpy(mine, slot(0), lo * es);
    if (m > hi) std::memcpy(mine + hi * es, slot(0) + hi * es, (m - hi) * es);
    barrier(timeout, "copy");
  }
}

}  // namespace accel::dist
