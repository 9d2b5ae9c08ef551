// Wall-clock timing shared by bench/*.cc.
#pragma once

#include <chrono>

namespace accel::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds for `reps` calls of f.
template <typename F>
double time_reps(int reps, F&& f) {
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  return seconds_since(t0);
}

}  // namespace accel::bench
