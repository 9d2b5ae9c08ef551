// Multi-process (Gloo, loopback) tests of the Accelerator: the test spawns accel_worker once per
// rank under the env contract and compares what the ranks print.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/dist/spawn.h"

using namespace std::chrono_literals;
using accel::test::RankResult;
using accel::test::run_world;
namespace fs = std::filesystem;

namespace {

std::string worker() { return accel::test::helper_path("accel_worker"); }

void check_ok(const std::vector<RankResult>& res, const std::string& scenario) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    CHECK(res[r].exited);
    CHECK(res[r].code == 0);
    CHECK(res[r].output.find("ok " + scenario) != std::string::npos);
  }
}

std::vector<std::string> lines_with(const std::string& out, const std::string& prefix) {
  std::vector<std::string> v;
  std::istringstream is(out);
  for (std::string l; std::getline(is, l);)
    if (l.rfind(prefix, 0) == 0) v.push_back(l);
  return v;
}

std::string fresh_dir(const std::string& tag) {
  std::string d = "/tmp/accel-acc-dist-" + std::to_string(getpid()) + "-" + tag;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("multi-process facade: gather, gather_for_metrics, reduce, broadcast, pad") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    auto res = run_world(worker(), {"facade"}, world, {}, 60s);
    check_ok(res, "facade");
    // print() only on the main process.
    CHECK(res[0].output.find("printed once") != std::string::npos);
    for (int r = 1; r < world; ++r) CHECK(res[size_t(r)].output.find("printed once") == std::string::npos);
  }
}

TEST_CASE("data parallel with accumulation: 2 ranks x batch 4 equal 1 process x batch 8") {
  auto one = run_world(worker(), {"ddp", "8"}, 1, {}, 60s);
  check_ok(one, "ddp");
  auto two = run_world(worker(), {"ddp", "4"}, 2, {}, 60s);
  check_ok(two, "ddp");
  auto ref = lines_with(one[0].output, "param ");
  REQUIRE(ref.size() > 10);
  for (int r = 0; r < 2; ++r) {
    auto got = lines_with(two[size_t(r)].output, "param ");
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      double a = std::stod(ref[i].substr(6)), b = std::stod(got[i].substr(6));
      CHECK(b == doctest::Approx(a).epsilon(1e-5));
    }
  }
}

TEST_CASE("DDP through the facade: 2 ranks x batch 8 match 1 process x batch 16 (AdamW, clipping)") {
  auto one = run_world(worker(), {"ddp_mlp", "16"}, 1, {}, 60s);
  check_ok(one, "ddp_mlp");
  auto two = run_world(worker(), {"ddp_mlp", "8"}, 2, {}, 60s);
  check_ok(two, "ddp_mlp");
  for (const char* what : {"norm ", "param "}) {
    CAPTURE(what);
    auto ref = lines_with(one[0].output, what);
    REQUIRE(ref.size() >= 4);
    for (int r = 0; r < 2; ++r) {
      auto got = lines_with(two[size_t(r)].output, what);
      REQUIRE(got.size() == ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const size_t n = std::string(what).size();
        double a = std::stod(ref[i].substr(n)), b = std::stod(got[i].substr(n));
        CHECK(b == doctest::Approx(a).epsilon(1e-5));
      }
    }
  }
  // Several buckets per model (the 512-byte cap), reported by rank 0.
  CHECK(lines_with(two[0].output, "buckets ").size() == 1);
}

TEST_CASE("save, kill during save, resume: previous checkpoint loads, losses bit-identical") {
  const std::map<std::string, std::string> env = {{"DIST_TIMEOUT_MS", "3000"}};
  const std::string base = fresh_dir("base");
  auto full = run_world(worker(), {"train", base, "12", "4", "0"}, 2, env, 90s);
  check_ok(full, "train");
  struct Case {
    const char* stage;
    int rank;
  };
  for (Case c : {Case{"rank_files", 1}, Case{"commit", 0}}) {
    CAPTURE(c.stage);
    const std::string dir = fresh_dir(std::string("crash-") + c.stage);
    // Dies in the second save (after 8 steps): rank `c.rank` is killed at stage `c.stage`.
    auto crashed = run_world(worker(), {"train", dir, "12", "4", "0", c.stage, std::to_string(c.rank)},
                             2, env, 60s, /*kill_after_survivors=*/true);
    {
      INFO("victim output:\n" << crashed[size_t(c.rank)].output);
      CHECK(crashed[size_t(c.rank)].code == -SIGKILL);
    }
    CHECK(crashed[size_t(1 - c.rank)].code != 0);  // the survivor notices, not hangs
    CHECK(fs::exists(dir + "/checkpoints/checkpoint_0/state.json"));
    auto resumed = run_world(worker(), {"train", dir, "12", "4", "1"}, 2, env, 90s);
    check_ok(resumed, "train");
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << " resumed output:\n" << resumed[size_t(r)].output);
      CHECK(resumed[size_t(r)].output.find("checkpoint_0 step 4") != std::string::npos);
      auto want = lines_with(full[size_t(r)].output, "loss ");
      auto got = lines_with(resumed[size_t(r)].output, "loss ");
      REQUIRE(want.size() == 12);
      REQUIRE(got.size() == 8);
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[4 + i]);
    }
  }
}
