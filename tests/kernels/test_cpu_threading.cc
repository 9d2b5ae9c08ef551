// How the CPU kernels use the OpenMP team (kernels/cpu/threading.h): the GEMM grain (Note [GEMM
// grain]) and the wait default for a program not started by accel-run (Note [OpenMP wait
// default]). Run plain and under OMP_WAIT_POLICY / GOMP_SPINCOUNT / ACCEL_CPU_WAIT
// (tests/kernels/meson.build): the user's choice always wins.
#include <doctest/doctest.h>
#include <omp.h>
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "accel.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/threading.h"
#include "tests/common/tensors.h"

using namespace accel;
using cpu::WaitDefault;

namespace {

double process_cpu_ms() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return (double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3) +
         double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-3;
}

// The threads of this process (/proc/self/task).
int task_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved); }
};

// The GEMM grain cases count capped products: a busy machine must not shrink the team under them
// (Note [team under load]).
struct FixedTeam {
  bool saved = cpu::team_adaptive();
  FixedTeam() { cpu::set_team_adaptive(false); }
  ~FixedTeam() { cpu::set_team_adaptive(saved); }
};

struct Grain {
  explicit Grain(int64_t g) { cpu::set_gemm_grain(g); }
  ~Grain() { cpu::set_gemm_grain(-1); }
};

}  // namespace

// First in the file (doctest runs a file's cases in order): nothing has opened a team yet.
TEST_CASE("wait default: no thread before the first team") {
  if (cpu::wait_default() != WaitDefault::BoundedSpin &&
      cpu::wait_default() != WaitDefault::Adaptive)
    return;
  // A second thread at load would cost single-threaded programs glibc's and libstdc++'s fast
  // paths (Note [OpenMP wait default]): the dormant team waits for before_team().
  CHECK(cpu::detail::g_wait_pending.load());
  CHECK(task_count() == 1);
}

TEST_CASE("wait default: the decision") {
  int extra = -1;
  // The user's policy (either variable, any value) wins; so does ACCEL_CPU_WAIT=default.
  CHECK(cpu::decide_wait_default("passive", nullptr, nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(extra == 0);
  CHECK(cpu::decide_wait_default("active", nullptr, nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(cpu::decide_wait_default(nullptr, "10000", nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, "default", 2, 2, &extra) ==
        WaitDefault::Disabled);
  // Empty values count as unset: the adaptive default. ACCEL_CPU_WAIT=bounded keeps the
  // dormant team always; any other value is the default.
  CHECK(cpu::decide_wait_default("", "", "", 2, 2, &extra) == WaitDefault::Adaptive);
  CHECK(extra == 2);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, "bounded", 2, 2, &extra) ==
        WaitDefault::BoundedSpin);
  CHECK(extra == 2);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, "adaptive", 2, 2, &extra) ==
        WaitDefault::Adaptive);
  CHECK(cpu::decide_wait_default("passive", nullptr, "bounded", 2, 2, &extra) ==
        WaitDefault::UserChoice);
  // One thread or one CPU: no team waits.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 1, 2, &extra) ==
        WaitDefault::SingleThread);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 4, 1, &extra) ==
        WaitDefault::SingleThread);
  // The dormant team makes 1 + (extra - 1) + (threads - 1) exceed the CPUs.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 16, 16, &extra) ==
        WaitDefault::Adaptive);
  CHECK(extra == 2);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 7, 8, &extra) == WaitDefault::Adaptive);
  CHECK(extra == 3);
  CHECK(1 + (extra - 1) + (7 - 1) > 8);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 32, 8, &extra) ==
        WaitDefault::Adaptive);
  CHECK(extra == 2);
  // A team much smaller than the machine: left alone.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 4, 16, &extra) ==
        WaitDefault::SingleThread);
}

