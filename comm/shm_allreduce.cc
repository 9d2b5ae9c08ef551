#include "comm/shm_allreduce.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/env_contract.h"
#include "comm/control_plane.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ACCEL_CPU_RELAX() _mm_pause()
#else
#define ACCEL_CPU_RELAX() ((void)0)
#endif

// Note [shm all-reduce]
// The segment holds a header (magic, nonce, one arrival counter per rank on its own cache line,
// an abort block) and one slot of slot_bytes per rank. A tensor is reduced in chunks of
// slot_bytes:
//   1. every rank copies its chunk into its own slot;               barrier A
//   2. rank r reduces elements [m r / N, m (r + 1) / N) of the chunk over all slots, writes the
//      result into slot 0 at the same place and into its own tensor; barrier B
//   3. every rank copies the rest of the reduced chunk from slot 0;  barrier C
// Ranks read and write disjoint ranges between barriers, so there are no data races; barrier C
// keeps a fast rank from overwriting slot 0 with the next chunk while others still copy. Per
// rank that is about 4 bytes of memory traffic per byte reduced, against 4 kernel copies per byte
// plus a wakeup per segment for loopback TCP. A barrier is a generation counter per rank
// (release store, acquire loads): spin briefly, then yield, then sleep in short steps; about
// every millisecond of sleeping, check_peers() looks at the deadline, at aborts and at whether
// the ranks not yet arrived are still alive (Note [shm faults]), so a dead or stopped rank
// becomes a PeerError naming it instead of a hang. The fast path (peers arrive while we spin)
// makes no syscall and reads no shared state beyond the counters.

// Note [shm faults]
// * Dead peers. kill(pid, 0) succeeds on a zombie, and a rank killed under a parent that does
//   not reap it (a launcher busy elsewhere, a shell, a test) stays a zombie, so create() opens a
//   pidfd per peer (pidfd_open, Linux 5.3): it polls readable once the process has exited,
//   zombie or not, and it cannot be fooled by pid reuse. Where pidfds are unavailable (old
//   kernel, seccomp; env ACCEL_SHM_NO_PIDFD=1 forces this for tests) the state letter in
//   /proc/<pid>/stat (Z or X) or ESRCH says the same. Pids are used only when every rank reported
//   the same pid namespace; in another one a pid names an unrelated process. Only ranks that
//   have not reached the barrier are suspects: a peer that arrived and then exited normally (its
//   last collective is done) is no error, and a death is re-checked against its counter, which
//   the process cannot change after it is gone.
// * Aborts. abort(reason), and every PeerError this rank raises itself, is published in the
//   segment's abort block (claim with a CAS, write the reason, release-store the rank), so peers
//   stop within a millisecond with a message naming the aborting rank instead of each waiting
//   for its own evidence. The block is sticky: the group is unusable afterwards anyway.
// * Leaks. Rank 0 unlinks the segment when create() returns or throws (every rank has mapped
//   it or given up by then), so a running group leaves nothing in /dev/shm. A rank 0 killed
//   inside create() can leave one; its name /accel-<pidns>-<pid>-<nonce> lets the next create()
//   on this host sweep it: same pid namespace and the pid is gone (ESRCH or a zombie). Names of
//   other pid namespaces (containers sharing /dev/shm) are never swept: their pids mean
//   nothing here and a live group's segment would vanish under it.
// * Host identity. Mapping the same name only proves a shared /dev/shm: two containers, or the
//   two network namespaces the multi-host tests use as hosts, can share it. Rank 0 compares the
//   ranks' host keys (boot id, network namespace, hostname) first and creates no segment unless
//   all are equal, so such ranks use TCP like real separate hosts (and all ranks agree).

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture (Linux 5.3)
#endif

