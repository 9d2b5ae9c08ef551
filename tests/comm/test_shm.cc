// Faults of the shared-memory all-reduce (Note [shm faults] in comm/shm_allreduce.cc): a killed
// peer that nobody reaps, aborts published through the segment, segments left behind, and ranks
// that share /dev/shm without sharing a host. Ranks are forked children of the test (no exec):
// the test decides when to kill whom and does not reap a victim until the end, as a busy
// launcher or a shell would not.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "core/tensor.h"
#include "comm/control_plane.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/reduce_kernels.h"
#include "comm/shm_allreduce.h"
#include "comm/store.h"
#include "tests/common/spawn.h"

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using accel::dist::Milliseconds;
using accel::dist::PeerError;
using accel::dist::ShmAllReduce;
using Clock = std::chrono::steady_clock;

namespace {

// Long on purpose: a test passing within a fraction of it shows detection, not a timeout.
constexpr Milliseconds kCollectiveTimeout = 120s;
constexpr Milliseconds kStoreTimeout = 60s;
constexpr auto kReadLimit = 60s;
constexpr size_t kSlotBytes = 64 << 10;
constexpr size_t kElems = 50000;  // several chunks of kSlotBytes

struct Child {
  pid_t pid = -1;
  int in = -1;   // the test writes commands here
  int out = -1;  // the child writes result lines here
};

void say(int fd, const std::string& line) {
  std::string s = line + "\n";
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += size_t(n);
  }
}

// One line from fd, or "" when nothing complete arrives within `limit`.
std::string read_line(int fd, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  std::string line;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char c = 0;
    if (read(fd, &c, 1) != 1) return "";
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

// Runs body(in, out) in a forked child that _exits with its result; an escaping exception is
// reported as "EXC <what>".
Child fork_child(const std::function<int(int, int)>& body) {
  int to_child[2], from_child[2];
  REQUIRE(pipe2(to_child, O_CLOEXEC) == 0);
  REQUIRE(pipe2(from_child, O_CLOEXEC) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    int rc = 3;
    try {
      rc = body(to_child[0], from_child[1]);
    } catch (const std::exception& e) {
      say(from_child[1], std::string("EXC ") + e.what());
    }
    _exit(rc);
  }
  close(to_child[0]);
  close(from_child[1]);
  return {pid, to_child[1], from_child[0]};
}

void reap(std::vector<Child>& kids) {
  for (Child& c : kids) {
    if (c.pid > 0) {
      kill(c.pid, SIGKILL);
      int st = 0;
      waitpid(c.pid, &st, 0);
    }
    if (c.in >= 0) close(c.in);
    if (c.out >= 0) close(c.out);
    c = Child{};
  }
}

char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto p = line.rfind(')');
  return p == std::string::npos || p + 2 >= line.size() ? '?' : line[p + 2];
}

std::shared_ptr<accel::dist::Store> connect_store(int rank, int port) {
  accel::dist::StoreOptions o;
  o.timeout = kStoreTimeout;
  return std::make_shared<accel::dist::TcpStore>("127.0.0.1", port, rank == 0, o);
}

// Rank 0 hosts the store: it stays until the test reaps it, so peers still talking to the store
// never see it vanish.
int linger_if_server(int rank, int in) {
  if (rank == 0) read_line(in, kReadLimit);
  return 0;
}

const accel::dist::ReduceFn kSum =
    accel::dist::reduce_function(accel::kFloat32, accel::dist::ReduceOp::Sum);

// all_reduce of kElems floats, rank r contributing r + 1; true when the sum is right.
bool reduce_once(ShmAllReduce& shm, int rank, int world) {
  std::vector<float> v(kElems, float(rank + 1));
  shm.all_reduce(v.data(), v.size(), sizeof(float), kSum, kCollectiveTimeout);
  const float want = float(world * (world + 1) / 2);
  for (float x : v)
    if (x != want) return false;
  return true;
}

