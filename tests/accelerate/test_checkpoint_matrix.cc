// The cross-mesh checkpoint matrix (issue 37's check; docs/checkpointing.md): a checkpoint saved
// mid-epoch with a prepared, shuffled DataLoader on any of 13 meshes (1 process, dp 4, shard 4,
// HSDP 2 x 2, tp 2 x dp 2, tp 2 x shard 2, tp 4 + sequence parallel, tp 2 x ZeRO-1, tp 2 x
// ZeRO-2, cp 2 x shard 2, cp 2 x tp 2, pp 2 x shard 2, pp 2 x tp 2) continues on every one of
// them exactly as the uninterrupted 1-process run does: losses within 1e-12, final weights within
// 1e-10, in float64 (small GPT, AdamW with weight decay, clipping 0.5, global batch 8 over 64
// sequences at every dp size, 12 steps crossing into epoch 1).
// 26 launches of tests/accelerate/mesh_worker: 13 save runs (steps 0-4, save after step 4), then
// 13 "loadall" runs, each loading the 13 checkpoints in turn and training steps 5-11 after each.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/common/spawn.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;

namespace {

constexpr int kSteps = 12, kSaveAt = 5;
constexpr double kLossTolerance = 1e-12, kWeightTolerance = 1e-10;

std::string worker() { return accel::test::helper_path("mesh_worker"); }

std::string scratch() {
  static const accel::test::TempDir s("ckpt-matrix");
  return s.str();
}

struct Run {
  std::map<int, double> losses;
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
      r.losses[s] = v;
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

using Env = std::map<std::string, std::string>;
struct Mesh {
  const char* tag;
  int world;
  Env env;
  std::vector<std::string> extra;  // worker arguments
};

const std::vector<Mesh>& meshes() {
  static const std::vector<Mesh> m = {
      {"one", 1, {}, {}},
      {"dp4", 4, {{"ACCEL_DP_REPLICATE_SIZE", "4"}}, {}},
      {"shard4", 4, {{"ACCEL_ZERO_STAGE", "3"}}, {}},
      {"hsdp2x2", 4, {{"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, {}},
      {"tp2dp2", 4, {{"ACCEL_TP_SIZE", "2"}}, {}},
      {"tp2shard2", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, {}},
      {"tp4sp", 4, {{"ACCEL_TP_SIZE", "4"}}, {"sp"}},
      // Every engine composes with tp (Note [apply order] in parallel/parallelize.h).
      {"tp2zero1", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "1"}}, {}},
      {"tp2zero2", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}}, {}},
      // Context parallelism: ZeRO-3 over dp_shard x cp, and cp x tp (parallel/context_parallel.h).
      {"cp2shard2", 4, {{"ACCEL_CP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, {}},
      {"cp2tp2", 4, {{"ACCEL_CP_SIZE", "2"}, {"ACCEL_TP_SIZE", "2"}}, {}},
      // Pipeline parallelism: each stage writes its layers (Note [pp step]), ZeRO-3 over each
      // stage's dp_shard; and pp x tp with two microbatches per step.
      {"pp2shard2", 4, {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, {}},
      {"pp2tp2",
       4,
       {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_TP_SIZE", "2"}},
       {"pipeline", "1f1b", "2", "1"}},
  };
  return m;
}

Run launch(const Mesh& mesh, const std::string& out, int steps, std::vector<std::string> extra) {
  std::vector<std::string> args = {out, std::to_string(steps), "loader"};
  args.insert(args.end(), mesh.extra.begin(), mesh.extra.end());
  args.insert(args.end(), extra.begin(), extra.end());
  auto res = run_world(worker(), args, mesh.world, mesh.env, 240s);
  check_ok(res, "mesh_train");
  return {};
}

// Losses of the steps `got` ran (absolute difference) and, when `weights`, every final weight.
void expect_like(const Run& ref, const Run& got, int first, bool weights, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.losses.size() == size_t(kSteps - first));
  double worst = 0;
  for (const auto& [s, v] : got.losses) {
    REQUIRE(ref.losses.count(s));
    worst = std::max(worst, std::abs(ref.losses.at(s) - v));
  }
  CHECK_MESSAGE(worst <= kLossTolerance, what, ": losses differ by ", worst);
  if (!weights) return;
  REQUIRE(ref.params.size() == got.params.size());
  double wworst = 0;
  for (const auto& [name, a] : ref.params) {
    const auto it = got.params.find(name);
    REQUIRE_MESSAGE(it != got.params.end(), name);
    REQUIRE(it->second.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) wworst = std::max(wworst, std::abs(a[i] - it->second[i]));
  }
  CHECK_MESSAGE(wworst <= kWeightTolerance, what, ": weights differ by ", wworst);
}

}  // namespace

TEST_CASE("a checkpoint saved mid-epoch on any mesh continues on every mesh as one process does") {
  const std::string dir = scratch();
  launch(meshes()[0], dir + "/ref.txt", kSteps, {});
  const Run ref = read_run(dir + "/ref.txt");
  REQUIRE(ref.losses.size() == size_t(kSteps));

  std::string all;
  for (const Mesh& m : meshes()) {
    const std::string ckpt = dir + "/ckpt-" + m.tag;
    launch(m, dir + "/save-" + m.tag + ".txt", kSaveAt, {"save", std::to_string(kSaveAt), ckpt});
    const Run saved = read_run(dir + "/save-" + m.tag + ".txt");
    REQUIRE(saved.losses.size() == size_t(kSaveAt));
    for (const auto& [s, v] : saved.losses)
      CHECK_MESSAGE(std::abs(ref.losses.at(s) - v) <= kLossTolerance, m.tag, " step ", s);
    all += (all.empty() ? "" : ",") + std::string(m.tag) + "=" + ckpt;
  }
  for (const Mesh& to : meshes()) {
    launch(to, dir + "/load-" + to.tag, kSteps, {"loadall", all});
    for (const Mesh& from : meshes())
      expect_like(ref, read_run(dir + "/load-" + to.tag + "." + from.tag), kSaveAt, true,
                  std::string(from.tag) + " -> " + to.tag);
  }
}
