// Tensor and sequence parallel (parallel/tensor_parallel.h): the test spawns `tp_worker` as a
// world of 4 on loopback, one scenario per case, and checks what each rank reports.
#include <chrono>
#include <string>

#include <doctest/doctest.h>

#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;

namespace {
std::string worker() { return accel::test::helper_path("tp_worker"); }
}  // namespace

TEST_CASE("tp: differentiable collectives over 4, over pairs, over one rank, uneven pieces") {
  check_ok(run_world(worker(), {"collectives"}, 4, {}, 120s), "collectives");
}

TEST_CASE("tp: vocab-parallel cross-entropy equals cross_entropy of the full logits") {
  check_ok(run_world(worker(), {"loss"}, 4, {}, 120s), "loss");
}

TEST_CASE("tp: bad plans and require_even sizes are clear errors; uneven sizes are cut") {
  check_ok(run_world(worker(), {"errors"}, 4, {}, 120s), "errors");
}

TEST_CASE("tp: GPT trained 20 steps at tp 2 x dp 2, tp 4, with sequence parallel = 1 process") {
  check_ok(run_world(worker(), {"train"}, 4, {}, 240s), "train");
}

TEST_CASE("tp: FSDP over dp 2 of a tp 2 GPT (with and without sequence parallel) = 1 process") {
  check_ok(run_world(worker(), {"fsdp2d"}, 4, {}, 240s), "fsdp2d");
}

// Note [dropout under tensor parallelism] (tp_dropout.cc).
TEST_CASE("tp: dropout masks are this rank's slice of one process's; bad layouts raise") {
  check_ok(run_world(worker(), {"dropout"}, 4, {}, 120s), "dropout");
}

TEST_CASE("tp: GPT with dropout at tp 4 / tp 2 (+SP) = 1 process; tp x dp keeps replicas equal") {
  check_ok(run_world(worker(), {"train_dropout"}, 4, {}, 240s), "train_dropout");
}

TEST_CASE("tp: resuming a tp 2 x dp 2 + SP run with dropout is bit-exact") {
  check_ok(run_world(worker(), {"resume_dropout"}, 4, {}, 120s), "resume_dropout");
}