TEST_CASE("wait default: what this process got, and its effect") {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const std::string name = cpu::wait_default_name();
  CAPTURE(name);
  if ((policy != nullptr && *policy) || (spin != nullptr && *spin)) {
    CHECK(cpu::wait_default() == WaitDefault::UserChoice);
    CHECK(name.rfind("user:", 0) == 0);
    CHECK(!cpu::wait_default_active());
    return;
  }
  const char* accel_wait = std::getenv("ACCEL_CPU_WAIT");
  if (accel_wait != nullptr && std::string(accel_wait) == "default") {
    CHECK(cpu::wait_default() == WaitDefault::Disabled);
    CHECK(name == "libgomp_default");
    return;
  }
  const bool adaptive = cpu::wait_default() == WaitDefault::Adaptive;
  if (cpu::wait_default() != WaitDefault::BoundedSpin && !adaptive) {
    MESSAGE("one thread or one CPU here: no dormant team (", name, ")");
    CHECK(name == "single_thread");
    return;
  }
  CHECK(name == (adaptive ? "adaptive" : "bounded_spin"));
  // The adaptive mode's state is set here, not measured (a busy or quiet CI machine would move
  // it): bounded first.
  if (adaptive) {
    cpu::detail::set_wait_measuring(false);
    cpu::detail::apply_wait_state(false);
    CHECK(std::string(cpu::wait_stats().now) == "bounded");
  }
  REQUIRE(cpu::wait_default_active());
  // libgomp's default spin keeps a team member busy for several ms after each region (~98 ms of
  // CPU over these 20 regions of 5 ms sleeps on the 2-core EPYC); the bounded spin sleeps at
  // once. A CPU-time bound with a wide margin, not a speed figure: load on the machine only
  // lowers what we measure.
  Threads two(2);
  volatile int sink = 0;
  const auto regions_cpu_ms = [&] {
#pragma omp parallel
    { sink = sink + omp_get_thread_num(); }
    const double c0 = process_cpu_ms();
    for (int i = 0; i < 20; ++i) {
#pragma omp parallel
      { sink = sink + omp_get_thread_num(); }
      usleep(5000);
    }
    return process_cpu_ms() - c0;
  };
  const double bounded_ms = regions_cpu_ms();
  CAPTURE(bounded_ms);
  CHECK(bounded_ms < 30.0);
  if (!adaptive) return;
  // Released, the dormant thread and its team member end (the process has two threads fewer)
  // and libgomp's spin is back: its member spins after every region.
  const auto settles = [](const std::function<bool()>& f) {
    for (int i = 0; i < 2000; ++i) {
      if (f()) return true;
      usleep(1000);
    }
    return f();
  };
  const int held = task_count();
  cpu::detail::apply_wait_state(true);
  CHECK(std::string(cpu::wait_stats().now) == "spin");
  CHECK_FALSE(cpu::wait_default_active());
  CHECK(settles([&] { return task_count() <= held - 2; }));  // the holder and one member at least
  const double spin_ms = regions_cpu_ms();
  CAPTURE(spin_ms);
  CHECK(spin_ms > bounded_ms + 5.0);
  // Started again: the bounded spin as before.
  cpu::detail::apply_wait_state(false);
  REQUIRE(cpu::wait_default_active());
  CHECK(settles([&] { return task_count() == held; }));
  CHECK(regions_cpu_ms() < 30.0);
  cpu::detail::set_wait_measuring(true);
}

TEST_CASE("wait default: the adaptive decision") {
  using W = cpu::WaitAdapter;
  constexpr int64_t ms = 1'000'000;
  W w;
  CHECK_FALSE(w.spin);  // bounded until a window is measured
  int64_t t = 0;
  // A quiet window: spin.
  CHECK(w.decide(0.02, t += 200 * ms));
  CHECK(w.switches == 1);
  // Between the two thresholds: whatever it is stays.
  CHECK(w.decide(0.08, t += 200 * ms));
  // Contended while spinning, one window into it: bounded; retried after 0.5 s, and the next
  // refutation waits twice as long.
  CHECK_FALSE(w.decide(0.30, t += 200 * ms));
  CHECK(w.switches == 2);
  CHECK(w.retry_at_ns == t + W::kRetryBaseNs);
  CHECK(w.backoff_ns == 2 * W::kRetryBaseNs);
  CHECK_FALSE(w.decide(0.02, t += 200 * ms));  // quiet, but before the retry
  CHECK_FALSE(w.decide(0.07, t += 400 * ms));  // past it, not quiet enough
  CHECK(w.decide(0.03, t += 200 * ms));        // quiet past it: spin again
  CHECK_FALSE(w.decide(0.5, t += 200 * ms));   // refuted again
  CHECK(w.retry_at_ns == t + 2 * W::kRetryBaseNs);
  // Refuted again and again: the wait doubles up to the cap.
  for (int i = 0; i < 6; ++i) {
    t = w.retry_at_ns;
    REQUIRE(w.decide(0.0, t));
    REQUIRE_FALSE(w.decide(0.5, t += 200 * ms));
  }
  CHECK(w.backoff_ns == W::kRetryMaxNs);
  CHECK(w.retry_at_ns - t <= W::kRetryMaxNs);
  // A spin that holds for kSettledWindows resets the backoff.
  t = w.retry_at_ns;
  REQUIRE(w.decide(0.0, t));
  for (int i = 0; i < W::kSettledWindows; ++i) REQUIRE(w.decide(0.05, t += 200 * ms));
  CHECK(w.backoff_ns == W::kRetryBaseNs);
  CHECK_FALSE(w.decide(0.2, t += 200 * ms));
  CHECK(w.retry_at_ns == t + W::kRetryBaseNs);
}