namespace accel::dist {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x41434353484d3033ull;  // "ACCSHM03"
constexpr size_t kLine = 64;
constexpr size_t kAbortReasonBytes = 4 * kLine - sizeof(int64_t);
constexpr const char* kSegmentPrefix = "accel-";
constexpr auto kCheckEvery = std::chrono::milliseconds(1);
// Note [shm spinning]
// A barrier spins (pause) before it yields and then sleeps: on a host with a core per rank the
// peer arrives within microseconds and a spin is the cheapest wait. With more ranks than CPUs
// (4 ranks on 2 cores, a laptop, an oversubscribed node) the peer that has not arrived is often
// not running, and every pause spends the time slice it needs; ZeRO-3 meets several barriers per
// unit and step. There a rank spins briefly and then yields at once. (4000 pauses are about
// 0.2 ms on CPUs whose pause takes ~140 cycles.)
constexpr int kSpins = 4000;
constexpr int kOversubscribedSpins = 64;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string ns_inode(const char* path) {
  struct stat st {};
  if (stat(path, &st) != 0) return "0";
  std::ostringstream os;
  os << std::hex << uint64_t(st.st_ino);
  return os.str();
}

// Whether `pid` (of our pid namespace) has exited: reaped (ESRCH) or a zombie.
bool process_gone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = read_first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  const auto paren = stat.rfind(')');  // the command name may contain spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state == 'Z' || state == 'X' || state == 'x';
}

int pidfd_open(int pid) { return int(syscall(SYS_pidfd_open, pid, 0)); }

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}
}  // namespace

struct ShmAllReduce::Header {
  uint64_t magic;
  uint64_t nonce;
  int64_t size;
  int64_t slot_bytes;
};

// 0: no abort; -1: being written; r + 1: rank r aborted with `reason` (NUL-terminated).
struct ShmAllReduce::AbortBlock {
  std::atomic<int64_t> state;
  char reason[kAbortReasonBytes];
};
static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t));

// Note [shm stamps]
// Each rank owns a block of two cache lines after the header: word 0 is its arrival counter, and
// two stamp areas (one per parity of the arrival's generation: words 1-5 share the counter's
// line, words 8-12 the next) hold (generation, 32-byte stamp). A rank writes the stamp with
// relaxed stores, then release-stores its counter; a peer that acquire-loads the counter at that
// generation therefore sees the stamp: the collective fingerprint rides on the arrival that the
// all-reduce makes anyway, with no extra round trip. Two areas because a rank that has passed
// barrier g may already publish g + 1 while a slower peer still reads g; it cannot publish g + 2
// before that peer arrives at g + 1, by which time the peer has read. The generation word tells
// a reader that the stamp is the one of its own arrival: anything else means the ranks'
// collective sequences diverged (possible only when fingerprints are not checked every time).
constexpr size_t kRankBlock = 2 * kLine;
constexpr size_t kStampWords = ShmAllReduce::kStampBytes / sizeof(uint64_t);
static_assert(ShmAllReduce::kStampBytes % sizeof(uint64_t) == 0 && kStampWords + 1 <= 7);

namespace {
std::atomic<uint64_t>* rank_words(void* map, int r) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map) + kLine +
                                                  kRankBlock * size_t(r));
}
std::atomic<uint64_t>* counter(void* map, int r) { return rank_words(map, r); }
// Word 0: the generation; words 1..kStampWords: the stamp.
std::atomic<uint64_t>* stamp_area(void* map, int r, uint64_t generation) {
  return rank_words(map, r) + (generation % 2 ? 8 : 1);
}
size_t abort_offset(int size) { return kLine + kRankBlock * size_t(size); }
}  // namespace

std::string ShmAllReduce::host_key() {
  if (const char* k = std::getenv(env::kShmHostKey); k && *k) return k;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  return read_first_line("/proc/sys/kernel/random/boot_id") + "/" + ns_inode("/proc/self/ns/net") +
         "/" + host;
}

std::string ShmAllReduce::pid_namespace_id() { return ns_inode("/proc/self/ns/pid"); }

