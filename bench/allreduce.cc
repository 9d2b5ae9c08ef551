// Workload `allreduce`: sum-allreduce of 64 MiB f32 across 2 processes on loopback.
// Prints our GB/s (ProcessGroupGloo::all_reduce with its defaults: fingerprint check on, shared
// memory when the ranks share a host) and the same group with shared memory off (Gloo's TCP
// ring underneath), next to raw Gloo's ring all-reduce (gloo::allreduce, RING, gloo::sum<float>)
// measured in the same processes, interleaved round by round so machine drift hits all alike.
// GB/s = bytes / seconds (algbw), median over rounds.
//
//   allreduce [--mib 64] [--rounds 10] [--procs 2] [--small-iters 2000] [--json]
// Without RANK/WORLD_SIZE in the environment it spawns --procs copies of itself on loopback
// (env contract) and prints rank 0's report.
#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "bench/median.h"
#include "comm/env.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/process_group.h"

using namespace accel;
using bench::median;
using namespace accel::dist;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int mib = 64;
  int rounds = 10;
  int procs = 2;
  int small_iters = 2000;
  bool json = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::cerr << "missing value for " << s << "\n";
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (s == "--mib")
      a.mib = next();
    else if (s == "--rounds")
      a.rounds = next();
    else if (s == "--procs")
      a.procs = next();
    else if (s == "--small-iters")
      a.small_iters = next();
    else if (s == "--json")
      a.json = true;
    else {
      std::cerr << "unknown argument " << s << "\n";
      std::exit(2);
    }
  }
  return a;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Parent mode: spawn ranks with the env contract; rank 0 inherits stdout, others are quiet.
int spawn(int argc, char** argv, int procs) {
  int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < procs; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(procs).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      if (r != 0 && !std::freopen("/dev/null", "w", stdout)) _exit(126);
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  (void)argc;
  return rc;
}

void raw_gloo_allreduce(const std::shared_ptr<gloo::Context>& ctx, float* p, size_t n,
                        uint32_t tag) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput<float>(p, n);
  o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  o.setTag(tag);
  gloo::allreduce(o);
}