TEST_CASE("GEMM grain: the decision and the scope") {
  FixedTeam fixed;
  CHECK(cpu::gemm_single_thread(1000, 1 << 20, 2));
  CHECK_FALSE(cpu::gemm_single_thread(int64_t(1) << 20, 1 << 20, 2));  // at the grain: shared
  CHECK_FALSE(cpu::gemm_single_thread(1000, 1 << 20, 1));              // nothing to cap
  CHECK_FALSE(cpu::gemm_single_thread(1000, 0, 2));                    // grain 0: off
  Threads two(2);
  const int64_t before = cpu::OneThreadScope::one_thread_scopes();
  {
    cpu::OneThreadScope s(true);
    CHECK(omp_get_max_threads() == 1);
    CHECK(cpu::OneThreadScope::one_thread_scopes() == before + 1);
  }
  CHECK(omp_get_max_threads() == 2);
  {
    cpu::OneThreadScope s(false);
    CHECK(omp_get_max_threads() == 2);
  }
  CHECK(cpu::OneThreadScope::one_thread_scopes() == before + 1);
}

TEST_CASE("GEMM grain: small products run on one thread, large ones on the team") {
  FixedTeam fixed;
  Threads two(2);
  Grain g(cpu::kGemmGrainDefault);
  Generator gen(5);
  for (const DType dt : {kFloat32, kFloat64, kBFloat16}) {
    CAPTURE(dt);
    // (97, 51) @ (51, 204): an LSTMCell of 51 units, 1.0M multiply-adds < 2^20.
    const Tensor a = randn({97, 51}, TensorOptions(dt), &gen);
    const Tensor b = randn({51, 204}, TensorOptions(dt), &gen);
    const int64_t n0 = cpu::OneThreadScope::one_thread_scopes();
    const Tensor small = matmul(a, b);
    CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
    CHECK(omp_get_max_threads() == 2);  // restored after the call
    // The same product with the grain off runs on the team and gives the same values.
    {
      Grain off(0);
      const Tensor shared = matmul(a, b);
      CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
      CHECK(test::max_abs_diff(small.to(kFloat64), shared.to(kFloat64)) <=
            (dt == kBFloat16 ? 0.07 : 1e-4));
    }
    // A batched product counts its batch: 8 x (128, 128) @ (128, 128) = 16.8M multiply-adds,
    // above the float32 grain and the float64 one (16 x).
    const Tensor big = matmul(randn({8, 128, 128}, TensorOptions(dt), &gen),
                              randn({8, 128, 128}, TensorOptions(dt), &gen));
    CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
    (void)big;
  }
  // Under autocast the linear goes through matmul_lowp_stub: capped there too.
  {
    const Tensor x = randn({97, 51}, {}, &gen), w = randn({204, 51}, {}, &gen);
    const int64_t n0 = cpu::OneThreadScope::one_thread_scopes();
    AutocastGuard ac(true, kBFloat16);
    (void)linear(x, w);
    CHECK(cpu::OneThreadScope::one_thread_scopes() >= n0 + 1);
  }
}

// ---- Note [team under load] ----