int ShmAllReduce::sweep_stale_segments(const std::string& dir) {
  const std::string mine = std::string(kSegmentPrefix) + pid_namespace_id() + "-";
  int removed = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(mine, 0) != 0) continue;             // not ours, or another pid namespace's
    const std::string rest = name.substr(mine.size());  // <pid>-<nonce>
    const auto dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos ||
        !std::all_of(rest.begin(), rest.begin() + long(dash),
                     [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0 || pid == long(getpid()) || !process_gone(int(pid))) continue;
    std::error_code rm;
    if (std::filesystem::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

namespace {

// Everyone reports "<mapped> <pid> <pid namespace>"; shm is used only if all ranks mapped it.
// `pids`: every rank's pid; `one_pid_ns`: all share this process's pid namespace.
bool all_ranks_mapped(Store& store, int rank, int size, bool ok, const std::string& my_ns,
                      Milliseconds timeout, std::vector<int>* pids, bool* one_pid_ns) {
  store.set("shm/ok/" + std::to_string(rank),
            std::string(ok ? "1" : "0") + " " + std::to_string(getpid()) + " " + my_ns);
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back("shm/ok/" + std::to_string(q));
  store.wait(keys, timeout);
  bool all_ok = true;
  *one_pid_ns = true;
  for (auto& k : keys) {
    std::istringstream in(store.get(k));
    int mapped = 0, pid = 0;
    std::string ns;
    in >> mapped >> pid >> ns;
    all_ok = all_ok && mapped == 1;
    *one_pid_ns = *one_pid_ns && pid > 0 && ns == my_ns;
    pids->push_back(pid);
  }
  return all_ok;
}

}  // namespace

std::unique_ptr<ShmAllReduce> ShmAllReduce::create(const std::shared_ptr<Store>& store, int rank,
                                                   int size, size_t slot_bytes,
                                                   Milliseconds timeout) {
  if (size < 2 || slot_bytes == 0) return nullptr;
  // A reduce-scatter window holds at least one 8-byte element per rank.
  slot_bytes = align_up(std::max(slot_bytes, size_t(8) * size_t(size)), kLine);
  const size_t header_bytes = abort_offset(size) + sizeof(AbortBlock);
  const size_t map_bytes = align_up(header_bytes, 4096) + slot_bytes * size_t(size);
  std::unique_ptr<ShmAllReduce> self(new ShmAllReduce());
  self->rank_ = rank;
  self->size_ = size;
  self->slot_bytes_ = slot_bytes;
  self->map_bytes_ = map_bytes;
  const std::string my_ns = pid_namespace_id();
  store->set("shm/host/" + std::to_string(rank), host_key());
  // Rank 0's segment name is unlinked on every way out of this function (Note [shm faults]).
  struct Unlinker {
    std::string name;
    ~Unlinker() {
      if (!name.empty()) shm_unlink(name.c_str());
    }
  } unlinker;
  bool ok = false;
  std::string name;
  uint64_t nonce = 0;
  if (rank == 0) {
    sweep_stale_segments();
    std::vector<std::string> host_keys;
    for (int q = 0; q < size; ++q) host_keys.push_back("shm/host/" + std::to_string(q));
    store->wait(host_keys, timeout);
    bool one_host = true;
    const std::string mine = store->get(host_keys[0]);
    for (int q = 1; q < size; ++q) one_host = one_host && store->get(host_keys[size_t(q)]) == mine;
    std::random_device rd;
    nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
    std::ostringstream os;
    os << "/" << kSegmentPrefix << my_ns << "-" << getpid() << "-" << std::hex << nonce;
    name = os.str();
    int fd = one_host ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600) : -1;
    if (fd >= 0) unlinker.name = name;
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
        for (int q = 0; q < size; ++q)
          for (size_t w = 0; w < kRankBlock / sizeof(uint64_t); ++w)
            rank_words(m, q)[w].store(0, std::memory_order_relaxed);
        auto* ab = reinterpret_cast<AbortBlock*>(static_cast<char*>(m) + abort_offset(size));
        ab->state.store(0, std::memory_order_relaxed);
        ab->reason[0] = 0;
        ok = true;
      }
    }
    if (fd >= 0) close(fd);
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
            // The same segment: another container's /dev/shm would not have it.
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
  std::vector<int> pids;
  bool one_pid_ns = true;
  if (!all_ranks_mapped(*store, rank, size, ok, my_ns, timeout, &pids, &one_pid_ns))
    return nullptr;  // the destructor unmaps, the Unlinker unlinks
  self->header_ = static_cast<Header*>(self->map_);
  self->abort_block_ =
      reinterpret_cast<AbortBlock*>(static_cast<char*>(self->map_) + abort_offset(size));
  self->slots_ = static_cast<char*>(self->map_) + align_up(header_bytes, 4096);
  // Note [shm spinning]: with more ranks than CPUs a waiting rank spins on a core its peer needs.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const bool oversubscribed =
      sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < size;
  self->spin_limit_ = oversubscribed ? kOversubscribedSpins : kSpins;
  self->pidfds_.assign(size_t(size), -1);
  if (one_pid_ns) {
    self->pids_ = pids;
    const bool use_pidfd = !env_flag(env::kShmNoPidfd);
    for (int q = 0; q < size && use_pidfd; ++q)
      if (q != rank) self->pidfds_[size_t(q)] = pidfd_open(pids[size_t(q)]);  // -1: /proc fallback
  }
  return self;
}

