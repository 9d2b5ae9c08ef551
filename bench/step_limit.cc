// Note [workload limits]
// A step's limit is the sum of two floors measured in the same run as the step:
//   compute: every call of matmul_stub, matmul_lowp_stub, conv2d_stub, conv2d_backward_stub,
//     sdpa_stub and sdpa_backward_stub the step makes is captured once per distinct call (dtype,
//     sizes, strides of each operand, parameters) by core/profiler.h, then run alone, warm, on
//     copies of its operands: the median time times its count. On the CPU these kernels are
//     oneDNN's matmul / convolution primitives and sgemm (the attention kernel adds its softmax),
//     so this is the time oneDNN needs for the step's own shapes, as the workload runs them
//     (forward and both backward products).
//   memory: every other kernel (elementwise, norms, softmax, loss, optimizer, copies) only moves
//     bytes; the floor counts each storage they touch once read, plus once written if written
//     (core/profiler.h floor_bytes), at the copy bandwidth measured here with the same threads.
// efficiency = limit_ms / ms_per_step. What the limit leaves out: fusing elementwise work into
// the GEMMs (lowers the true floor below ours), the time outside kernels (graph recording,
// allocation, dispatch: `--profile` shows it), load imbalance across threads.
//
// Note [interleaved limit]: one replay after the timed steps is as exposed to the machine's
// load as the step it judges, and on a shared machine the two met different moments: the
// efficiency of one workload swung 0.41-1.12 within minutes (issue 40). So the calls are
// captured once and replayed k times (ACCEL_BENCH_LIMIT_ROUNDS, default 5), each replay right
// after a chunk of the timed steps (bench/interleave.h): limit_ms is the median of the k
// replays, efficiency = that median / ms_per_step (the median of every timed step), and the line
// carries the spread: the replays' min / max and the per-round efficiencies' min / max, and
// efficiency_paired, the median of the per-round efficiencies (each round's limit over the
// median step of the chunk just before it: load that shifts between rounds cancels in each
// pair). The copy bandwidth is measured again in each replay too.
#include "bench/step_limit.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/profiler.h"
#include "bench/interleave.h"
#include "bench/median.h"

namespace accel::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Median ms of one call of `f`: 2 warm-up calls, then 7 rounds of enough calls for ~2 ms.
double time_alone(const std::function<void()>& f) {
  f();
  f();
  const auto t0 = Clock::now();
  f();
  const double once = std::max(ms_since(t0), 1e-4);
  const int reps = std::clamp(int(2.0 / once), 1, 200);
  std::vector<double> ms;
  for (int r = 0; r < 7; ++r) {
    const auto t1 = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    ms.push_back(ms_since(t1) / reps);
  }
  return median(ms);
}

// Copy bandwidth in bytes (read + written) per second: 2 x 64 MiB, the OpenMP team splitting the
// copy, best of 5 after one warm-up (which also faults the pages in). Measured at each replay.
double copy_bandwidth() {
  const size_t n = size_t(64) << 20;
  std::unique_ptr<char[]> a(new char[n]), b(new char[n]);
  std::memset(a.get(), 1, n);
  std::memset(b.get(), 2, n);
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel
    {
      const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
      std::memcpy(b.get() + lo, a.get() + lo, hi - lo);
    }
    const double s = ms_since(t0) * 1e-3;
    if (r > 0) best = std::min(best, s);
  }
  volatile char sink = b[n / 2];
  (void)sink;
  return 2.0 * double(n) / best;
}

}  // namespace

struct StepLimitProbe::Impl {
  std::vector<ReplayCall> calls;
  int64_t floor = 0;
};

StepLimitProbe::StepLimitProbe(const std::function<void()>& step) : impl_(new Impl) {
  Profiler p({{"matmul_stub", "matmul_lowp_stub", "conv2d_stub", "conv2d_backward_stub",
               "sdpa_stub", "sdpa_backward_stub"},
              true});
  step();
  impl_->calls = p.replays();
  impl_->floor = p.floor_bytes();
}

StepLimitProbe::~StepLimitProbe() { delete impl_; }