// "PEERERR <ms> <message>" for a PeerError out of an all_reduce, "OK" when it succeeded.
std::string reduce_result(ShmAllReduce& shm, int rank, int world) {
  const auto t0 = Clock::now();
  try {
    return reduce_once(shm, rank, world) ? "OK" : "WRONG";
  } catch (const PeerError& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    return "PEERERR " + std::to_string(ms.count()) + " " + e.what();
  }
}

std::vector<std::string> shm_entries_of(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  std::string tag = "-";  // built stepwise: GCC 12 warns (-Wrestrict) on "-" + to_string(...)
  tag += std::to_string(pid);
  tag += '-';
  for (auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("accel-", 0) == 0 && n.find(tag) != std::string::npos) out.push_back(n);
  }
  return out;
}

// A rank killed while its peers wait in an all-reduce, left unreaped (a zombie).
void killed_unreaped_peer(bool no_pidfd) {
  constexpr int kWorld = 3, kVictim = 1;
  const int port = accel::test::free_port();
  std::vector<Child> kids;
  for (int r = 0; r < kWorld; ++r) {
    kids.push_back(fork_child([&, r](int in, int out) {
      if (no_pidfd) setenv("ACCEL_SHM_NO_PIDFD", "1", 1);
      auto store = connect_store(r, port);
      auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
      if (!shm) return say(out, "NOSHM"), 2;
      if (!reduce_once(*shm, r, kWorld)) return say(out, "WRONG"), 2;
      say(out, "READY");
      if (r == kVictim) {
        std::this_thread::sleep_for(kCollectiveTimeout);  // killed long before
        return 0;
      }
      say(out, reduce_result(*shm, r, kWorld));
      return linger_if_server(r, in);
    }));
  }
  for (int r = 0; r < kWorld; ++r) REQUIRE(read_line(kids[size_t(r)].out, kReadLimit) == "READY");
  std::this_thread::sleep_for(300ms);  // the survivors are waiting for the victim now
  REQUIRE(kill(kids[kVictim].pid, SIGKILL) == 0);
  const auto killed_at = Clock::now();
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    const std::string line = read_line(kids[size_t(r)].out, kReadLimit);
    const double s = std::chrono::duration<double>(Clock::now() - killed_at).count();
    INFO("rank " << r << ": '" << line << "' after " << s << " s");
    CHECK(line.rfind("PEERERR ", 0) == 0);
    CHECK(line.find("rank 1") != std::string::npos);
    CHECK(s < 15.0);  // against a 120 s collective timeout
    MESSAGE("rank " << r << " detected the unreaped dead peer after " << s << " s"
                    << std::string(no_pidfd ? " (/proc fallback)" : " (pidfd)"));
  }
  CHECK(proc_state(kids[kVictim].pid) == 'Z');  // it really was a zombie all along
  reap(kids);
}

}  // namespace

TEST_CASE("shm: a killed peer nobody reaped is detected at once (pidfd)") {
  killed_unreaped_peer(false);
}

TEST_CASE("shm: a killed peer nobody reaped is detected at once (/proc fallback)") {
  killed_unreaped_peer(true);
}

