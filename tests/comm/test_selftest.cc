// accel-selftest, the program `accel-run test` runs: passes in one process and in three.
#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

#include "tests/common/spawn.h"

using namespace std::chrono_literals;

namespace {
std::string selftest() {
  if (const char* p = std::getenv("ACCEL_SELFTEST")) return p;
  return accel::test::helper_path("../../comm/tools/accel-selftest");
}
}  // namespace

TEST_CASE("accel-selftest passes for world sizes 1 and 3") {
  for (int world : {1, 3}) {
    CAPTURE(world);
    auto res = accel::test::run_world(selftest(), {"--mib", "1"}, world, {}, 90s);
    for (size_t r = 0; r < res.size(); ++r) {
      INFO("rank " << r << ":\n" << res[r].output);
      CHECK(res[r].exited);
      CHECK(res[r].code == 0);
    }
    CHECK(res[0].output.find("PASS") != std::string::npos);
    CHECK(res[0].output.find("ok    all_reduce sum float32") != std::string::npos);
    CHECK(res[0].output.find("FAIL") == std::string::npos);
  }
}

TEST_CASE("accel-selftest exits non-zero when the group cannot form") {
  // Two ranks announced, only rank 0 started: the rendezvous times out with a clear message.
  auto res = accel::test::run_world(selftest(), {"--timeout-ms", "1500"}, 1,
                                    {{"RANK", "0"},
                                     {"WORLD_SIZE", "2"},
                                     {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(accel::test::free_port())}},
                                    30s);
  INFO(res[0].output);
  CHECK(res[0].exited);
  CHECK(res[0].code == 2);
  CHECK(res[0].output.find("cannot form the process group") != std::string::npos);
}