TEST_CASE("team under load: the decision") {
  constexpr int64_t ms = 1'000'000;
  using A = cpu::TeamAdapter;
  A a;
  a.reset(2);
  // A quiet machine: the full team, nothing tried.
  CHECK(a.decide(0.02, 1.9, 2, 0) == 2);
  CHECK(a.probes == 0);
  // Half the runnable time waiting (2 others beside a team of 2 on 2 CPUs): 1 thread is tried.
  CHECK(a.decide(0.5, 1.0, 2, 100 * ms) == 1);
  CHECK(a.probes == 1);
  CHECK(a.probing);
  // It did less (0.8 CPU s/s against 1.0 / 1.15): the team of 2 stays, the next try waits 1 s.
  CHECK(a.decide(0.3, 0.8, 2, 300 * ms) == 2);
  CHECK(a.shrinks == 0);
  CHECK(a.backoff_ns == 2 * A::kProbeBaseNs);
  CHECK(a.probe_at_ns == 300 * ms + 2 * A::kProbeBaseNs);
  CHECK(a.decide(0.5, 0.7, 2, 500 * ms) == 2);  // before probe_at: no try
  CHECK(a.probes == 1);
  // The team's rate falls (the scheduler moved the threads): the next try of 1 thread wins.
  CHECK(a.decide(0.5, 0.6, 2, 1300 * ms) == 1);
  CHECK(a.decide(0.2, 0.8, 2, 1500 * ms) == 1);
  CHECK(a.shrinks == 1);
  CHECK(a.kept == 1);
  CHECK(a.backoff_ns == A::kProbeBaseNs);
  // At 1 thread the full team is tried again after the wait, whatever the waiting says.
  CHECK(a.decide(0.0, 0.8, 2, 1700 * ms) == 1);
  CHECK(a.decide(0.0, 0.8, 2, 2000 * ms) == 2);
  CHECK(a.probes == 3);
  // Tries that lose double the wait, up to the cap.
  int64_t now = 2200 * ms;
  CHECK(a.decide(0.4, 0.85, 2, now) == 1);
  for (int i = 0; i < 6; ++i) {
    now = a.probe_at_ns;
    CHECK(a.decide(0.0, 0.8, 2, now) == 2);
    now += 200 * ms;
    CHECK(a.decide(0.4, 0.85, 2, now) == 1);
  }
  CHECK(a.backoff_ns == A::kProbeMaxNs);
  // The others leave: the full team's try does twice the work, it stays, nothing more is tried.
  now = a.probe_at_ns;
  CHECK(a.decide(0.0, 0.8, 2, now) == 2);
  CHECK(a.decide(0.0, 1.9, 2, now + 200 * ms) == 2);
  CHECK(a.kept == 2);
  CHECK(a.backoff_ns == A::kProbeBaseNs);
  const int64_t probes = a.probes;
  CHECK(a.decide(0.01, 1.9, 2, now + 10'000 * ms) == 2);
  CHECK(a.probes == probes);

  // A bigger machine tries what fits: 16 threads waiting 20 % of the time have 4 others beside
  // them (1 - 16 / 20), so 12.
  A b;
  b.reset(16);
  CHECK(b.decide(0.2, 12.0, 16, 0) == 12);
  // A little waiting (one other beside 16: 6 %) is tolerated.
  A c;
  c.reset(16);
  CHECK(c.decide(1.0 - 16.0 / 17.0, 15.0, 16, 0) == 16);
  CHECK(c.probes == 0);
  // A one-thread program has nothing to size.
  A d;
  d.reset(1);
  CHECK(d.decide(0.9, 0.3, 2, 0) == 1);
}

namespace {

int cpus_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

// One spinning process per CPU beside the test (another program's busy threads: processes, so
// that their CPU time is not this process's).
struct Spinners {
  std::vector<pid_t> pids;
  explicit Spinners(int n) {
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t p = fork();
      if (p == 0) {
        // Gone with the test, however it ends (a timeout's SIGKILL included).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
      }
      if (p > 0) pids.push_back(p);
    }
  }
  ~Spinners() {
    for (const pid_t p : pids) kill(p, SIGKILL);
    for (const pid_t p : pids) waitpid(p, nullptr, 0);
  }
};

// Parallel regions through the kernels' parallel_for (about a millisecond of work each) until
// `done` or `seconds` pass; whether `done` came.
bool regions_until(const std::function<bool()>& done, double seconds) {
  std::vector<double> out(size_t(1) << 18);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    cpu::parallel_for(int64_t(out.size()), cpu::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = std::sin(double(i) * 1e-3) + out[size_t(i)];
    });
    if (done()) return true;
  }
  return false;
}

}  // namespace