TEST_CASE("shm: abort() is published through the segment and names the aborting rank") {
  constexpr int kWorld = 3, kAborter = 2, kLate = 1;
  const int port = accel::test::free_port();
  std::vector<Child> kids;
  for (int r = 0; r < kWorld; ++r) {
    kids.push_back(fork_child([&, r](int in, int out) {
      auto store = connect_store(r, port);
      auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
      if (!shm) return say(out, "NOSHM"), 2;
      if (!reduce_once(*shm, r, kWorld)) return say(out, "WRONG"), 2;
      say(out, "READY");
      if (r == kLate && read_line(in, kReadLimit + 30s) != "GO") return 2;
      std::thread aborter;
      if (r == kAborter)
        aborter = std::thread([&] {
          std::this_thread::sleep_for(300ms);
          shm->abort("test: the heartbeat lost rank 1");
        });
      say(out, reduce_result(*shm, r, kWorld));
      if (aborter.joinable()) aborter.join();
      return linger_if_server(r, in);
    }));
  }
  for (int r = 0; r < kWorld; ++r) REQUIRE(read_line(kids[size_t(r)].out, kReadLimit) == "READY");
  // Rank 0 waits for rank 1, which stays out of the collective until rank 0 has answered: only
  // the published abort can end rank 0's wait before its 120 s timeout.
  const auto t0 = Clock::now();
  const std::string r0 = read_line(kids[0].out, kReadLimit);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO("rank 0: '" << r0 << "' after " << s << " s");
  CHECK(r0.rfind("PEERERR ", 0) == 0);
  CHECK(r0.find("rank 2 aborted") != std::string::npos);
  CHECK(r0.find("heartbeat lost rank 1") != std::string::npos);
  CHECK(s < 15.0);
  say(kids[kLate].in, "GO");
  const std::string r1 = read_line(kids[kLate].out, kReadLimit);
  INFO("rank 1 (entering after the abort): '" << r1 << "'");
  CHECK(r1.rfind("PEERERR ", 0) == 0);
  CHECK(r1.find("rank 2 aborted") != std::string::npos);
  const std::string r2 = read_line(kids[kAborter].out, kReadLimit);
  INFO("rank 2 (the aborting rank): '" << r2 << "'");
  CHECK(r2.rfind("PEERERR ", 0) == 0);
  CHECK(r2.find("heartbeat lost rank 1") != std::string::npos);
  reap(kids);
}

// Note [shm stamps]: stamps ride the arrivals of exchanges and all-reduces; every rank must see
// each peer's stamp of the same round, never one of the round before or after, although a fast
// rank publishes its next stamp while slow ones still read (the two parity areas).
TEST_CASE("shm: stamps on arrivals: every rank reads every peer's stamp of the same round") {
  constexpr int kWorld = 3, kRounds = 3000;
  const int port = accel::test::free_port();
  std::vector<Child> kids;
  for (int r = 0; r < kWorld; ++r) {
    kids.push_back(fork_child([&, r](int in, int out) {
      auto store = connect_store(r, port);
      auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
      if (!shm) return say(out, "NOSHM"), 2;
      auto stamp_of = [](int rank, int round) {
        std::array<uint64_t, ShmAllReduce::kStampBytes / 8> s{};
        for (size_t w = 0; w < s.size(); ++w)
          s[w] = uint64_t(round) * 1000 + uint64_t(rank) * 10 + w;
        return s;
      };
      int bad = 0, checked = 0;
      auto verify = [&](const void* all, int round) {
        for (int q = 0; q < kWorld; ++q) {
          auto want = stamp_of(q, round);
          if (std::memcmp(static_cast<const char*>(all) + size_t(q) * ShmAllReduce::kStampBytes,
                          want.data(), ShmAllReduce::kStampBytes) != 0)
            ++bad;
        }
        ++checked;
      };
      for (int round = 0; round < kRounds; ++round) {
        auto mine = stamp_of(r, round);
        if (round % 3 == 2) {
          // Rounds whose stamp rides an all-reduce (checked every other time).
          std::vector<float> v(round % 2 ? 16 : kElems, float(r + 1));
          const ShmAllReduce::StampCheck check = [&](const void* all) { verify(all, round); };
          shm->all_reduce(v.data(), v.size(), sizeof(float), kSum, kCollectiveTimeout, mine.data(),
                          round % 2 ? &check : nullptr);
          if (v[v.size() - 1] != float(kWorld * (kWorld + 1) / 2)) ++bad;
        } else {
          uint8_t all[ShmAllReduce::kStampBytes * kWorld];
          shm->exchange(mine.data(), all, kCollectiveTimeout);
          verify(all, round);
        }
      }
      // A check that throws stops the all-reduce before anything is reduced, and the segment
      // stays in step (the next all-reduce is right).
      std::vector<float> v(kElems, float(r + 1));
      const ShmAllReduce::StampCheck refuse = [](const void*) {
        throw accel::DistError("[test] refused");
      };
      bool refused = false;
      try {
        shm->all_reduce(v.data(), v.size(), sizeof(float), kSum, kCollectiveTimeout,
                        stamp_of(r, 0).data(), &refuse);
      } catch (const accel::DistError&) {
        refused = true;
      }
      for (float x : v)
        if (x != float(r + 1)) ++bad;
      if (!refused || !reduce_once(*shm, r, kWorld)) ++bad;
      say(out, "BAD " + std::to_string(bad) + " CHECKED " + std::to_string(checked));
      return linger_if_server(r, in);
    }));
  }
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const std::string line = read_line(kids[size_t(r)].out, kReadLimit + 60s);
    INFO(line);
    CHECK(line.rfind("BAD 0 CHECKED ", 0) == 0);
    CHECK(std::atoi(line.c_str() + 14) > kRounds / 2);
  }
  reap(kids);
}

