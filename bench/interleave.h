// Rounds of measured steps alternating with replays of the step's limit (Note [interleaved
// limit] in bench/step_limit.cc), and the spread they print. Pure logic, no timing: the caller
// passes what each round measured (tests/bench/test_interleave.cc).
#pragma once

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "bench/median.h"

namespace accel::bench {

// Median, minimum and maximum of a set of figures (all 0 when empty).
struct Spread {
  double median = 0, min = 0, max = 0;
  int n = 0;
};

inline Spread spread_of(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  s.median = median(v);
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  s.n = int(v.size());
  return s;
}

// `total` timed items split into `rounds` chunks as evenly as possible (the first ones one
// longer), every chunk at least one item: fewer rounds when total < rounds.
inline std::vector<int> round_sizes(int total, int rounds) {
  rounds = std::max(1, std::min(rounds, std::max(total, 1)));
  std::vector<int> sizes(size_t(rounds), total / rounds);
  for (int i = 0; i < total % rounds; ++i) ++sizes[size_t(i)];
  return sizes;
}

// What the interleaved measurement gives one workload: per round the median step time of its
// chunk and the replayed limit, and the efficiency of each round (limit / step of that round).
struct Interleaved {
  std::vector<double> step_ms, limit_ms;  // one per round, in order
  Spread step, limit, efficiency;
};

// The spreads of per-round step medians and limits (parallel vectors); a round's efficiency is
// its limit / its step median.
inline Interleaved summarize(std::vector<double> step_ms, std::vector<double> limit_ms) {
  Interleaved out;
  std::vector<double> eff;
  for (size_t r = 0; r < step_ms.size() && r < limit_ms.size(); ++r)
    if (step_ms[r] > 0) eff.push_back(limit_ms[r] / step_ms[r]);
  out.step_ms = std::move(step_ms);
  out.limit_ms = std::move(limit_ms);
  out.step = spread_of(out.step_ms);
  out.limit = spread_of(out.limit_ms);
  out.efficiency = spread_of(eff);
  return out;
}

// Runs `rounds` alternations: steps(r) (measures round r's steps, returns their median ms), then
// replay(r) (returns round r's limit ms). The order is fixed, step chunk first, so that load from
// other processes hits both alike.
inline Interleaved interleave(int rounds, const std::function<double(int)>& steps,
                              const std::function<double(int)>& replay) {
  std::vector<double> s, l;
  for (int r = 0; r < rounds; ++r) {
    s.push_back(steps(r));
    l.push_back(replay(r));
  }
  return summarize(std::move(s), std::move(l));
}

}  // namespace accel::bench