// Not run beside other tests (tests/kernels/meson.build): it needs a quiet machine to see the
// team stay whole.
TEST_CASE("team under load: busy neighbours make the team try a smaller one") {
  const int cpus = cpus_here();
  if (cpus < 2) {
    MESSAGE("one CPU here: no team to size");
    return;
  }
  Threads full(cpus);
  const cpu::TeamStats s0 = cpu::team_stats();
  const auto tried = [&] { return cpu::team_stats().probes > s0.probes; };
  {
    Spinners busy(cpus);
    REQUIRE(busy.pids.size() == size_t(cpus));
    const char* mode = std::getenv("ACCEL_CPU_TEAM");
    CHECK(cpu::team_adaptive() == (mode != nullptr && std::string(mode) == "adaptive"));
    if (!cpu::team_adaptive()) {
      // The default (fixed): the program's team whatever the load (the windows still run when
      // the adaptive wait measures them).
      CHECK_FALSE(regions_until(tried, 1.0));
      if (!cpu::detail::g_wait_adaptive.load()) CHECK(cpu::team_stats().windows == s0.windows);
      CHECK(cpu::team_stats().shrinks == s0.shrinks);
      return;
    }
    const bool probed = regions_until(tried, 10.0);
    if (cpu::team_stats().windows == s0.windows) {
      MESSAGE("no schedstat here (/proc/thread-self/schedstat): the team is never sized");
      return;
    }
    // The contended team tried a smaller one (and kept whichever did more).
    CHECK(probed);
    // The program's thread count is untouched outside an op.
    CHECK(omp_get_max_threads() == cpus);
  }
  // The spinners are gone: the full team runs again (it never left, or a probe brings it back
  // within the 4 s cap whatever the load). Whether it then stays depends on the machine being
  // quiet, which a shared CI machine does not promise: the decision table above checks that a
  // probe with room keeps it.
  CHECK(regions_until([&] { return cpu::team_stats().team == cpus; }, 20.0));
  CHECK(cpu::team_stats().full == cpus);
}

// The adaptive wait beside busy neighbours (one spinning process per CPU, twice over): from
// libgomp's spin back to the bounded one within a few windows. The way back to spinning needs a
// quiet machine, which CI does not promise: the decision table checks it.
TEST_CASE("wait default: busy neighbours bring the bounded spin back") {
  const int cpus = cpus_here();
  if (cpu::wait_default() != WaitDefault::Adaptive) {
    MESSAGE("not the adaptive wait here (", cpu::wait_default_name(), ")");
    return;
  }
  Threads full(cpus);
  cpu::detail::set_wait_measuring(true);
  cpu::detail::apply_wait_state(true);
  REQUIRE(std::string(cpu::wait_stats().now) == "spin");
  const int64_t w0 = cpu::wait_stats().windows;
  {
    Spinners busy(2 * cpus);
    REQUIRE(busy.pids.size() == size_t(2 * cpus));
    const bool bounded =
        regions_until([] { return std::string(cpu::wait_stats().now) == "bounded"; }, 10.0);
    if (cpu::wait_stats().windows == w0) {
      MESSAGE("no schedstat here (/proc/thread-self/schedstat): the wait is never measured");
      return;
    }
    CHECK(bounded);
    CHECK(cpu::wait_default_active());
  }
}

// A team smaller than the program's (as a busy machine makes it) gives the same values: the
// oneDNN primitives are made again for it.
TEST_CASE("team under load: ops under a smaller team") {
  if (cpus_here() < 2) return;
  Threads two(2);
  Generator gen(3);
  const Tensor x = randn({8, 3, 32, 32}, {}, &gen), w = randn({16, 3, 3, 3}, {}, &gen);
  const Tensor a = randn({256, 256}, {}, &gen), b = randn({256, 256}, {}, &gen);
  const Tensor conv_full = conv2d(x, w), mm_full = matmul(a, b);
  const Tensor pool_full = max_pool2d(conv_full, {2, 2});
  {
    cpu::detail::TeamOverride one(1);
    CHECK(test::max_abs_diff(conv2d(x, w), conv_full) <= 1e-5);
    CHECK(test::max_abs_diff(matmul(a, b), mm_full) <= 1e-3);
    CHECK(test::max_abs_diff(max_pool2d(conv_full, {2, 2}), pool_full) == 0);
    CHECK(cpu::detail::TeamOverride::ops() > 0);
    CHECK(omp_get_max_threads() == 2);
  }
}