ShmAllReduce::~ShmAllReduce() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (map_) munmap(map_, map_bytes_);
}

void ShmAllReduce::publish_abort(const std::string& reason) {
  if (!abort_block_) return;
  int64_t expected = 0;
  if (!abort_block_->state.compare_exchange_strong(expected, -1, std::memory_order_acq_rel))
    return;  // someone aborted first; theirs is the message peers see
  const size_t n = std::min(reason.size(), kAbortReasonBytes - 1);
  std::memcpy(abort_block_->reason, reason.data(), n);
  abort_block_->reason[n] = 0;
  abort_block_->state.store(rank_ + 1, std::memory_order_release);
}

void ShmAllReduce::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  publish_abort(reason);
}

void ShmAllReduce::fail(const std::string& msg) {
  publish_abort(msg);
  throw PeerError(msg);
}

void ShmAllReduce::label_ranks(const std::vector<int>& world_ranks, const std::string& group) {
  labels_.clear();
  if (int(world_ranks.size()) != size_) return;
  for (int q = 0; q < size_; ++q)
    labels_.push_back("world rank " + std::to_string(world_ranks[size_t(q)]) + " (rank " +
                      std::to_string(q) + " of group " + group + ")");
}

std::string ShmAllReduce::who(int q) const {
  return q >= 0 && size_t(q) < labels_.size() ? labels_[size_t(q)] : "rank " + std::to_string(q);
}

int ShmAllReduce::dead_peer() const {
  // Suspects are the peers that have not arrived; see Note [shm faults].
  auto pending = [&](int q) {
    return counter(map_, q)->load(std::memory_order_acquire) < generation_;
  };
  pollfd fds[64];
  int ranks[64];
  nfds_t n = 0;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || !pending(q)) continue;
    if (pidfds_[size_t(q)] >= 0 && n < 64) {
      fds[n] = {pidfds_[size_t(q)], POLLIN, 0};
      ranks[n++] = q;
    } else if (!pids_.empty() && process_gone(pids_[size_t(q)]) && pending(q)) {
      return q;
    }
  }
  if (n > 0 && poll(fds, n, 0) > 0)
    for (nfds_t i = 0; i < n; ++i)
      if (fds[i].revents != 0 && pending(ranks[i])) return ranks[i];
  return -1;
}

void ShmAllReduce::check_peers(const char* phase) {
  if (aborted_.load(std::memory_order_acquire)) {
    std::string reason;
    {
      std::lock_guard<std::mutex> g(abort_mu_);
      reason = abort_reason_;
    }
    throw PeerError(reason + " (shared-memory all-reduce, " + phase + ")");
  }
  const int64_t by = abort_block_->state.load(std::memory_order_acquire);
  if (by > 0) {
    const std::string reason(abort_block_->reason,
                             strnlen(abort_block_->reason, kAbortReasonBytes));
    throw PeerError(who(int(by - 1)) + " aborted the shared-memory all-reduce (" + reason +
                    "); seen in " + phase);
  }
  if (phase == std::string("entry")) return;
  const int dead = dead_peer();
  if (dead >= 0)
    fail(who(dead) + " died (its process exited; shared-memory all-reduce, " + phase + ")");
}

