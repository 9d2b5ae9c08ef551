// How accel's CPU work uses the OpenMP team: the GEMM grain (products too small to share run on
// the calling thread alone) and the wait-policy default for a program not started by accel-run.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace accel::cpu {

// Note [GEMM grain]: oneDNN sizes its OpenMP team from omp_get_max_threads(), whatever the
// product's size, so a (97, 51) @ (51, 204) product (an LSTMCell of 51 units) forks a 2-thread
// team, and on a busy machine waits for a descheduled second thread every time: the
// time_sequence_prediction program (about 80,000 such products) took 27 s on 1 thread and over
// 200 s on 2 at load 8 (issue 40). Products of fewer multiply-adds (m n k over all batch
// entries) than the grain run with omp_get_max_threads() capped at 1 for the call, as
// PyTorch's at::parallel_for runs below its grain. The value comes from `build/bench/workloads
// gemm-grain` (docs/performance.md, "GEMM grain"); ACCEL_CPU_GEMM_GRAIN overrides it (read once;
// 0 turns the cap off).
constexpr int64_t kGemmGrainDefault = int64_t(1) << 20;
int64_t gemm_grain();
void set_gemm_grain(int64_t macs);  // tests and benches; < 0 restores the default
// float64 products run on Eigen, whose parallel GEMM synchronises its threads by spinning on
// shared flags: with a descheduled team member every product waits a time slice (64^3 took
// 9 ms on 2 threads against 0.03 ms on one at load 8; `workloads gemm-grain`), so its grain is
// 16 times the float32 one.
constexpr int64_t kGemmGrainF64Factor = 16;
inline int64_t gemm_grain_for(DType dt) {
  return dt == kFloat64 ? gemm_grain() * kGemmGrainF64Factor : gemm_grain();
}
// Whether a product of `macs` multiply-adds runs on one thread when `max_threads` are available.
inline bool gemm_single_thread(int64_t macs, int64_t grain, int max_threads) {
  return max_threads > 1 && macs < grain;
}

// Caps omp_get_max_threads() at 1 on this thread for its lifetime when `cap` is true (oneDNN's
// sgemm and primitives read it when they run; the matmul primitive cache keys on it too).
class OneThreadScope {
 public:
  explicit OneThreadScope(bool cap) : saved_(cap ? omp_get_max_threads() : 0) {
    if (saved_ > 1) {
      omp_set_num_threads(1);
      ++one_thread_scopes();
    }
  }
  // Scopes that capped a team on this thread so far (tests: a small matmul is capped).
  static int64_t& one_thread_scopes() {
    thread_local int64_t n = 0;
    return n;
  }
  ~OneThreadScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int saved_;
};

// Note [OpenMP wait default]: GNU OpenMP lets a thread that waits (for the next parallel region,
// or at a region's end barrier) spin 300,000 times (several ms) before it sleeps, unless
// OMP_WAIT_POLICY or GOMP_SPINCOUNT say otherwise, and it reads them once, in its own
// constructor, which runs before any of ours: a setenv in libaccel comes too late. On a machine
// shared with other busy processes that spinning takes the cores the neighbours and our own main
// thread need (issue 40: mlp 54-89 ms against 28 ms with passive waiting, 2 busy processes). The
// one other knob libgomp has is its "throttled" spin: when it manages more threads than the CPUs
// it found at start-up, every wait spins only 100 times (then sleeps on a futex), which is
// GOMP_SPINCOUNT=100. libgomp compares the two counts at every wait, so the choice can change
// while the program runs. libaccel makes it with a dormant thread: one that opens an OpenMP team
// of its own and then blocks with its signals blocked; its idle team members count as managed
// threads, the count exceeds the CPUs, and every wait in the process is the bounded spin. When
// the thread returns, libgomp ends its team and the count drops back: libgomp's own spin again.
//
// The bounded spin is right beside busy neighbours and wrong on a quiet machine: every op's team
// then starts with a futex wake of a sleeping member, 50-60 us on these VMs, so a (256, 1024)
// ReLU took 70-97 us against 15-21 us spinning, and the mlp bf16 step 5.97 ms against 4.53
// (docs/performance.md, "The wait default follows the load"). So the default is adaptive: the
// dormant team starts just before the process's first OpenMP team (before_team() below: bounded
// until measured), and the thread that opens teams measures, in the windows of Note [team under
// load] (200 ms, /proc/thread-self/schedstat), the fraction of its runnable time it waited for a
// CPU. A window that waited at most kQuietWait (5 %) releases the dormant team (libgomp's spin);
// a window that waited more than kBusyWait (10 %) while spinning starts it again, and spinning
// is retried after 0.5 s, doubling up to 4 s while each try is refuted within a second (a try
// that lasts resets it). ACCEL_CPU_WAIT=bounded keeps the dormant team up always (the previous
// default), ACCEL_CPU_WAIT=default never starts it; OMP_WAIT_POLICY or GOMP_SPINCOUNT set by
// the user win over all of it. Cost: one sleeping thread and its team member while bounded.
enum class WaitDefault : int {
  UserChoice = 0,    // OMP_WAIT_POLICY or GOMP_SPINCOUNT set: libgomp does what they say
  BoundedSpin = 1,   // ACCEL_CPU_WAIT=bounded: the dormant team always (spin 100, then sleep)
  SingleThread = 2,  // one thread (or one CPU): no team waits, nothing to do
  Disabled = 3,      // ACCEL_CPU_WAIT=default: libgomp's own default kept
  Adaptive = 4,      // the default: libgomp's spin while quiet, the bounded spin while contended
};
// The adaptive wait's decision, fed one window at a time (tests drive it directly).
struct WaitAdapter {
  static constexpr double kQuietWait = 0.05;  // at most this waiting: spin
  static constexpr double kBusyWait = 0.10;   // more than this while spinning: bounded
  static constexpr int64_t kRetryBaseNs = 500'000'000;
  static constexpr int64_t kRetryMaxNs = 4'000'000'000;
  static constexpr int kSettledWindows = 5;  // a spin that lasted this long resets the backoff
  bool spin = false;                         // bounded first: the dormant team starts it
  int spin_windows = 0;                      // windows of the current spin
  int64_t retry_at_ns = 0;
  int64_t backoff_ns = kRetryBaseNs;
  int64_t switches = 0;
  // One window: `waited` = the fraction of the measuring thread's runnable time it spent waiting
  // for a CPU; `now_ns` a monotonic time. Returns whether to spin next.
  bool decide(double waited, int64_t now_ns);
};
// The decision, from the environment's values (null when unset), the OpenMP team size and the
// CPUs the process may run on. `extra` receives the dormant team's size (members that make the
// managed count exceed `cpus`).
WaitDefault decide_wait_default(const char* omp_wait_policy, const char* gomp_spincount,
                                const char* accel_cpu_wait, int max_threads, int cpus, int* extra);
