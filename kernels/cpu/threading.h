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
// GOMP_SPINCOUNT=100. So unless the user chose a policy (decided at load), libaccel starts, just
// before the process's first OpenMP team (before_team() below), one dormant thread that opens an
// OpenMP team of its own and then blocks forever with its signals blocked:
// its idle team members count as managed threads, the count exceeds the CPUs, and every wait in
// the process is the bounded spin. Cost: two sleeping threads. Measured against the default and
// passive waiting in docs/performance.md ("OpenMP wait default").
enum class WaitDefault : int {
  UserChoice = 0,    // OMP_WAIT_POLICY or GOMP_SPINCOUNT set: libgomp does what they say
  BoundedSpin = 1,   // the dormant team makes every wait spin 100 times, then sleep
  SingleThread = 2,  // one thread (or one CPU): no team waits, nothing to do
  Disabled = 3,      // ACCEL_CPU_WAIT=default: libgomp's own default kept
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
// What was decided at load; whether the dormant team is up (starts it, as before_team(), and
// waits up to 2 s for it to form).
WaitDefault wait_default();
bool wait_default_active();
// "bounded_spin", "user:OMP_WAIT_POLICY=passive", "single_thread", "libgomp_default" (one token;
// starts nothing).
std::string wait_default_name();

}  // namespace accel::cpu
