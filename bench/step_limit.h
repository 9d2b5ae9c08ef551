// The limit of a training step on this machine (build/bench/workloads; docs/performance.md,
// Note [workload limits]): what the step would take if it ran only its own GEMMs, convolutions
// and attention kernels, each timed alone at the workload's dtype and thread count, plus the
// bytes every other kernel must move at the machine's copy bandwidth.
#pragma once

#include <functional>
#include <string>

namespace accel::bench {

struct StepLimit {
  double compute_ms = 0;  // the replayed kernels, each timed alone, times their call counts
  double memory_ms = 0;   // floor_bytes / copy bandwidth
  double limit_ms = 0;    // compute_ms + memory_ms
  double floor_mb = 0;    // bytes the other kernels read and write (core/profiler.h)
  double copy_gbs = 0;    // measured copy bandwidth (bytes read + written per second)
  int64_t calls = 0;      // replayed calls in the step
  int64_t shapes = 0;     // distinct ones
};

// The step's replayable calls, captured once by running `step` under a Profiler (one more
// training step); replay() times them (and the copy bandwidth) again each time it is called, so
// that the limit can be measured in rounds between the timed steps (Note [interleaved limit]).
class StepLimitProbe {
 public:
  explicit StepLimitProbe(const std::function<void()>& step);
  ~StepLimitProbe();
  StepLimitProbe(const StepLimitProbe&) = delete;
  StepLimitProbe& operator=(const StepLimitProbe&) = delete;
  StepLimit replay() const;

 private:
  struct Impl;
  Impl* impl_;
};

// Runs `step` once under a Profiler (one more training step), then times what it captured.
StepLimit measure_step_limit(const std::function<void()>& step);
// " limit_ms=.. efficiency=.. compute_ms=.. memory_ms=.. floor_mb=.. copy_gbs=.." with every key
// prefixed by `prefix` (e.g. "bf16_"). compute / memory / copy figures are `l`'s (the last
// replay); with `rounds` (the interleaved measurement) limit_ms is the median of its replays,
// efficiency = that median / ms_per_step, and the spread follows:
//   limit_rounds=5 limit_min_ms=.. limit_max_ms=.. efficiency_min=.. efficiency_max=..
//   efficiency_paired=.. step_min_ms=.. step_max_ms=..   (the rounds' limits, per-round
//   limit / step: spread and median, the rounds' step medians)
struct Interleaved;
std::string limit_fields(const StepLimit& l, double ms_per_step, const std::string& prefix = "",
                         const Interleaved* rounds = nullptr);
// Rounds of the interleaved measurement: ACCEL_BENCH_LIMIT_ROUNDS (workloads --limit-rounds),
// default 5.
int limit_rounds();

// ACCEL_BENCH_PROFILE=1 (workloads --profile).
bool profile_requested();
// `steps` steps under a Profiler: one line per op, the `top` largest self times first, then the
// time outside kernels (graph recording, allocation, dispatch):
//   workload=profile of=gpt precision=fp32 rank=1 op=matmul_stub calls_per_step=52 self_ms=4.1
//   pct=38 workload=profile of=gpt precision=fp32 op=outside_kernels self_ms=3.2 pct=4.0 step_ms=80
//   ...
void print_profile(const char* workload, const std::string& precision,
                   const std::function<void()>& step, int steps = 10, int top = 15);

}  // namespace accel::bench