int run(const Args& a) {
  InitOptions io;
  auto pg = init_process_group(io);
  auto* gpg = dynamic_cast<ProcessGroupGloo*>(pg.get());
  if (!gpg || pg->size() < 2) {
    std::cerr << "allreduce bench needs the gloo backend and >= 2 ranks\n";
    return 2;
  }
  // A second, independent Gloo context for the raw baseline (its own connections).
  auto store = std::make_shared<PrefixStore>("bench-raw", default_store());
  auto raw = connect_gloo_context(store, pg->rank(), pg->size(), "127.0.0.1", pg->timeout());

  const size_t n = size_t(a.mib) << 18;  // MiB of f32
  const double bytes = double(n) * sizeof(float);
  Tensor t = zeros({int64_t(n)}, TensorOptions(kFloat32));
  std::vector<float> rawbuf(n, 0.0f);
  float* tp = t.data<float>();
  for (size_t i = 0; i < n; ++i) tp[i] = rawbuf[i] = float(i % 7) * 0.5f;

  auto time_it = [](auto&& fn) {
    auto t0 = Clock::now();
    fn();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The same group without the shared-memory path: Gloo's TCP ring behind our process group.
  ProcessGroupOptions tcp_opts;
  tcp_opts.shm = false;
  auto pg_tcp = new_gloo_group(default_store(), pg->rank(), pg->size(), tcp_opts);
  Tensor t2 = zeros({int64_t(n)}, TensorOptions(kFloat32));
  std::memcpy(t2.data_ptr(), tp, n * sizeof(float));

  uint32_t tag = 1;
  std::vector<double> ours, ours_tcp, base;
  for (int r = 0; r < a.rounds + 2; ++r) {  // two warm-up rounds
    pg->barrier();
    double tb = time_it([&] { raw_gloo_allreduce(raw, rawbuf.data(), n, tag++); });
    pg->barrier();
    double to = time_it([&] { pg->all_reduce(t); });
    pg->barrier();
    double tt = time_it([&] { pg_tcp->all_reduce(t2); });
    if (r >= 2) {
      base.push_back(bytes / tb * 1e-9);
      ours.push_back(bytes / to * 1e-9);
      ours_tcp.push_back(bytes / tt * 1e-9);
    }
  }
  // All computed the same sums (small integers times 0.5: exact in any order): a correctness
  // guard for the benchmark itself.
  bool same = std::memcmp(tp, rawbuf.data(), n * sizeof(float)) == 0 &&
              std::memcmp(t2.data_ptr(), rawbuf.data(), n * sizeof(float)) == 0;

  // Latency of a small all-reduce: fingerprint on, off, and raw Gloo, interleaved in blocks so
  // that drift on a shared machine hits all three alike; median block time per op.
  // The same pair over TCP (pg_tcp: shared memory off, fingerprints on, and one with both off).
  // The no-fingerprint group uses the default group's transport (shared memory when it does).
  ProcessGroupOptions nofp;
  nofp.fingerprint_every = 0;
  nofp.shm = gpg->uses_shm();
  auto pg_nofp = new_gloo_group(default_store(), pg->rank(), pg->size(), nofp);
  ProcessGroupOptions tcp_nofp = nofp;
  tcp_nofp.shm = false;
  auto pg_tcp_nofp = new_gloo_group(default_store(), pg->rank(), pg->size(), tcp_nofp);
  Tensor s_fp = zeros({256}, TensorOptions(kFloat32));
  Tensor s_nofp = zeros({256}, TensorOptions(kFloat32));
  Tensor s_tcp = zeros({256}, TensorOptions(kFloat32));
  Tensor s_tcp_nofp = zeros({256}, TensorOptions(kFloat32));
  std::vector<float> sraw(256, 0.0f);
  const int block = 50;
  const int blocks = std::max(3, a.small_iters / block);
  std::vector<double> us_fp, us_nofp, us_raw, us_tcp, us_tcp_nofp;
  auto time_block = [&](ProcessGroup& g, Tensor& x) {
    pg->barrier();
    return time_it([&] {
             for (int i = 0; i < block; ++i) g.all_reduce(x);
           }) /
           block * 1e6;
  };
  auto* gtcp = dynamic_cast<ProcessGroupGloo*>(pg_tcp.get());
  const double fp_s0 = gpg->fingerprint_seconds(), tcp_s0 = gtcp->fingerprint_seconds();
  const int64_t fp_n0 = gpg->fingerprint_checks(), tcp_n0 = gtcp->fingerprint_checks();
  for (int b = 0; b < blocks + 1; ++b) {  // block 0 warms up
    // Each pair in alternating order: whatever a block leaves behind (a peer still yielding,
    // cold caches) falls on "on" and "off" alike.
    double t1, t2, t4, t5;
    if (b % 2) {
      t1 = time_block(*pg, s_fp);
      t2 = time_block(*pg_nofp, s_nofp);
      t4 = time_block(*pg_tcp, s_tcp);
      t5 = time_block(*pg_tcp_nofp, s_tcp_nofp);
    } else {
      t2 = time_block(*pg_nofp, s_nofp);
      t1 = time_block(*pg, s_fp);
      t5 = time_block(*pg_tcp_nofp, s_tcp_nofp);
      t4 = time_block(*pg_tcp, s_tcp);
    }
    pg->barrier();
    double t3 = time_it([&] {
                  for (int i = 0; i < block; ++i)
                    raw_gloo_allreduce(raw, sraw.data(), sraw.size(), tag++);
                }) /
                block * 1e6;
    if (b > 0) {
      us_fp.push_back(t1);
      us_nofp.push_back(t2);
      us_raw.push_back(t3);
      us_tcp.push_back(t4);
      us_tcp_nofp.push_back(t5);
    }
  }
  double small_fp = median(us_fp), small_nofp = median(us_nofp), small_raw = median(us_raw);
  double small_tcp = median(us_tcp), small_tcp_nofp = median(us_tcp_nofp);
  // The check's own time per checked collective (the compare; the whole exchange where one is
  // needed), from the groups' counters: includes the barriers' checks of the default group.
  auto per_check = [](double s, int64_t n) { return n > 0 ? s / double(n) * 1e6 : 0.0; };
  double check_us =
      per_check(gpg->fingerprint_seconds() - fp_s0, gpg->fingerprint_checks() - fp_n0);
  double check_tcp_us =
      per_check(gtcp->fingerprint_seconds() - tcp_s0, gtcp->fingerprint_checks() - tcp_n0);

  if (pg->rank() == 0) {
    double mo = median(ours), mb = median(base), mt = median(ours_tcp);
    if (a.json) {
      std::printf(
          "{\"workload\":\"allreduce\",\"mib\":%d,\"procs\":%d,\"accel_gbps\":%.4f,"
          "\"accel_shm\":%s,\"accel_tcp_gbps\":%.4f,"
          "\"raw_gloo_ring_gbps\":%.4f,\"ratio\":%.4f,\"tcp_ratio\":%.4f,\"results_equal\":%s,"
          "\"small_us_fingerprint\":%.2f,\"small_us_no_fingerprint\":%.2f,"
          "\"small_us_raw_gloo\":%.2f,\"small_us_tcp_fingerprint\":%.2f,"
          "\"small_us_tcp_no_fingerprint\":%.2f,\"check_us\":%.3f,\"check_tcp_us\":%.3f}\n",
          a.mib, pg->size(), mo, gpg->uses_shm() ? "true" : "false", mt, mb, mo / mb, mt / mb,
          same ? "true" : "false", small_fp, small_nofp, small_raw, small_tcp, small_tcp_nofp,
          check_us, check_tcp_us);
    } else {
      std::printf("allreduce %d MiB f32, %d processes on loopback, median of %d rounds\n", a.mib,
                  pg->size(), a.rounds);
      std::printf("  accel all_reduce (default%s)  : %.3f GB/s  %.1f %% of raw gloo\n",
                  gpg->uses_shm() ? ", shared memory" : "", mo, 100.0 * mo / mb);
      std::printf("  accel all_reduce (gloo tcp ring): %.3f GB/s  %.1f %% of raw gloo\n", mt,
                  100.0 * mt / mb);
      std::printf("  raw gloo ring allreduce         : %.3f GB/s\n", mb);
      std::printf("  results identical: %s\n", same ? "yes" : "NO");
      std::printf(
          "small all_reduce (256 f32%s): fingerprint on %.2f us, off %.2f us "
          "(check %+.2f us, %+.1f %%), raw gloo %.1f us\n",
          gpg->uses_shm() ? ", shared memory" : ", tcp", small_fp, small_nofp,
          small_fp - small_nofp, 100.0 * (small_fp / small_nofp - 1), small_raw);
      std::printf(
          "small all_reduce (256 f32, gloo tcp ring): fingerprint on %.2f us, off %.2f us "
          "(check %+.2f us, %+.1f %%)\n",
          small_tcp, small_tcp_nofp, small_tcp - small_tcp_nofp,
          100.0 * (small_tcp / small_tcp_nofp - 1));
      std::printf(
          "fingerprint check itself, per checked collective: %.3f us (default group), "
          "%.3f us (tcp)\n",
          check_us, check_tcp_us);
    }
  }
  pg->barrier();
  pg_nofp.reset();
  pg_tcp_nofp.reset();
  pg_tcp.reset();
  destroy_process_group();
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    DistEnv env = read_dist_env();
    if (!env.distributed) return spawn(argc, argv, a.procs);
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "allreduce bench: " << e.what() << "\n";
    return 1;
  }
}
