// Training on device meshes through the Accelerator (issue 27's check): a small GPT trained 20
// AdamW steps in float64 (weight decay, clipping) on every mesh of 4 processes equals the 1-process
// run, losses and final weights within 1e-10; a checkpoint saved on one mesh continues on another.
// The ranks are tests/accelerator/mesh_worker, spawned under the env contract.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/dist/spawn.h"
#include "tests/dist/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::RankResult;
using accel::test::run_world;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;
constexpr double kTolerance = 1e-10;

std::string worker() { return accel::test::helper_path("mesh_worker"); }

std::string scratch() {
  static const std::string d = [] {
    std::string p = "/tmp/accel-mesh-training-" + std::to_string(getpid());
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

struct Run {
  std::vector<std::pair<int, double>> losses;
  std::map<std::string, std::vector<double>> params;
};

Run read_run(const std::string& path) {
  Run r;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "no output ", path);
  std::string word;
  while (in >> word) {
    if (word == "loss") {
      int s = 0;
      double v = 0;
      in >> s >> v;
      r.losses.emplace_back(s, v);
    } else if (word == "param") {
      std::string name;
      int64_t n = 0;
      in >> name >> n;
      std::vector<double>& v = r.params[name];
      v.resize(size_t(n));
      for (double& x : v) in >> x;
    } else {
      FAIL("unexpected word '", word, "' in ", path);
    }
  }
  return r;
}

// The largest |a - b| / max(1, |a|) over the losses (of the steps both ran) and every parameter.
double max_difference(const Run& ref, const Run& got, int first_step) {
  double worst = 0;
  auto cmp = [&](double a, double b) {
    worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
  };
  REQUIRE(got.losses.size() == size_t(kSteps - first_step));
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const auto& [s, v] = got.losses[i];
    REQUIRE(s == first_step + int(i));
    cmp(ref.losses[size_t(s)].second, v);
  }
  REQUIRE(ref.params.size() == got.params.size());
  for (const auto& [name, a] : ref.params) {
    CAPTURE(name);
    const auto it = got.params.find(name);
    REQUIRE(it != got.params.end());
    REQUIRE(it->second.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) cmp(a[i], it->second[i]);
  }
  return worst;
}

using Env = std::map<std::string, std::string>;

Run train(const std::string& tag, int world, const Env& env, std::vector<std::string> extra = {}) {
  const std::string out = scratch() + "/" + tag + ".txt";
  std::vector<std::string> args = {out, std::to_string(kSteps)};
  args.insert(args.end(), extra.begin(), extra.end());
  auto res = run_world(worker(), args, world, env, 180s);
  check_ok(res, "mesh_train");
  return read_run(out);
}

const Run& reference() {
  static const Run r = train("one", 1, {});
  return r;
}

struct Mesh {
  const char* name;
  Env env;
};

// Every mesh of 4 processes with the strategy it runs.
const std::vector<Mesh>& meshes() {
  static const std::vector<Mesh> m = {
      {"dp 4 (DDP)", {{"ACCEL_DP_REPLICATE_SIZE", "4"}}},
      {"shard 4 (ZeRO-3)", {{"ACCEL_ZERO_STAGE", "3"}}},
      {"shard 4 (ZeRO-2)", {{"ACCEL_ZERO_STAGE", "2"}}},
  };
  return m;
}

}  // namespace

TEST_CASE(
    "every mesh of 4 processes trains a GPT exactly as one process (float64, 20 AdamW steps)") {
  const Run& ref = reference();
  REQUIRE(ref.losses.size() == size_t(kSteps));
  // The run must learn something, or equal losses would prove little.
  CHECK(ref.losses.back().second < ref.losses.front().second);
  for (const Mesh& mesh : meshes()) {
    const std::string name = mesh.name;
    CAPTURE(name);
    const Run got =
        train(std::string("mesh-") + std::to_string(&mesh - meshes().data()), 4, mesh.env);
    const double d = max_difference(ref, got, 0);
    MESSAGE(name, ": max relative difference ", d);
    CHECK(d <= kTolerance);
  }
}

// save_state on one mesh after 10 steps, load_state on another, 10 more steps: the same losses and
// final weights as one process trained 20 steps straight (the state re-shards on load).
TEST_CASE("a checkpoint saved on one mesh continues on another") {
  const Run& ref = reference();
  struct Hop {
    const char* name;
    int save_world;
    Env save_env;
    int load_world;
    Env load_env;
  };
  const std::vector<Hop> hops = {
      {"shard 4 (ZeRO-3) -> 1 process", 4, {{"ACCEL_ZERO_STAGE", "3"}}, 1, {}},
      {"1 process -> shard 4 (ZeRO-3)", 1, {}, 4, {{"ACCEL_ZERO_STAGE", "3"}}},
  };
  for (const Hop& h : hops) {
    const std::string name = h.name;
    CAPTURE(name);
    const std::string tag = "hop-" + std::to_string(&h - hops.data());
    const std::string dir = scratch() + "/" + tag + "-ckpt";
    const Run saved = train(tag + "-save", h.save_world, h.save_env, {"save", "10", dir});
    CHECK(max_difference(ref, saved, 0) <= kTolerance);
    const Run loaded = train(tag + "-load", h.load_world, h.load_env, {"load", dir});
    const double d = max_difference(ref, loaded, 10);
    MESSAGE(name, ": max relative difference ", d);
    CHECK(d <= kTolerance);
  }
}
