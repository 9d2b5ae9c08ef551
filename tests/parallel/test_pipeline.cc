// Pipeline parallelism (parallel/pipeline.h): every schedule simulated for every rank at once
// (each forward and backward of every microbatch and chunk exactly once, a backward after its
// forward, and no order that waits forever: Note [pipeline schedules]); 1F1B's stash bound; then
// `pp_worker` as worlds of 2 and 4 on loopback: training steps equal to one process.
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "core/error.h"
#include "parallel/pipeline.h"
#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::dist::PipelineAction;
using accel::dist::PipelineScheduleKind;
using accel::test::check_ok;
using accel::test::run_world;

namespace {

std::string worker() { return accel::test::helper_path("pp_worker"); }

// Runs every rank's actions with non-blocking sends: a forward past virtual stage 0 waits for the
// activation of the stage before, a backward short of the last stage for the gradient of the stage
// after. Returns the number of actions left when no rank can move (0: the schedule runs), and the
// most microbatches any rank held between a forward and its backward.
struct Simulation {
  int stuck = 0;
  std::vector<int> peak_stash;
};

Simulation simulate(PipelineScheduleKind kind, int p, int m, int v) {
  std::vector<std::vector<PipelineAction>> plan;
  for (int r = 0; r < p; ++r) plan.push_back(accel::dist::pipeline_schedule(kind, p, r, m, v));
  std::set<std::pair<int, int>> fwd_done, bwd_done;  // (virtual stage, microbatch)
  std::vector<size_t> next(size_t(p), 0);
  std::vector<int> stash(size_t(p), 0);
  Simulation sim;
  sim.peak_stash.assign(size_t(p), 0);
  const int last = v * p - 1;
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[size_t(r)] < plan[size_t(r)].size()) {
        const PipelineAction& a = plan[size_t(r)][next[size_t(r)]];
        const int vs = a.chunk * p + r;
        const bool fwd = a.kind == PipelineAction::Kind::Forward;
        const bool ready = fwd ? (vs == 0 || fwd_done.count({vs - 1, a.microbatch}))
                               : (fwd_done.count({vs, a.microbatch}) &&
                                  (vs == last || bwd_done.count({vs + 1, a.microbatch})));
        if (!ready) break;
        (fwd ? fwd_done : bwd_done).insert({vs, a.microbatch});
        stash[size_t(r)] += fwd ? 1 : -1;
        sim.peak_stash[size_t(r)] = std::max(sim.peak_stash[size_t(r)], stash[size_t(r)]);
        ++next[size_t(r)];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) sim.stuck += int(plan[size_t(r)].size() - next[size_t(r)]);
  return sim;
}

}  // namespace

TEST_CASE("pipeline schedules: each action once, backward after forward, no deadlock") {
  for (PipelineScheduleKind kind : {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB,
                                    PipelineScheduleKind::Interleaved1F1B}) {
    for (int p = 1; p <= 4; ++p) {
      for (int v = 1; v <= 3; ++v) {
        if ((kind == PipelineScheduleKind::OneFOneB) != (v == 1) &&
            kind != PipelineScheduleKind::GPipe)
          continue;
        for (int m = 1; m <= 12; ++m) {
          if (kind == PipelineScheduleKind::Interleaved1F1B && m % p != 0) continue;
          CAPTURE(accel::dist::schedule_name(kind));
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          for (int r = 0; r < p; ++r) {
            const auto acts = accel::dist::pipeline_schedule(kind, p, r, m, v);
            REQUIRE(acts.size() == size_t(2 * m * v));
            std::set<std::pair<int, int>> f, b;
            for (const PipelineAction& a : acts) {
              REQUIRE((a.microbatch >= 0 && a.microbatch < m && a.chunk >= 0 && a.chunk < v));
              if (a.kind == PipelineAction::Kind::Forward) {
                CHECK(f.insert({a.microbatch, a.chunk}).second);
              } else {
                CHECK(f.count({a.microbatch, a.chunk}) == 1);  // its forward came first
                CHECK(b.insert({a.microbatch, a.chunk}).second);
              }
            }
          }
          const Simulation sim = simulate(kind, p, m, v);
          CHECK(sim.stuck == 0);
          if (kind == PipelineScheduleKind::OneFOneB) {
            // 1F1B holds at most p - rank microbatches' activations (GPipe holds all m).
            for (int r = 0; r < p; ++r) CHECK(sim.peak_stash[size_t(r)] <= std::min(m, p - r));
          }
        }
      }
    }
  }
  using accel::ValueError;
  CHECK_THROWS_WITH_AS(
      accel::dist::pipeline_schedule(PipelineScheduleKind::Interleaved1F1B, 4, 0, 6, 2),
      doctest::Contains("multiple of the pipeline stages (4)"), ValueError);
  CHECK_THROWS_WITH_AS(
      accel::dist::pipeline_schedule(PipelineScheduleKind::Interleaved1F1B, 2, 0, 4, 1),
      doctest::Contains("at least 2 chunks"), ValueError);
  CHECK_THROWS_WITH_AS(accel::dist::pipeline_schedule(PipelineScheduleKind::OneFOneB, 2, 2, 4),
                       doctest::Contains("rank 2 of 2 stages"), ValueError);
  // 1F1B's documented order at p 4, rank 1, m 5: 2 warm-up forwards, then F/B in turn.
  using K = PipelineAction::Kind;
  const std::vector<PipelineAction> want = {
      {K::Forward, 0, 0},  {K::Forward, 1, 0},  {K::Forward, 2, 0}, {K::Backward, 0, 0},
      {K::Forward, 3, 0},  {K::Backward, 1, 0}, {K::Forward, 4, 0}, {K::Backward, 2, 0},
      {K::Backward, 3, 0}, {K::Backward, 4, 0}};
  CHECK(accel::dist::pipeline_schedule(PipelineScheduleKind::OneFOneB, 4, 1, 5) == want);
}

TEST_CASE("pipeline: GPipe, 1F1B and interleaved 1F1B steps equal one process (float64)") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"train"}, world, {}, 120s), "train");
  }
}

TEST_CASE("pipeline: a GPT cut into stages by its pipeline layers equals one process") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"gpt"}, world, {}, 120s), "gpt");
  }
}

TEST_CASE("pipeline: disagreeing ranks and batches that do not split are errors on every rank") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"errors"}, world, {}, 120s), "errors");
  }
}