TEST_CASE("shm: ranks with different host keys all fall back, equal keys use shm") {
  constexpr int kWorld = 3;
  for (bool same : {true, false}) {
    const int port = accel::test::free_port();
    std::vector<Child> kids;
    for (int r = 0; r < kWorld; ++r) {
      kids.push_back(fork_child([&, r](int in, int out) {
        // Rank 2 claims another host (two containers or netns sharing /dev/shm).
        setenv("ACCEL_SHM_HOST_KEY", (!same && r == 2) ? "host-b" : "host-a", 1);
        auto store = connect_store(r, port);
        auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
        say(out, !shm ? "NOSHM" : reduce_once(*shm, r, kWorld) ? "SHM" : "WRONG");
        return linger_if_server(r, in);
      }));
    }
    for (int r = 0; r < kWorld; ++r) {
      INFO("same host key: " << same << ", rank " << r);
      CHECK(read_line(kids[size_t(r)].out, kReadLimit) == (same ? "SHM" : "NOSHM"));
    }
    reap(kids);
  }
}

TEST_CASE("shm: a Gloo group whose ranks are on different hosts all-reduces over TCP") {
  constexpr int kWorld = 3;
  for (bool same : {true, false}) {
    const int port = accel::test::free_port();
    std::vector<Child> kids;
    for (int r = 0; r < kWorld; ++r) {
      kids.push_back(fork_child([&, r](int in, int out) {
        setenv("ACCEL_SHM_HOST_KEY", (!same && r == 1) ? "host-b" : "host-a", 1);
        accel::dist::ProcessGroupOptions o;
        o.timeout = kStoreTimeout;
        auto pg = accel::dist::new_gloo_group(connect_store(r, port), r, kWorld, o);
        auto* gloo = dynamic_cast<accel::dist::ProcessGroupGloo*>(pg.get());
        accel::Tensor t = accel::full({1000}, double(r + 1));
        pg->all_reduce(t);
        const bool right = t.narrow(0, 999, 1).item<double>() == 6.0;
        say(out,
            std::string(gloo && gloo->uses_shm() ? "SHM" : "TCP") + (right ? " OK" : " WRONG"));
        pg->barrier();  // nobody tears the group down while a peer still uses it
        return linger_if_server(r, in);
      }));
    }
    for (int r = 0; r < kWorld; ++r) {
      INFO("same host key: " << same << ", rank " << r);
      CHECK(read_line(kids[size_t(r)].out, kReadLimit) == (same ? "SHM OK" : "TCP OK"));
    }
    reap(kids);
  }
}

TEST_CASE("shm: a rank in another network namespace makes every rank fall back (root)") {
  constexpr int kWorld = 2;
  const int port = accel::test::free_port();
  std::vector<Child> kids;
  for (int r = 0; r < kWorld; ++r) {
    kids.push_back(fork_child([&, r](int in, int out) {
      auto store = connect_store(r, port);  // connected first: the socket keeps its namespace
      if (r == 1 && unshare(CLONE_NEWNET) != 0) return say(out, "SKIP"), 0;
      auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
      say(out, !shm ? "NOSHM" : "SHM");
      return linger_if_server(r, in);
    }));
  }
  const std::string r1 = read_line(kids[1].out, kReadLimit);
  if (r1 == "SKIP") {
    reap(kids);
    MESSAGE("skipped: unshare(CLONE_NEWNET) is not permitted here (needs root)");
    std::exit(77);  // registered as its own meson test: 77 = skipped
  }
  const std::string r0 = read_line(kids[0].out, kReadLimit);
  INFO("rank 0: '" << r0 << "', rank 1: '" << r1 << "'");
  CHECK(r1 == "NOSHM");
  CHECK(r0 == "NOSHM");
  reap(kids);
}

