// Training on device meshes through the Accelerator (issue 27's check): a small GPT trained 20
// AdamW steps in float64 (weight decay, clipping) on every mesh of 4 processes equals the 1-process
// run, losses and final weights within 1e-10; a checkpoint saved on one mesh continues on another.
// The ranks are tests/accelerate/mesh_worker, spawned under the env contract.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "core/tensor.h"
#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"
#include "tests/common/scoped_env.h"
#include "tests/common/util.h"

using namespace std::chrono_literals;
using namespace std::string_literals;
using accel::test::check_ok;
using accel::test::RankResult;
using accel::test::run_world;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;
constexpr double kTolerance = 1e-10;

std::string worker() { return accel::test::helper_path("mesh_worker"); }

// The test's folder, removed when the test program ends.
std::string scratch() {
  static const accel::test::TempDir s("mesh-training");
  return s.str();
}

struct Run {
  std::vector<std::pair<int, double>> losses;
  std::map<std::string, std::vector<double>> params;
  double peak = -1, model_bytes = 0;  // "deferred": the allocator's peak during prepare
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
    } else if (word == "peak") {
      in >> r.peak >> r.model_bytes;
    } else {
      FAIL("unexpected word '", word, "' in ", path);
    }
  }
  return r;
}

// The largest |a - b| / max(1, |a|) over the losses (of the steps both ran) and every parameter;
// `got` trained from first_step to `steps`.
double max_difference(const Run& ref, const Run& got, int first_step, int steps = kSteps) {
  double worst = 0;
  auto cmp = [&](double a, double b) {
    worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
  };
  REQUIRE(got.losses.size() == size_t(steps - first_step));
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

// The largest |a - b| / max(1, |a|) over the losses alone.
double max_loss_difference(const Run& ref, const Run& got) {
  double worst = 0;
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const double a = ref.losses[i].second, b = got.losses[i].second;
    worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
  }
  return worst;
}

using Env = std::map<std::string, std::string>;

Run train(const std::string& tag, int world, const Env& env, std::vector<std::string> extra = {},
          int steps = kSteps) {
  const std::string out = scratch() + "/" + tag + ".txt";
  std::vector<std::string> args = {out, std::to_string(steps)};
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
      {"replicate 2 x shard 2 (ZeRO-3, HSDP)",
       {{"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"tp 2 x dp 2 (DDP)", {{"ACCEL_TP_SIZE", "2"}}},
      {"tp 2 x shard 2 (ZeRO-3)", {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"tp 4", {{"ACCEL_TP_SIZE", "4"}}},
      // Every engine composes with tp (Note [apply order] in parallel/parallelize.h): ZeRO's bucket
      // shards mix tp-cut and tp-replicated parameters (Note [composed gradient norms]).
      {"tp 2 x shard 2 (ZeRO-1)", {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "1"}}},
      {"tp 2 x shard 2 (ZeRO-2)", {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}}},
  };
  return m;
}

// Trains each of `cases` on 4 processes (worker arguments `extra`) and checks it against the
// 1-process run: losses and final weights within kTolerance.
void expect_equal_to_one_process(const std::vector<Mesh>& cases, const std::string& tag,
                                 const std::vector<std::string>& extra = {}) {
  const Run& ref = reference();
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i].name;
    CAPTURE(name);
    const Run got = train(tag + "-" + std::to_string(i), 4, cases[i].env, extra);
    const double d = max_difference(ref, got, 0);
    MESSAGE(name, ": max relative difference ", d);
    CHECK(d <= kTolerance);
  }
}

}  // namespace

TEST_CASE(
    "every mesh of 4 processes trains a GPT exactly as one process (float64, 20 AdamW steps)") {
  const Run& ref = reference();
  REQUIRE(ref.losses.size() == size_t(kSteps));
  // The run must learn something, or equal losses would prove little.
  CHECK(ref.losses.back().second < ref.losses.front().second);
  expect_equal_to_one_process(meshes(), "mesh");
}