// The dormant team starts before the process's first OpenMP team, not at load: a second
// thread makes glibc and libstdc++ leave their single-threaded fast paths (malloc without
// locks, shared_ptr counts without atomics), which a program that never forks a team (the
// per-op overhead bench: 0.105 -> 0.15 us per op with grad) would pay for nothing. Every place
// that opens a team calls before_team() first: a relaxed load once started.
namespace detail {
extern std::atomic<bool> g_wait_pending;
void start_wait_team();
}  // namespace detail
inline void before_team() {
  if (detail::g_wait_pending.load(std::memory_order_relaxed)) detail::start_wait_team();
}
// Note [team under load]: a team of one thread per CPU is right on a machine of its own, and
// can be wrong beside busy processes: every region splits its work statically over the team, so
// it ends when its slowest member does, and a member the kernel has descheduled (here for about
// 18 ms a time: `workloads --busy 2` saw 19 preemptions a second and 35 % of the time waiting
// per thread) holds the region up while its partner sleeps. Which team is faster then depends
// on the regions' length and on where the scheduler puts the threads: with 2 busy processes on
// 2 CPUs the cnn step took 44-64 ms on 2 threads and 40-48 on 1; gpt 213-318 ms on 2 (two
// modes that last a whole run) and 268-290 on 1 (docs/performance.md, "team under load"). So
// the team is chosen by measuring. Every op that opens a team does it inside a TeamScope; the
// thread that opens them takes, once per window of 200 ms, the fraction of its runnable time it
// spent waiting for a CPU (/proc/thread-self/schedstat) and the process's CPU time per second of
// the window (its rate; CLOCK_PROCESS_CPUTIME_ID). While the full team waits less than 10 %
// nothing changes. Beyond that the adapter tries a smaller team for one window: with N team
// threads and K other runnable threads on C CPUs the waiting is 1 - C / (N + K), so
// K = C / (1 - waiting) - N and the team tried is C - K (at least 1). A window's work per second
// is its rate, divided by 1.15 for a team of more than one thread (what the team costs in CPU
// time for the same work: the mlp step takes 16.0 ms on 1 thread, 2 x 9.9 on 2); the team that
// did more is kept. The other one is tried again after 0.5 s, then after twice as long each
// time the kept one stays better (at most 4 s), so the choice follows the neighbours: when
// they leave, the full team's rate doubles and it comes back. The full team is what
// omp_get_max_threads() says outside the scope (the program's choice, never changed: a scope
// sets the smaller team for its op and restores it), so a program that changes its thread
// count starts the measure again. oneDNN fixes a primitive's decomposition when it is created,
// so the primitive caches key on the thread count.
// It is off unless ACCEL_CPU_TEAM=adaptive (or set_team_adaptive): on the 2-core Intel kind,
// with 2 busy processes, five A/B pairs per workload came out even (medians adaptive / fixed:
// mlp 18.1 / 17.9 ms, cnn 44.3 / 44.2, gpt 278 / 294; each side spread 1.4-2x by the
// scheduler's modes), so it is a tool to try on a shared machine, not a default. On a quiet
// machine it does nothing (no window waits 10 %; the same times as fixed).
struct TeamAdapter {
  static constexpr double kBusyWait = 0.10;  // waiting fraction of a contended full team
  static constexpr double kTeamCost = 1.15;  // CPU time per work of a team over 1 thread
  static constexpr int64_t kWindowNs = 200'000'000;
  static constexpr int64_t kProbeBaseNs = 500'000'000;
  static constexpr int64_t kProbeMaxNs = 4'000'000'000;
  int full = 0;          // the program's team
  int team = 0;          // the team ops run with now
  int kept = 0;          // the team chosen (team differs while probing)
  bool probing = false;  // this window runs another team to compare
  double kept_work = 0;  // the kept team's work per second (smoothed)
  int64_t probe_at_ns = 0;
  int64_t backoff_ns = kProbeBaseNs;
  int64_t shrinks = 0, probes = 0;
  void reset(int threads) {
    full = team = kept = threads;
    probing = false;
    kept_work = 0;
    probe_at_ns = 0;
    backoff_ns = kProbeBaseNs;
  }
  // Work per second of a window run by `threads` at CPU `rate` (CPU seconds per second).
  static double work(int threads, double rate) { return threads > 1 ? rate / kTeamCost : rate; }
  // One window's verdict: `waited` = the fraction of this thread's runnable time spent waiting
  // for a CPU, `rate` = the process's CPU seconds per second, `cpus` the CPUs the process may
  // use, `now_ns` a monotonic time. Returns the team to run next.
  int decide(double waited, double rate, int cpus, int64_t now_ns);
};

