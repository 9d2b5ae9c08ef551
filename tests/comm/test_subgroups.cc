// Process subgroups (new_group, ProcessGroup::split; Note [subgroups] in comm/subgroups.cc): the
// test spawns `subgroup_worker` as a world of 4 on loopback and checks what each rank reports.
#include <chrono>
#include <map>
#include <string>

#include <doctest/doctest.h>

#include "comm/process_group.h"
#include "core/error.h"
#include "core/tensor.h"
#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;

namespace {
std::string worker() { return accel::test::helper_path("subgroup_worker"); }
}  // namespace

TEST_CASE("subgroups of a single process: {0}, split, bad ranks") {
  using namespace accel;
  using namespace accel::dist;
  auto world = init_process_group();
  REQUIRE(world->size() == 1);
  CHECK(world->group_name() == "world");
  CHECK_FALSE(world->is_subgroup());
  ProcessGroupPtr g = new_group({0});
  REQUIRE(g != nullptr);
  CHECK(g->group_name() == "world/sub0[0]");
  CHECK(g->world_ranks() == std::vector<int>{0});
  CHECK(g->is_subgroup());
  Tensor t = full({3}, 2.5, TensorOptions(kFloat64));
  g->all_reduce(t);
  CHECK(static_cast<const double*>(t.data_ptr())[1] == 2.5);
  CHECK_THROWS_AS(new_group({1}), ValueError);
  CHECK_THROWS_AS(new_group({0, 0}), ValueError);
  CHECK(new_group({}) != nullptr);  // empty: every rank
  ProcessGroupPtr s = world->split(3, 0);
  REQUIRE(s != nullptr);
  CHECK(s->group_name() == "world/sub4[0]");
  CHECK(world->split(-1, 0) == nullptr);
  g.reset();
  s.reset();
  world.reset();
  destroy_process_group();
}

TEST_CASE("new_group: {0,2} and {1,3}, every collective at once, interleaved with the world") {
  // Shared memory (one host) and TCP: the groups' values, names, ranks, inherited options.
  check_ok(run_world(worker(), {"new_group"}, 4, {{"DIST_EXPECT_SHM", "1"}}, 120s), "new_group");
  check_ok(run_world(worker(), {"new_group"}, 4,
                     {{"ACCEL_DIST_SHM", "0"}, {"DIST_EXPECT_SHM", "0"}}, 120s),
           "new_group");
}

TEST_CASE("split: by rank % 2, by rank / 2 with reversed keys, color < 0, a subgroup's split") {
  check_ok(run_world(worker(), {"split"}, 4, {}, 120s), "split");
}

TEST_CASE("subgroup: a member that never enters a collective is an error naming the group") {
  for (const char* shm : {"1", "0"}) {
    CAPTURE(shm);
    check_ok(run_world(worker(), {"skip"}, 4, {{"ACCEL_DIST_SHM", shm}}, 120s), "skip");
  }
}

TEST_CASE("subgroup: a stopped or killed member is named through the heartbeat") {
  // Collective timeout 60 s, heartbeat 2 s: a stopped member can only be seen by the heartbeat.
  for (const char* how : {"stop", "exit"}) {
    CAPTURE(how);
    const int victim = 3;
    auto res = run_world(worker(), {"fault"}, 4,
                         {{"DIST_TIMEOUT_MS", "60000"},
                          {"ACCEL_HEARTBEAT_TIMEOUT", "2"},
                          {"DIST_VICTIM", std::to_string(victim)},
                          {"DIST_HOW", how}},
                         120s, /*kill_after_survivors=*/true);
    for (int r = 0; r < 4; ++r) {
      if (r == victim) continue;
      INFO("rank " << r << " output:\n" << res[size_t(r)].output);
      CHECK(res[size_t(r)].exited);
      CHECK(res[size_t(r)].code == 0);
      CHECK(res[size_t(r)].output.find("ok fault") != std::string::npos);
    }
  }
}

TEST_CASE("new_group: a rank stopped before the call is named through the world's heartbeat") {
  const int victim = 3;
  auto res = run_world(worker(), {"create_fault"}, 4,
                       {{"DIST_TIMEOUT_MS", "60000"},
                        {"ACCEL_HEARTBEAT_TIMEOUT", "2"},
                        {"DIST_VICTIM", std::to_string(victim)}},
                       120s, /*kill_after_survivors=*/true);
  for (int r = 0; r < victim; ++r) {
    INFO("rank " << r << " output:\n" << res[size_t(r)].output);
    CHECK(res[size_t(r)].exited);
    CHECK(res[size_t(r)].code == 0);
    CHECK(res[size_t(r)].output.find("ok create_fault") != std::string::npos);
  }
}

TEST_CASE("new_group: bad or mismatched rank lists, a rank that never calls: clear errors") {
  check_ok(run_world(worker(), {"bad_lists"}, 4, {}, 120s), "bad_lists");
}

TEST_CASE("subgroups: repeated create and destroy leaves no thread or descriptor behind") {
  check_ok(run_world(worker(), {"cycles"}, 4, {{"DIST_CYCLES", "8"}}, 180s), "cycles");
}

TEST_CASE("subgroups: shared memory inside one host of a two-host world, not across") {
  check_ok(run_world(worker(), {"hosts"}, 4, {{"DIST_HOSTS", "2"}}, 120s), "hosts");
  check_ok(run_world(worker(), {"hosts"}, 4, {{"DIST_HOSTS", "2"}, {"ACCEL_DIST_SHM", "0"}}, 120s),
           "hosts");
}