// ACCEL_VERIFY_PLACEMENTS=1: the tp-replicated gradients are compared over tp at every step
// (Note [replicated gradient check]); a correct plan passes all 20.
TEST_CASE("sequence parallel through prepare(): tp 2 x shard 2 and tp 4 equal one process") {
  const std::vector<Mesh> sp = {
      {"tp 2 x shard 2 (ZeRO-3) + sequence parallel",
       {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}, {"ACCEL_VERIFY_PLACEMENTS", "1"}}},
      {"tp 4 + sequence parallel", {{"ACCEL_TP_SIZE", "4"}, {"ACCEL_VERIFY_PLACEMENTS", "1"}}},
  };
  expect_equal_to_one_process(sp, "sp", {"sp"});
}

// Note [replicated gradient check]: an SP plan that styles ln_f replicate() (its input is this
// rank's chunk of the sequence, so its gradient is a partial sum) trains with plausible losses
// while the copies of ln_f drift apart; the first step is refused on every rank, naming the
// parameters and the dimension. Under DDP and under ZeRO-3 (tp peers compare their shards).
TEST_CASE(
    "tp: a replicated parameter whose gradients differ over tp is refused at the first step") {
  for (const Env& env :
       {Env{{"ACCEL_TP_SIZE", "2"}}, Env{{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}}) {
    CAPTURE(env.size());
    auto res = run_world(
        worker(), {scratch() + "/replicated-ln_f.txt", "3", "sp", "ln_f-replicate"}, 4, env, 120s);
    for (const RankResult& r : res) {
      CHECK(r.exited);
      CHECK(r.code == 3);
      for (const char* want : {"[check_replicated_grads]", "replicated over tp", "'ln_f.weight'",
                               "'ln_f.bias'", "sequence()"})
        CHECK_MESSAGE(r.output.find(want) != std::string::npos, want, " in: ", r.output);
    }
  }
}

// Gradient accumulation (2 micro-batches per optimizer step, on the same rows) and ZeRO-3's
// per-unit activation checkpointing on the 2-D mesh and under DDP x tp: the same steps.
TEST_CASE("tp meshes with gradient accumulation and activation checkpointing equal one process") {
  const std::vector<Mesh> cases = {
      {"tp 2 x shard 2 (ZeRO-3), accumulation 2, activation checkpointing",
       {{"ACCEL_TP_SIZE", "2"},
        {"ACCEL_ZERO_STAGE", "3"},
        {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"},
        {"ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "true"}}},
      {"tp 2 x dp 2 (DDP), accumulation 2",
       {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}},
  };
  expect_equal_to_one_process(cases, "accum");
}

// Context parallelism (parallel/context_parallel.h): each rank of a cp group holds two zig-zag
// chunks of every sequence, attention runs as ring attention over the group, the position
// embedding takes global positions, and the engine reduces over dp x cp. With accumulation and
// clipping, under DDP, ZeRO-2, ZeRO-3 and tp (+ sequence parallel): the same steps as one process.
TEST_CASE("context parallel: cp 2, cp 4, cp 2 x tp 2, cp 2 x shard 2 equal one process") {
  const std::vector<Mesh> cases = {
      {"cp 2 x dp 2 (DDP)", {{"ACCEL_CP_SIZE", "2"}}},
      {"cp 4", {{"ACCEL_CP_SIZE", "4"}}},
      {"cp 2 x tp 2 (DDP inside: dp 1)", {{"ACCEL_CP_SIZE", "2"}, {"ACCEL_TP_SIZE", "2"}}},
      {"cp 2 x shard 2 (ZeRO-3), accumulation 2, activation checkpointing",
       {{"ACCEL_CP_SIZE", "2"},
        {"ACCEL_ZERO_STAGE", "3"},
        {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"},
        {"ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "true"}}},
      {"cp 2 x shard 2 (ZeRO-2)", {{"ACCEL_CP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}}},
  };
  expect_equal_to_one_process(cases, "cp");
  const std::vector<Mesh> sp = {
      {"cp 2 x tp 2 + sequence parallel",
       {{"ACCEL_CP_SIZE", "2"}, {"ACCEL_TP_SIZE", "2"}, {"ACCEL_VERIFY_PLACEMENTS", "1"}}},
  };
  expect_equal_to_one_process(sp, "cp-sp", {"sp"});
}

// Pipeline parallelism (Note [pp step] in parallel/pp_step.cc): each pp rank keeps its stage of
// the GPT's layers (embed, blocks.0, blocks.1, head), Accelerator::forward_backward runs the
// microbatches through the stages under each schedule, the engine syncs once per optimizer step,
// clipping sums the stages' norms. With accumulation: the same steps as one process.
TEST_CASE(
    "pipeline parallel: pp 2, pp 4, pp 2 x shard 2, pp 2 x tp 2, pp 2 x cp 2 equal one process") {
  const std::vector<std::pair<Mesh, std::vector<std::string>>> cases = {
      {{"pp 2 x dp 2 (DDP), 1F1B, 2 microbatches", {{"ACCEL_PP_SIZE", "2"}}},
       {"pipeline", "1f1b", "2", "1"}},
      {{"pp 4, GPipe, 4 microbatches, accumulation 2",
        {{"ACCEL_PP_SIZE", "4"}, {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}},
       {"pipeline", "gpipe", "4", "1"}},
      {{"pp 2 x shard 2 (ZeRO-2), 1F1B, accumulation 2",
        {{"ACCEL_PP_SIZE", "2"},
         {"ACCEL_ZERO_STAGE", "2"},
         {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}},
       {"pipeline", "1f1b", "2", "1"}},
      {{"pp 2 x dp 2 (DDP), interleaved 1F1B (2 chunks per rank), accumulation 2",
        {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}},
       {"pipeline", "interleaved", "2", "2"}},
      {{"pp 2 x shard 2 (ZeRO-3), 1F1B", {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
       {"pipeline", "1f1b", "4", "1"}},
      {{"pp 2 x shard 2 (ZeRO-1), GPipe", {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "1"}}},
       {"pipeline", "gpipe", "2", "1"}},
      {{"pp 2 x replicate 2 (ZeRO-3, HSDP), 1F1B",
        {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
       {"pipeline", "1f1b", "2", "1"}},
      {{"pp 2 x tp 2, 1F1B, split at blocks.1", {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_TP_SIZE", "2"}}},
       {"pipeline", "1f1b", "4", "1", "split", "blocks.1"}},
      {{"pp 2 x cp 2, 1F1B, accumulation 2",
        {{"ACCEL_PP_SIZE", "2"},
         {"ACCEL_CP_SIZE", "2"},
         {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}},
       {"pipeline", "1f1b", "2", "1"}},
  };
  for (size_t i = 0; i < cases.size(); ++i)
    expect_equal_to_one_process({cases[i].first}, "pp" + std::to_string(i), cases[i].second);
}

// A prepared loader hands each cp rank its tokens of the inputs and of the targets.
TEST_CASE("context parallel: a prepared loader cuts inputs and targets along the sequence") {
  const Run one = train("cp-loader-one", 1, {}, {"loader"});
  const Run got = train("cp-loader", 4, {{"ACCEL_CP_SIZE", "2"}}, {"loader"});
  const double d = max_difference(one, got, 0);
  MESSAGE("cp 2 x dp 2 through the loader: max relative difference ", d);
  CHECK(d <= kTolerance);
}

// Misuse is a clear error on every rank: no plan, a sequence that does not split into 2 x cp
// chunks.
TEST_CASE("context parallel: an empty cp_plan and an indivisible sequence are refused") {
  auto expect = [](const std::vector<accel::test::RankResult>& res,
                   std::vector<std::string> wants) {
    for (const RankResult& r : res) {
      CHECK(r.exited);
      CHECK(r.code == 3);
      for (const std::string& want : wants)
        CHECK_MESSAGE(r.output.find(want) != std::string::npos, want, " in: ", r.output);
    }
  };
  expect(run_world(worker(), {scratch() + "/cp-noplan.txt", "2", "no-cp-plan"}, 2,
                   {{"ACCEL_CP_SIZE", "2"}}, 120s),
         {"cp_size 2", "AcceleratorConfig::cp_plan is empty", "gpt_cp_plan"});
  expect(run_world(worker(), {scratch() + "/cp-3.txt", "2", "loader"}, 3, {{"ACCEL_CP_SIZE", "3"}},
                   120s),
         {"[DataLoader]", "cp_size 3", "not divisible by 2 x cp_size = 6"});
}

// Pipeline misuse is a clear error on every rank: a split naming no layer (at prepare), a batch
// that does not split into the microbatches (the first stage reads it; the others are told), an
// engine that reduces every backward under interleaved 1F1B, pp sizes that do not fit the world.
TEST_CASE(
    "pipeline parallel: a bad split, microbatches, engine or size are refused on every rank") {
  auto expect = [](const std::vector<accel::test::RankResult>& res,
                   const std::vector<std::vector<std::string>>& per_rank) {
    REQUIRE(res.size() == per_rank.size());
    for (size_t r = 0; r < res.size(); ++r) {
      CAPTURE(r);
      CHECK(res[r].exited);
      CHECK(res[r].code == 3);
      for (const std::string& want : per_rank[r])
        CHECK_MESSAGE(res[r].output.find(want) != std::string::npos, want, " in: ", res[r].output);
    }
  };
  const Env pp2 = {{"ACCEL_PP_SIZE", "2"}};
  const std::vector<std::string> no_layer = {"[prepare] pp_size 2, AcceleratorConfig::pipeline",
                                             "split point 'blocks.7' names no layer"};
  expect(run_world(worker(), {scratch() + "/pp-split.txt", "2", "split", "blocks.7"}, 2, pp2, 120s),
         {no_layer, no_layer});
  // 8 rows per step at dp 1 do not split into 3 microbatches.
  expect(run_world(worker(), {scratch() + "/pp-mb.txt", "2", "pipeline", "1f1b", "3", "1"}, 2, pp2,
                   120s),
         {{"[pipeline_step]", "inputs of shape (8, 16) does not split into 3 microbatches"},
          {"[pipeline_step]", "targets of shape (8, 16) does not split into 3 microbatches"}});
  const std::vector<std::string> engine = {"[forward_backward]", "strategy 'zero2'",
                                           "chunks = 1 (GPipe or 1F1B)"};
  expect(run_world(worker(), {scratch() + "/pp-zero.txt", "2", "pipeline", "interleaved", "2", "2"},
                   4, {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}}, 120s),
         {engine, engine, engine, engine});
  const std::vector<std::string> size = {"pp_size 3", "world size 4"};
  expect(run_world(worker(), {scratch() + "/pp-3.txt", "2"}, 4, {{"ACCEL_PP_SIZE", "3"}}, 120s),
         {size, size, size, size});
}

// Mixed precision on the 2-D mesh: bf16 compute parameters with float32 master shards and
// float32 gradient reduction (ZeRO-3's param_dtype / reduce_dtype), a float32 model: every loss
// within 0.05 of the float64 run's, and as close as one process under the same settings.
TEST_CASE("tp 2 x shard 2 with bf16 parameters and fp32 reduction tracks one process") {
  const Run& ref = reference();
  const Env bf16 = {
      {"ACCEL_ZERO_STAGE", "3"}, {"ACCEL_PARAM_DTYPE", "bf16"}, {"ACCEL_REDUCE_DTYPE", "fp32"}};
  Env tp = bf16;
  tp["ACCEL_TP_SIZE"] = "2";
  const Run one = train("bf16-one", 1, bf16, {"f32"});
  const Run got = train("bf16-tp", 4, tp, {"f32"});
  REQUIRE(got.losses.size() == ref.losses.size());
  REQUIRE(one.losses.size() == ref.losses.size());
  double worst = 0, worst_one = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    worst = std::max(worst, std::abs(got.losses[i].second - ref.losses[i].second));
    worst_one = std::max(worst_one, std::abs(one.losses[i].second - ref.losses[i].second));
  }
  MESSAGE("bf16 tp 2 x shard 2: max loss difference ", worst, " (one process: ", worst_one, ")");
  CHECK(worst <= 0.05);
  CHECK(worst <= 2 * worst_one + 0.01);
}

// Autocast through forward_backward: the stages' forwards run in the caller's acc.autocast()
// scope (bf16 GEMMs), their backwards outside it. A float32 GPT at pp 2 under bf16 autocast tracks
// one process under the same autocast, whose losses differ from float64's (autocast is live).
TEST_CASE("pipeline parallel under bf16 and fp16 autocast tracks one process under it") {
  const Run& ref = reference();
  for (const char* dtype : {"bf16", "fp16"}) {
    CAPTURE(dtype);
    // fp16: the GradScaler scales each microbatch's loss before its backward and unscales (and
    // checks for inf) over the world's gradients, every stage's.
    const Env amp = {{"ACCEL_MIXED_PRECISION", dtype}};
    Env pp = amp;
    pp["ACCEL_PP_SIZE"] = "2";
    const std::string tag = std::string("pp-amp-") + dtype;
    const Run one = train(tag + "-one", 1, amp, {"f32", "autocast"});
    const Run got = train(tag, 4, pp, {"f32", "autocast", "pipeline", "1f1b", "2", "1"});
    REQUIRE(got.losses.size() == ref.losses.size());
    REQUIRE(one.losses.size() == ref.losses.size());
    double worst = 0, live = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      worst = std::max(worst, std::abs(got.losses[i].second - one.losses[i].second));
      live = std::max(live, std::abs(one.losses[i].second - ref.losses[i].second));
    }
    MESSAGE(std::string(dtype), " autocast, pp 2 x dp 2 against one process: max loss difference ",
            worst, " (one process against float64: ", live, ")");
    CHECK(live > 1e-5);
    // Closer to one process under autocast than a float32 run is (bf16: 3.4e-4 against 7.8e-4,
    // fp16: 3.4e-5 against 7.7e-5).
    CHECK(worst < 0.75 * live);
  }
}

// Dropout under tp (Note [dropout under tensor parallelism] in parallel/tp_random.cc), through
// prepare() and save_state / load_state: with set_seed(s, device_specific) a tp group draws alike,
// so tp 4 + sequence parallel (dp 1) draws one process's masks and trains as it does; a 2-D run
// with ZeRO-3 activation checkpointing, stopped at step 3 and resumed from its checkpoint (the
// per-rank RNG files hold all of dropout's state), equals the straight run bit for bit.
TEST_CASE("dropout through prepare(): tp 4 + SP equals one process; a 2-D resume is bit-exact") {
  const Run one = train("dropout-one", 1, {}, {"dropout"});
  const Run ref = reference();
  CHECK(std::abs(one.losses.back().second - ref.losses.back().second) > 1e-3);  // dropout is live
  const Run tp4 = train("dropout-tp4", 4, {{"ACCEL_TP_SIZE", "4"}}, {"dropout", "sp"});
  const double d = max_difference(one, tp4, 0);
  MESSAGE("tp 4 + sequence parallel with dropout: max relative difference ", d);
  CHECK(d <= kTolerance);
  const Env two_d = {{"ACCEL_TP_SIZE", "2"},
                     {"ACCEL_ZERO_STAGE", "3"},
                     {"ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "true"}};
  const Run straight = train("dropout-2d", 4, two_d, {"dropout", "sp"});
  const std::string dir = scratch() + "/dropout-2d-ckpt";
  train("dropout-2d-first", 4, two_d, {"dropout", "sp", "save", "3", dir}, 3);
  const Run resumed = train("dropout-2d-resumed", 4, two_d, {"dropout", "sp", "load", dir});
  const double r = max_difference(straight, resumed, 3);
  MESSAGE("tp 2 x shard 2 + SP with dropout, resumed at step 3: max relative difference ", r);
  CHECK(r == 0.0);
}

// A chain of checkpoints across meshes and tp sizes (issue 27's tp 2 x shard 2 -> 1 process ->
// shard 4 -> tp 4, then tp 2 under DDP and under ZeRO-3): each run loads the previous run's
// checkpoint, trains on, and saves 3 steps later; every run's losses and final weights equal one
// process trained 20 steps straight.
TEST_CASE("checkpoints continue across meshes: tp 2 x shard 2 -> 1 process -> shard 4 -> tp 4") {
  const Run& ref = reference();
  struct Hop {
    const char* name;
    int world;
    Env env;
  };
  const std::vector<Hop> hops = {
      {"tp 2 x shard 2 (ZeRO-3)", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"1 process", 1, {}},
      {"shard 4 (ZeRO-3)", 4, {{"ACCEL_ZERO_STAGE", "3"}}},
      {"tp 4 (DDP inside: dp 1)", 4, {{"ACCEL_TP_SIZE", "4"}}},
      {"tp 2 x dp 2 (DDP)", 4, {{"ACCEL_TP_SIZE", "2"}}},
      {"tp 2 x shard 2 (ZeRO-3), same tp size",
       4,
       {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
  };
  std::string previous;
  for (size_t i = 0; i < hops.size(); ++i) {
    const Hop& h = hops[i];
    const std::string name = h.name;
    CAPTURE(name);
    const int start = int(i) * 3;  // loads the checkpoint of step start, saves at start + 3
    const std::string dir = scratch() + "/chain-" + std::to_string(i);
    std::vector<std::string> args;
    if (!previous.empty()) args = {"load", previous};
    args.insert(args.end(), {"save", std::to_string(start + 3), dir});
    const Run got = train("chain-" + std::to_string(i), h.world, h.env, args);
    const double d = max_difference(ref, got, start);
    MESSAGE(name, " from step ", start, ": max relative difference ", d);
    CHECK(d <= kTolerance);
    previous = dir;
  }
}

// save_model under tp gathers the full tensors (the file one process writes); load_model under
// another tp size cuts them again; save_state replaces an earlier tp checkpoint folder.
TEST_CASE("tp: save_model writes the full model, load_model reads it at another tp size") {
  const Run& ref = reference();
  const std::string file = scratch() + "/tp2.safetensors";
  const Run saved =
      train("export", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, {"export", file});
  CHECK(max_difference(ref, saved, 0) <= kTolerance);
  const accel::io::TensorDict d = accel::io::load_safetensors(file);
  REQUIRE(d.size() == ref.params.size());
  for (const auto& [name, v] : ref.params) {
    CAPTURE(name);
    REQUIRE(d.count(name));
    const accel::Tensor t = d.at(name).to(accel::kFloat64).contiguous().reshape({-1});
    REQUIRE(size_t(t.numel()) == v.size());
    double worst = 0;
    for (size_t i = 0; i < v.size(); ++i)
      worst = std::max(worst, std::abs(t.data<double>()[i] - v[i]) / std::max(1.0, std::abs(v[i])));
    CHECK(worst <= kTolerance);
  }
  // tp 4 loads the file and trains no step: its weights are the file's.
  Run loaded = train("import", 4, {{"ACCEL_TP_SIZE", "4"}}, {"import", file}, 0);
  loaded.losses = ref.losses;  // none trained; compare the weights only
  CHECK(max_difference(ref, loaded, 0) <= kTolerance);
  // A second save into the same folder replaces the first (format 2: no folder inside).
  const std::string dir = scratch() + "/again";
  for (int i = 0; i < 2; ++i)
    train("again-" + std::to_string(i), 4, {{"ACCEL_TP_SIZE", "2"}}, {"save", "2", dir});
  CHECK(fs::exists(dir + "/index.json"));
  CHECK_FALSE(fs::exists(dir + "/tp0"));
}

// Issue 37, B3: a prepared loader's position is global (Note [global loader position] in
// data/sampler.cc), so a checkpoint saved mid-epoch at tp 2 x shard 2 (dp 2) resumes at tp 4
// (dp 1, the same world size: refused before, "state was saved with world_size = 2, this loader
// has 1"), at dp 4 and in one process: every continued loss and the final weights equal one
// process trained straight through, into the next epoch's reshuffle (8 steps an epoch).
TEST_CASE("a prepared loader resumes at another dp size: tp 2 x shard 2 -> tp 4, dp 4, 1 process") {
  constexpr int kLoaderSteps = 12, kSaveAt = 5;
  const Run ref = train("loader-one", 1, {}, {"loader"}, kLoaderSteps);
  REQUIRE(ref.losses.size() == size_t(kLoaderSteps));
  const std::string dir = scratch() + "/loader-ckpt";
  const Run saved = train("loader-save", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}},
                          {"loader", "save", std::to_string(kSaveAt), dir}, kSaveAt);
  REQUIRE(saved.losses.size() == size_t(kSaveAt));
  for (int s = 0; s < kSaveAt; ++s)
    CHECK(std::abs(saved.losses[size_t(s)].second - ref.losses[size_t(s)].second) <= kTolerance);
  // One global position, written once (the index's "loaders").
  const nlohmann::json pos =
      nlohmann::json::parse(accel::test::read_file(dir + "/index.json")).at("loaders")[0];
  CHECK(pos.at("epoch") == "0");
  CHECK(pos.at("samples") == std::to_string(kSaveAt * 8));

  struct Resume {
    const char* name;
    int world;
    Env env;
    std::string from;
  };
  const std::vector<Resume> resumes = {
      {"tp 4", 4, {{"ACCEL_TP_SIZE", "4"}}, dir},
      {"dp 4 (DDP)", 4, {{"ACCEL_DP_REPLICATE_SIZE", "4"}}, dir},
      {"1 process", 1, {}, dir},
  };
  for (size_t i = 0; i < resumes.size(); ++i) {
    const std::string name = resumes[i].name;
    CAPTURE(name);
    const Run got = train("loader-resume-" + std::to_string(i), resumes[i].world, resumes[i].env,
                          {"loader", "load", resumes[i].from}, kLoaderSteps);
    const double d = max_difference(ref, got, kSaveAt, kLoaderSteps);
    MESSAGE(name, " from step ", kSaveAt, ": max relative difference ", d);
    CHECK(d <= kTolerance);
  }
}

// Note [uneven tp shards] (parallel/tensor_parallel.cc): sizes tp does not divide are cut as
// torch.chunk cuts them. The uneven GPT (vocabulary 31, 5 heads of 8, MLP 160) at tp 3, tp 2 x dp
// 2, tp 2 x shard 2 (ZeRO-3: the tp peers' flat units differ) and tp 4 (the last rank holds no
// heads) trains as one process: every loss within 1e-12, the final weights within kTolerance as
// for every even mesh (the summation orders differ: 2-4e-12 after 20 steps, even or not).
TEST_CASE("uneven tp shards: vocabulary 31, 5 heads at tp 2, 3 and 4 equal one process") {
  const Run ref = train("uneven-one", 1, {}, {"uneven"});
  REQUIRE(ref.losses.size() == size_t(kSteps));
  CHECK(ref.losses.back().second < ref.losses.front().second);
  struct Case {
    const char* name;
    int world;
    Env env;
  };
  const std::vector<Case> cases = {
      {"tp 3", 3, {{"ACCEL_TP_SIZE", "3"}}},
      {"tp 2 x dp 2 (DDP)", 4, {{"ACCEL_TP_SIZE", "2"}}},
      {"tp 2 x shard 2 (ZeRO-3)", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"tp 4 (rank 3 holds no heads)", 4, {{"ACCEL_TP_SIZE", "4"}}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i].name;
    CAPTURE(name);
    const std::string out = scratch() + "/uneven-" + std::to_string(i) + ".txt";
    auto res = run_world(worker(), {out, std::to_string(kSteps), "uneven"}, cases[i].world,
                         cases[i].env, 180s);
    check_ok(res, "mesh_train");
    const Run got = read_run(out);
    const double d = max_difference(ref, got, 0), dl = max_loss_difference(ref, got);
    MESSAGE(name, " (uneven): max relative difference ", d, " (losses ", dl, ")");
    CHECK(dl <= 1e-12);      // every loss of the 20 steps
    CHECK(d <= kTolerance);  // and the final weights, as every even mesh (2-4e-12 measured)
  }
}

// Uneven pieces in a checkpoint (format 2): each tp piece is recorded as its torch.chunk region of
// the global shape (not T x its local shape), so a run saved at tp 3, mid-epoch with a prepared
// loader, resumes at tp 2 x shard 2, tp 4 (a rank without heads) and one process as the
// uninterrupted run. Fails when the tp place function takes the global length as T x local.
TEST_CASE("uneven tp checkpoint: saved at tp 3, resumed at tp 2 x shard 2, tp 4 and one process") {
  constexpr int kLoaderSteps = 12, kSaveAt = 5;
  const Run ref = train("uneven-ck-one", 1, {}, {"uneven", "loader"}, kLoaderSteps);
  REQUIRE(ref.losses.size() == size_t(kLoaderSteps));
  const std::string dir = scratch() + "/uneven-ckpt";
  const Run saved = train("uneven-ck-save", 3, {{"ACCEL_TP_SIZE", "3"}},
                          {"uneven", "loader", "save", std::to_string(kSaveAt), dir}, kSaveAt);
  REQUIRE(saved.losses.size() == size_t(kSaveAt));
  for (int s = 0; s < kSaveAt; ++s)
    CHECK(std::abs(saved.losses[size_t(s)].second - ref.losses[size_t(s)].second) <= 1e-12);
  REQUIRE(fs::exists(dir + "/index.json"));
  struct Resume {
    const char* name;
    int world;
    Env env;
  };
  const std::vector<Resume> resumes = {
      {"tp 2 x shard 2", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"tp 4", 4, {{"ACCEL_TP_SIZE", "4"}}},
      {"1 process", 1, {}},
  };
  for (size_t i = 0; i < resumes.size(); ++i) {
    const std::string name = resumes[i].name;
    CAPTURE(name);
    const Run got = train("uneven-ck-resume-" + std::to_string(i), resumes[i].world, resumes[i].env,
                          {"uneven", "loader", "load", dir}, kLoaderSteps);
    const double d = max_difference(ref, got, kSaveAt, kLoaderSteps);
    MESSAGE(name, " from the tp 3 checkpoint at step ", kSaveAt, ": max relative difference ", d);
    CHECK(d <= kTolerance);
  }
}

// What stays refused with uneven shards, on every rank and by name: sequence parallelism with a
// sequence length tp does not divide (16 over tp 3), and dropout on features cut unevenly.
TEST_CASE("uneven tp: sequence parallel over an uneven sequence and uneven dropout are refused") {
  struct Case {
    std::vector<std::string> args;
    const char* want;
  };
  const std::vector<Case> cases = {
      {{"sp"}, "sequence parallelism needs the sequence length divisible by tp"},
      {{"dropout"}, "lies where tensor parallelism holds uneven pieces"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.want);
    std::vector<std::string> args = {scratch() + "/uneven-refused.txt", "2", "uneven"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto res = run_world(worker(), args, 3, {{"ACCEL_TP_SIZE", "3"}}, 120s);
    for (const RankResult& r : res) {
      CHECK(r.exited);
      CHECK(r.code == 3);
      CHECK_MESSAGE(r.output.find(c.want) != std::string::npos, c.want, " in: ", r.output);
    }
  }
}
// Issue 37 item 3 (Note [deferred parts] in nn/module.cc): a GPT built under nn::DeferredInit (24
// layers, float64) and prepared at tp 2 x shard 2 never holds more than its pieces plus one
// module's full parameters: the allocator's peak during prepare, the most over ranks, stays below
// 0.6 of the full model's bytes; each piece is the full model's init cut (the replayed generator),
// so training equals one process (the same model materialised whole): losses within 1e-12, weights
// within kTolerance. tp 2 x dp 2
// (DDP: the tp pieces materialised at prepare) and tp 3 (uneven pieces) too; and pipeline stages
// (pp 2 x dp 2, pp 2 x shard 2: 0.30 of the model), which materialise their own layers only.
TEST_CASE(
    "deferred init under tp: only local pieces are materialised; training equals one process") {
  constexpr int kDeferredSteps = 5;  // 24 layers: fewer steps
  const Run ref = train("deferred-one", 1, {}, {"deferred"}, kDeferredSteps);
  REQUIRE(ref.model_bytes > 0);
  struct Case {
    const char* name;
    int world;
    Env env;
    bool measure;
  };
  const std::vector<Case> cases = {
      {"tp 2 x shard 2 (ZeRO-3)", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, true},
      {"tp 2 x dp 2 (DDP)", 4, {{"ACCEL_TP_SIZE", "2"}}, false},
      {"tp 3", 3, {{"ACCEL_TP_SIZE", "3"}}, false},
      // A pipeline stage materialises its own layers only (Note [pp step]); DDP's buckets then
      // double them (as at tp 2 x dp 2).
      {"pp 2 x dp 2 (DDP)", 4, {{"ACCEL_PP_SIZE", "2"}}, false},
      {"pp 2 x shard 2 (ZeRO-3)", 4, {{"ACCEL_PP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}, true},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i].name;
    CAPTURE(name);
    const std::string out = scratch() + "/deferred-" + std::to_string(i) + ".txt";
    auto res = run_world(worker(), {out, std::to_string(kDeferredSteps), "deferred"},
                         cases[i].world, cases[i].env, 180s);
    check_ok(res, "mesh_train");
    const Run got = read_run(out);
    const double d = max_difference(ref, got, 0, kDeferredSteps);
    const double dl = max_loss_difference(ref, got);
    const double ratio = got.peak / got.model_bytes;
    MESSAGE(name, " (deferred): max relative difference ", d, " (losses ", dl, "); prepare peak ",
            got.peak, " bytes = ", ratio, " of the model's ", got.model_bytes);
    CHECK(dl <= 1e-12);
    CHECK(d <= kTolerance);
    if (cases[i].measure) CHECK(ratio < 0.6);
  }
}
