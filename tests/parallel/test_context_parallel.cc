// Context parallelism (parallel/context_parallel.h): the test spawns `cp_worker` as worlds of 1 to
// 4 on loopback, one scenario per case, and checks what each rank reports. Training through the
// Accelerator at cp 2, cp 4, cp 2 x tp 2 and cp 2 x shard 2:
// tests/accelerate/test_mesh_training.cc.
#include <chrono>
#include <string>

#include <doctest/doctest.h>

#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;

namespace {
std::string worker() { return accel::test::helper_path("cp_worker"); }
}  // namespace

TEST_CASE("cp: ring attention equals attention over the whole sequence, values and gradients") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"ring"}, world, {}, 120s), "ring");
  }
}

TEST_CASE("cp: zig-zag positions, shard and unshard round trips; bad lengths are refused") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"sharding"}, world, {}, 60s), "sharding");
  }
}

TEST_CASE("cp: attention modules in the ring scope; dropout and masks are refused by name") {
  check_ok(run_world(worker(), {"scope"}, 2, {}, 60s), "scope");
}

TEST_CASE("cp: the cp step through ParallelPlan: GPT rows equal one process; misuse refused") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    check_ok(run_world(worker(), {"plan"}, world, {}, 60s), "plan");
  }
}
