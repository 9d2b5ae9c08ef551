// The interleaved limit of build/bench/workloads (Note [interleaved limit] in bench/step_limit.cc,
// bench/interleave.h): chunks of steps alternate with replays, each in its round; medians and
// spreads; the fields the line gets (added after today's, none renamed). No timing.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/interleave.h"
#include "bench/step_limit.h"

using namespace accel::bench;

TEST_CASE("interleave: round sizes cover every timed step") {
  CHECK(round_sizes(50, 5) == std::vector<int>{10, 10, 10, 10, 10});
  CHECK(round_sizes(12, 5) == std::vector<int>{3, 3, 2, 2, 2});
  CHECK(round_sizes(3, 5) == std::vector<int>{1, 1, 1});  // fewer rounds than asked
  CHECK(round_sizes(7, 1) == std::vector<int>{7});
  CHECK(round_sizes(4, 0) == std::vector<int>{4});
}

TEST_CASE("interleave: steps and replays alternate, one of each per round") {
  std::string order;
  const std::vector<double> steps = {10, 12, 30, 11, 9};
  const std::vector<double> limits = {9, 9.5, 8, 10, 9};
  const Interleaved iv = interleave(
      5,
      [&](int r) {
        order += "S" + std::to_string(r);
        return steps[size_t(r)];
      },
      [&](int r) {
        order += "L" + std::to_string(r);
        return limits[size_t(r)];
      });
  CHECK(order == "S0L0S1L1S2L2S3L3S4L4");
  CHECK(iv.step_ms == steps);
  CHECK(iv.limit_ms == limits);
  CHECK(iv.step.median == 11);
  CHECK(iv.step.min == 9);
  CHECK(iv.step.max == 30);
  CHECK(iv.limit.median == 9);
  CHECK(iv.limit.min == 8);
  CHECK(iv.limit.max == 10);
  CHECK(iv.limit.n == 5);
  // Per-round efficiencies: 0.9, 0.7917, 0.2667, 0.9091, 1.0.
  CHECK(iv.efficiency.median == doctest::Approx(0.9));
  CHECK(iv.efficiency.min == doctest::Approx(8.0 / 30));
  CHECK(iv.efficiency.max == doctest::Approx(1.0));
}

TEST_CASE("interleave: spreads of nothing and of one") {
  const Spread none = spread_of({});
  CHECK(none.n == 0);
  CHECK(none.median == 0);
  const Interleaved one = summarize({20}, {15});
  CHECK(one.limit.median == 15);
  CHECK(one.efficiency.median == doctest::Approx(0.75));
  CHECK(one.efficiency.min == one.efficiency.max);
  // A zero step time (no steps) gives no efficiency rather than a division by zero.
  CHECK(summarize({0}, {5}).efficiency.n == 0);
}

TEST_CASE("interleave: the line keeps today's fields and adds the spread") {
  StepLimit l;
  l.compute_ms = 8;
  l.memory_ms = 2;
  l.limit_ms = 11;  // the last replay (round 3's)
  const Interleaved iv = summarize({10, 12, 11}, {9, 10, 11});
  const std::string plain = limit_fields(l, 11.0);
  CHECK(plain.find(" limit_ms=11.000 efficiency=1.000 compute_ms=8.000") == 0);
  CHECK(plain.find("limit_rounds") == std::string::npos);
  const std::string s = limit_fields(l, 12.5, "bf16_", &iv);
  // limit_ms is the replays' median, efficiency = median / ms_per_step.
  CHECK(s.find(" bf16_limit_ms=10.000 bf16_efficiency=0.800 bf16_compute_ms=8.000") == 0);
  CHECK(s.find(" bf16_limit_rounds=3 bf16_limit_min_ms=9.000 bf16_limit_max_ms=11.000") !=
        std::string::npos);
  CHECK(s.find(" bf16_efficiency_min=0.833 bf16_efficiency_max=1.000 "
               "bf16_efficiency_paired=0.900") != std::string::npos);
  CHECK(s.find(" bf16_step_min_ms=10.000 bf16_step_max_ms=12.000") != std::string::npos);
}