struct TeamStats {
  bool adaptive = false;
  int full = 0, team = 0;  // this thread's, at its last window
  int64_t windows = 0, shrinks = 0, probes = 0;
};
// The calling thread's figures (benches and tests).
TeamStats team_stats();
// ACCEL_CPU_TEAM=adaptive at load turns the adaptation on; tests and benches switch it here.
void set_team_adaptive(bool on);
bool team_adaptive();
// "adaptive" or "fixed".
const char* team_mode_name();

namespace detail {
extern std::atomic<bool> g_team_adaptive;
extern std::atomic<bool>
    g_wait_adaptive;  // the adaptive wait measures (Note [OpenMP wait default])
extern std::atomic<int> g_team_overrides;  // TeamOverrides alive in the process
// The team for this op: 0 when the program's stands, else the program's team (to restore).
int enter_team();
void leave_team(int restore);
// Tests: ops on this thread run a team of `n` (what a busy machine may choose) while it lives,
// adaptive or not.
class TeamOverride {
 public:
  explicit TeamOverride(int n);
  ~TeamOverride();
  TeamOverride(const TeamOverride&) = delete;
  TeamOverride& operator=(const TeamOverride&) = delete;
  static int64_t ops();  // TeamScopes on this thread that ran an override's team

 private:
  int saved_;
};
}  // namespace detail

// Every op that opens a team (or calls oneDNN, Eigen or sgemm, which do) holds one for the
// op, before it reads omp_get_max_threads() or looks up a primitive: it starts the dormant team
// (before_team()) and sets the team this load allows (Note [team under load]). Nested scopes
// and scopes inside a parallel region leave the team alone. `open` false: a no-op.
class TeamScope {
 public:
  explicit TeamScope(bool open = true) {
    if (!open) return;
    before_team();
    if (detail::g_team_adaptive.load(std::memory_order_relaxed) ||
        detail::g_wait_adaptive.load(std::memory_order_relaxed) ||
        detail::g_team_overrides.load(std::memory_order_relaxed) > 0) {
      entered_ = true;
      restore_ = detail::enter_team();
    }
  }
  ~TeamScope() {
    if (entered_) detail::leave_team(restore_);
  }
  TeamScope(const TeamScope&) = delete;
  TeamScope& operator=(const TeamScope&) = delete;

 private:
  int restore_ = 0;
  bool entered_ = false;
};

// What was decided at load; whether the dormant team is up (starts it, as before_team(), when
// the mode wants it, and waits up to 2 s for it to form).
WaitDefault wait_default();
bool wait_default_active();
// "adaptive", "bounded_spin", "user:OMP_WAIT_POLICY=passive", "single_thread",
// "libgomp_default" (one token; starts nothing).
std::string wait_default_name();
// The adaptive wait now (Note [OpenMP wait default]): "spin" or "bounded" (what the dormant team
// makes it), and how often it changed; "-" and 0 in the other modes.
struct WaitStats {
  const char* now = "-";
  int64_t switches = 0, windows = 0;
};
WaitStats wait_stats();
namespace detail {
// Tests: the adaptive mode's measuring off (false) or on again; `spin` applies a state at once
// (true: the dormant team released, false: started). No effect outside the adaptive mode.
void set_wait_measuring(bool on);
void apply_wait_state(bool spin);
}  // namespace detail

}  // namespace accel::cpu