TEST_CASE("shm: rank 0 unlinks its segment when create() fails after making it") {
  Child c = fork_child([](int, int out) {
    auto store = connect_store(0, 0);
    // Rank 1 announced the same host, then never reports having mapped the segment.
    store->set("shm/host/1", ShmAllReduce::host_key());
    try {
      ShmAllReduce::create(store, 0, 2, kSlotBytes, 1500ms);
      say(out, "RETURNED");
    } catch (const accel::DistError& e) {
      say(out, "THREW " + std::to_string(shm_entries_of(getpid()).size()));
    }
    return 0;
  });
  CHECK(read_line(c.out, kReadLimit) == "THREW 0");
  const pid_t pid = c.pid;
  std::vector<Child> kids{c};
  reap(kids);
  for (auto& n : shm_entries_of(pid)) fs::remove(fs::path("/dev/shm") / n);  // old code's leak
}

TEST_CASE("shm: sweep removes dead creators' segments of this pid namespace only") {
  // A reaped child and a zombie child: both gone.
  pid_t reaped = fork();
  if (reaped == 0) _exit(0);
  REQUIRE(reaped > 0);
  int st = 0;
  REQUIRE(waitpid(reaped, &st, 0) == reaped);
  pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  REQUIRE(zombie > 0);
  for (int i = 0; i < 500 && proc_state(zombie) != 'Z'; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(proc_state(zombie) == 'Z');

  const std::string ns = ShmAllReduce::pid_namespace_id();
  const std::string other_ns = ns == "1" ? "2" : "1";
  const fs::path dir = "/dev/shm";
  auto seg = [&](const std::string& n, pid_t pid, const char* nonce) {
    return dir / ("accel-" + n + "-" + std::to_string(pid) + "-" + nonce);
  };
  const fs::path dead = seg(ns, reaped, "5eed01"), zomb = seg(ns, zombie, "5eed02");
  const fs::path live = seg(ns, getpid(), "5eed03"), foreign = seg(other_ns, reaped, "5eed04");
  const fs::path unrelated = dir / ("accel-" + std::to_string(reaped) + "-5eed05");
  for (auto& p : {dead, zomb, live, foreign, unrelated}) std::ofstream(p) << "x";

  CHECK(ShmAllReduce::sweep_stale_segments() >= 2);
  CHECK_FALSE(fs::exists(dead));
  CHECK_FALSE(fs::exists(zomb));
  CHECK(fs::exists(live));       // its creator runs
  CHECK(fs::exists(foreign));    // another pid namespace's: its pid means nothing here
  CHECK(fs::exists(unrelated));  // not a name this version makes
  for (auto& p : {dead, zomb, live, foreign, unrelated}) fs::remove(p);
  waitpid(zombie, &st, 0);
}

TEST_CASE("shm: a working group reduces correctly and leaves nothing in /dev/shm") {
  constexpr int kWorld = 3;
  const int port = accel::test::free_port();
  std::vector<Child> kids;
  for (int r = 0; r < kWorld; ++r) {
    kids.push_back(fork_child([&, r](int in, int out) {
      auto store = connect_store(r, port);
      auto shm = ShmAllReduce::create(store, r, kWorld, kSlotBytes, kStoreTimeout);
      bool ok = shm != nullptr;
      for (int i = 0; ok && i < 3; ++i) ok = reduce_once(*shm, r, kWorld);
      say(out, ok ? "OK" : "FAIL");
      return linger_if_server(r, in);
    }));
  }
  for (int r = 0; r < kWorld; ++r) CHECK(read_line(kids[size_t(r)].out, kReadLimit) == "OK");
  CHECK(shm_entries_of(kids[0].pid).empty());
  reap(kids);
}

// Rank r's value j for the all-gather / reduce-scatter test: not exactly summable in float, so
// a different reduction order would show in the bits.
float gather_value(int rank, size_t j) {
  return float(rank + 1) * 0.1f + float(j % 977) * 1.0e-3f + float(j % 13) * 3.3e-7f;
}

TEST_CASE(
    "shm: all-gather and reduce-scatter over many chunks, in place, same bits as all-reduce") {
  // kSlotBytes (64 KiB) is far below the sizes here, so every chunk and window boundary is
  // crossed; the world sizes make windows of uneven length.
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    const int port = accel::test::free_port();
    std::vector<Child> kids;
    for (int r = 0; r < world; ++r) {
      kids.push_back(fork_child([&, r](int in, int out) {
        auto store = connect_store(r, port);
        auto shm = ShmAllReduce::create(store, r, world, kSlotBytes, kStoreTimeout);
        if (!shm) return say(out, "NOSHM"), 2;
        int bad = 0;
        for (size_t n : {size_t(1), size_t(16383), size_t(16384), kElems + 3}) {
          // All-gather into a separate output, then in place.
          std::vector<float> mine(n), all(n * size_t(world), -1.0f);
          for (size_t j = 0; j < n; ++j) mine[j] = gather_value(r, j);
          shm->all_gather(mine.data(), all.data(), n, sizeof(float), kCollectiveTimeout);
          for (size_t q = 0; q < size_t(world); ++q)
            for (size_t j = 0; j < n; ++j) bad += all[q * n + j] != gather_value(int(q), j);
          std::vector<float> buf(n * size_t(world), -1.0f);
          std::copy(mine.begin(), mine.end(), buf.begin() + long(size_t(r) * n));
          shm->all_gather(buf.data() + size_t(r) * n, buf.data(), n, sizeof(float),
                          kCollectiveTimeout);
          bad += buf != all;
          // Reduce-scatter of rank-dependent data equals this rank's slice of the all-reduce,
          // bit for bit (both reduce in rank order).
          std::vector<float> src(n * size_t(world));
          for (size_t j = 0; j < src.size(); ++j) src[j] = gather_value(r, j * 7 + 1);
          std::vector<float> rs(n, -1.0f), ar = src;
          shm->reduce_scatter(src.data(), rs.data(), n, sizeof(float), kSum, kCollectiveTimeout);
          shm->all_reduce(ar.data(), ar.size(), sizeof(float), kSum, kCollectiveTimeout);
          bad += std::memcmp(rs.data(), ar.data() + size_t(r) * n, n * sizeof(float)) != 0;
          for (size_t j = 0; j < src.size(); ++j) bad += src[j] != gather_value(r, j * 7 + 1);
        }
        // A refused stamp check stops the all-gather before anything is read from a peer: the
        // output is untouched and the next collective is right.
        const ShmAllReduce::StampCheck refuse = [](const void*) {
          throw accel::DistError("[test] refused");
        };
        std::array<uint64_t, ShmAllReduce::kStampBytes / 8> stamp{};
        std::vector<float> mine(100, float(r)), all(100 * size_t(world), -1.0f);
        bool refused = false;
        try {
          shm->all_gather(mine.data(), all.data(), mine.size(), sizeof(float), kCollectiveTimeout,
                          stamp.data(), &refuse);
        } catch (const accel::DistError&) {
          refused = true;
        }
        bad += !refused;
        for (float x : all) bad += x != -1.0f;
        if (!reduce_once(*shm, r, world)) ++bad;
        say(out, "BAD " + std::to_string(bad));
        return linger_if_server(r, in);
      }));
    }
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(read_line(kids[size_t(r)].out, kReadLimit + 60s) == "BAD 0");
    }
    CHECK(shm_entries_of(kids[0].pid).empty());
    reap(kids);
  }
}