StepLimit StepLimitProbe::replay() const {
  StepLimit l;
  for (const ReplayCall& c : impl_->calls) {
    l.compute_ms += time_alone(c.run) * double(c.count);
    l.calls += c.count;
  }
  l.shapes = int64_t(impl_->calls.size());
  l.copy_gbs = copy_bandwidth() / 1e9;
  l.floor_mb = double(impl_->floor) / 1e6;
  l.memory_ms = double(impl_->floor) / (l.copy_gbs * 1e9) * 1e3;
  l.limit_ms = l.compute_ms + l.memory_ms;
  return l;
}

StepLimit measure_step_limit(const std::function<void()>& step) {
  return StepLimitProbe(step).replay();
}

int limit_rounds() {
  const char* v = std::getenv("ACCEL_BENCH_LIMIT_ROUNDS");
  if (v == nullptr || *v == '\0') return 5;
  const int n = std::atoi(v);
  return n >= 1 ? n : 5;
}

std::string limit_fields(const StepLimit& l, double ms_per_step, const std::string& prefix,
                         const Interleaved* rounds) {
  char buf[640];
  const char* p = prefix.c_str();
  const double limit = rounds != nullptr ? rounds->limit.median : l.limit_ms;
  int n = std::snprintf(
      buf, sizeof buf,
      " %slimit_ms=%.3f %sefficiency=%.3f %scompute_ms=%.3f %smemory_ms=%.3f "
      "%sfloor_mb=%.1f %sreplayed_calls=%lld %sreplayed_shapes=%lld %scopy_gbs=%.1f",
      p, limit, p, limit / ms_per_step, p, l.compute_ms, p, l.memory_ms, p, l.floor_mb, p,
      static_cast<long long>(l.calls), p, static_cast<long long>(l.shapes), p, l.copy_gbs);
  if (rounds != nullptr && n > 0 && size_t(n) < sizeof buf) {
    std::snprintf(buf + n, sizeof buf - size_t(n),
                  " %slimit_rounds=%d %slimit_min_ms=%.3f %slimit_max_ms=%.3f "
                  "%sefficiency_min=%.3f %sefficiency_max=%.3f %sefficiency_paired=%.3f "
                  "%sstep_min_ms=%.3f %sstep_max_ms=%.3f",
                  p, rounds->limit.n, p, rounds->limit.min, p, rounds->limit.max, p,
                  rounds->efficiency.min, p, rounds->efficiency.max, p, rounds->efficiency.median,
                  p, rounds->step.min, p, rounds->step.max);
  }
  return buf;
}

bool profile_requested() {
  const char* v = std::getenv("ACCEL_BENCH_PROFILE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

void print_profile(const char* workload, const std::string& precision,
                   const std::function<void()>& step, int steps, int top) {
  step();  // warm (first-call primitive creation is not what a step costs)
  std::vector<ProfileRow> rows;
  double wall_ms = 0;
  {
    Profiler p;
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) step();
    wall_ms = ms_since(t0) / steps;
    rows = p.rows();
  }
  double kernels_ms = 0;
  for (const ProfileRow& r : rows) kernels_ms += r.self_ms / steps;
  int rank = 0;
  for (const ProfileRow& r : rows) {
    if (++rank > top) break;
    std::printf(
        "workload=profile of=%s precision=%s rank=%d op=%s calls_per_step=%.1f self_ms=%.3f "
        "pct=%.1f\n",
        workload, precision.c_str(), rank, r.op.c_str(), double(r.calls) / steps, r.self_ms / steps,
        100.0 * r.self_ms / steps / wall_ms);
  }
  std::printf(
      "workload=profile of=%s precision=%s op=outside_kernels self_ms=%.3f pct=%.1f "
      "step_ms=%.3f kernels_ms=%.3f ops=%zu\n",
      workload, precision.c_str(), wall_ms - kernels_ms, 100.0 * (wall_ms - kernels_ms) / wall_ms,
      wall_ms, kernels_ms, rows.size());
  std::fflush(stdout);
}

}  // namespace accel::bench