void ShmAllReduce::barrier(Milliseconds timeout, const char* phase, const void* stamp) {
  ++generation_;
  if (stamp) {
    std::atomic<uint64_t>* area = stamp_area(map_, rank_, generation_);
    uint64_t words[kStampWords];
    std::memcpy(words, stamp, kStampBytes);
    area[0].store(generation_, std::memory_order_relaxed);
    for (size_t w = 0; w < kStampWords; ++w) area[1 + w].store(words[w], std::memory_order_relaxed);
  }
  counter(map_, rank_)->store(generation_, std::memory_order_release);
  const auto deadline = Clock::now() + timeout;
  auto next_check = Clock::now() + kCheckEvery;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    auto* c = counter(map_, q);
    int spins = 0;
    while (c->load(std::memory_order_acquire) < generation_) {
      if (spins < spin_limit_) {
        ++spins;
        ACCEL_CPU_RELAX();
        continue;
      }
      if (spins < spin_limit_ + 200) {
        ++spins;
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      auto now = Clock::now();
      if (now < next_check) continue;
      next_check = now + kCheckEvery;
      check_peers(phase);
      if (now > deadline) {
        std::vector<int> late;
        for (int p = 0; p < size_; ++p)
          if (p != rank_ && counter(map_, p)->load(std::memory_order_acquire) < generation_)
            late.push_back(p);
        std::ostringstream os;
        if (labels_.empty()) {
          os << (late.size() == 1 ? "rank " : "ranks ");
          for (size_t i = 0; i < late.size(); ++i) os << (i ? ", " : "") << late[i];
        } else {
          for (size_t i = 0; i < late.size(); ++i) os << (i ? ", " : "") << who(late[i]);
        }
        os << " did not reach the shared-memory all-reduce (" << phase << ") within "
           << timeout.count() << " ms (stopped, hung, or far behind)";
        fail(os.str());
      }
    }
  }
}

void ShmAllReduce::read_stamps(void* out, const void* mine) {
  // After barrier(): every counter was acquire-loaded at >= generation_ (Note [shm stamps]).
  char* o = static_cast<char*>(out);
  for (int q = 0; q < size_; ++q) {
    char* dst = o + size_t(q) * kStampBytes;
    if (q == rank_) {
      std::memcpy(dst, mine, kStampBytes);
      continue;
    }
    std::atomic<uint64_t>* area = stamp_area(map_, q, generation_);
    const uint64_t gen = area[0].load(std::memory_order_relaxed);
    if (gen != generation_) {
      std::ostringstream os;
      os << who(q) << " is not in this rank's collective (its last shared-memory arrival "
         << "is " << gen << ", this rank's " << generation_ << "; rank " << rank_ << " of " << size_
         << "): the ranks' collective sequences diverged where fingerprints "
         << "were not checked";
      fail(os.str());
    }
    uint64_t words[kStampWords];
    for (size_t w = 0; w < kStampWords; ++w) words[w] = area[1 + w].load(std::memory_order_relaxed);
    std::memcpy(dst, words, kStampBytes);
  }
}

void ShmAllReduce::check_entry() {
  // One relaxed load each on the fast path.
  if (aborted_.load(std::memory_order_relaxed) ||
      abort_block_->state.load(std::memory_order_relaxed) > 0)
    check_peers("entry");
}

void ShmAllReduce::arrive(Milliseconds timeout, const char* phase, const void* stamp,
                          const StampCheck* check) {
  if (!stamp) {
    barrier(timeout, phase);
    return;
  }
  barrier(timeout, phase, stamp);
  if (!check) return;
  // Nothing has been read from a peer yet: on a mismatch only our own slot was written.
  uint64_t stamps[kStampWords * 64];
  std::vector<uint64_t> big;
  uint64_t* all = stamps;
  if (size_ > 64) {
    big.resize(kStampWords * size_t(size_));
    all = big.data();
  }
  read_stamps(all, stamp);
  (*check)(all);
}

void ShmAllReduce::exchange(const void* stamp, void* out, Milliseconds timeout) {
  check_entry();
  barrier(timeout, "fingerprint", stamp);
  read_stamps(out, stamp);
}

void ShmAllReduce::all_reduce(void* data, size_t n, size_t es, ReduceFn fn, Milliseconds timeout,
                              const void* stamp, const StampCheck* check) {
  check_entry();
  char* d = static_cast<char*>(data);
  const size_t per_chunk = slot_bytes_ / es;
  const size_t N = size_t(size_), r = size_t(rank_);
  auto slot = [&](size_t q) { return slots_ + q * slot_bytes_; };
  for (size_t off = 0; off < n; off += per_chunk) {
    const size_t m = std::min(per_chunk, n - off);
    char* mine = d + off * es;
    std::memcpy(slot(r), mine, m * es);
    arrive(timeout, "gather", off == 0 ? stamp : nullptr, check);
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

// Note [shm all-gather and reduce-scatter]
// ZeRO-3 moves every unit's parameters twice per step as an all-gather and its gradients once as
// a reduce-scatter. Emulating them with the all-reduce above (zero-filled output, own part
// written, summed) moves N times the bytes through every rank's slot and costs three barriers per
// slot-sized chunk of the *full* buffer. Done directly:
// * all-gather, per chunk of up to slot_bytes of each rank's input: every rank copies its chunk
//   into its slot (barrier), copies every peer's slot into its output (barrier: a fast rank must
//   not overwrite its slot with the next chunk while a peer still reads it). Per rank: n bytes
//   written, (N - 1) n read and written; two barriers per slot_bytes of *input*.
// * reduce-scatter, per window of up to slot_bytes / N elements of each rank's N chunks: every
//   rank copies the window of each chunk q into its slot at position q (barrier), then reduces
//   position `rank` over all slots in rank order straight into its output (barrier). Per rank:
//   N k bytes written, N k read, k written.
// The first arrival carries the fingerprint stamp and its check, as the all-reduce's does.
void ShmAllReduce::all_gather(const void* in, void* out, size_t n, size_t es, Milliseconds timeout,
                              const void* stamp, const StampCheck* check) {
  check_entry();
  const char* src = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  const size_t per_chunk = slot_bytes_ / es;
  const size_t N = size_t(size_), r = size_t(rank_);
  auto slot = [&](size_t q) { return slots_ + q * slot_bytes_; };
  for (size_t off = 0; off < n; off += per_chunk) {
    const size_t m = std::min(per_chunk, n - off);
    std::memcpy(slot(r), src + off * es, m * es);
    arrive(timeout, "all-gather", off == 0 ? stamp : nullptr, check);
    for (size_t q = 0; q < N; ++q) {
      char* dst = o + (q * n + off) * es;
      if (q != r)
        std::memcpy(dst, slot(q), m * es);
      else if (dst != src + off * es)
        std::memmove(dst, src + off * es, m * es);  // in place: nothing to do
    }
    barrier(timeout, "all-gather copy");
  }
}

void ShmAllReduce::reduce_scatter(const void* in, void* out, size_t k, size_t es, ReduceFn fn,
                                  Milliseconds timeout, const void* stamp,
                                  const StampCheck* check) {
  check_entry();
  const char* src = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  const size_t N = size_t(size_), r = size_t(rank_);
  const size_t per_window = std::max<size_t>(1, slot_bytes_ / (es * N));
  auto slot = [&](size_t q) { return slots_ + q * slot_bytes_; };
  for (size_t off = 0; off < k; off += per_window) {
    const size_t m = std::min(per_window, k - off);
    char* mine = slot(r);
    for (size_t q = 0; q < N; ++q) std::memcpy(mine + q * m * es, src + (q * k + off) * es, m * es);
    arrive(timeout, "reduce-scatter", off == 0 ? stamp : nullptr, check);
    char* dst = o + off * es;
    const size_t at = r * m * es;
    fn(dst, slot(0) + at, slot(1) + at, m);
    for (size_t q = 2; q < N; ++q) fn(dst, dst, slot(q) + at, m);
    barrier(timeout, "reduce-scatter done");
  }
}

}  // namespace accel::dist
