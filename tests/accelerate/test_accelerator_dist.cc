// Multi-process (Gloo, loopback) tests of the Accelerator: the test spawns accel_worker once per
// rank under the env contract and compares what the ranks print.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::RankResult;
using accel::test::run_world;
namespace fs = std::filesystem;
using accel::test::check_close;
using accel::test::fresh_dir;

namespace {

// The tensors of a format-2 checkpoint's index (name -> number of pieces).
std::map<std::string, size_t> index_tensors(const std::string& ckpt) {
  const nlohmann::json j = nlohmann::json::parse(accel::test::read_file(ckpt + "/index.json"));
  std::map<std::string, size_t> out;
  for (auto it = j.at("tensors").begin(); it != j.at("tensors").end(); ++it)
    out[it.key()] = it->at("pieces").size();
  return out;
}
// The data files holding pieces of the tensors whose names end with `suffix`.
std::set<int> piece_files(const std::string& ckpt, const std::string& suffix) {
  const nlohmann::json j = nlohmann::json::parse(accel::test::read_file(ckpt + "/index.json"));
  std::set<int> out;
  for (auto it = j.at("tensors").begin(); it != j.at("tensors").end(); ++it)
    if (it.key().ends_with(suffix))
      for (const auto& p : it->at("pieces")) out.insert(p.at("file").get<int>());
  return out;
}

// fresh_dir's prefix: /tmp/accel-acc-dist-<pid>-<tag>.
constexpr char kScratch[] = "accel-acc-dist";

std::string worker() { return accel::test::helper_path("accel_worker"); }

std::vector<std::string> lines_with(const std::string& out, const std::string& prefix) {
  std::vector<std::string> v;
  std::istringstream is(out);
  for (std::string l; std::getline(is, l);)
    if (l.rfind(prefix, 0) == 0) v.push_back(l);
  return v;
}

}  // namespace

TEST_CASE("multi-process facade: gather, gather_for_metrics, reduce, broadcast, pad") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    auto res = run_world(worker(), {"facade"}, world, {}, 60s);
    check_ok(res, "facade");
    // print() only on the main process.
    CHECK(res[0].output.find("printed once") != std::string::npos);
    for (int r = 1; r < world; ++r)
      CHECK(res[size_t(r)].output.find("printed once") == std::string::npos);
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

namespace {
// The numbers after `prefix` on the lines of `want` and `got` agree within `eps` (relative).
void check_lines_close(const std::string& want, const std::string& got, const std::string& prefix,
                       double eps) {
  auto ref = lines_with(want, prefix), mine = lines_with(got, prefix);
  CAPTURE(prefix);
  REQUIRE(ref.size() >= 4);
  REQUIRE(mine.size() == ref.size());
  std::vector<double> a, b;
  for (size_t i = 0; i < ref.size(); ++i) {
    a.push_back(std::stod(ref[i].substr(prefix.size())));
    b.push_back(std::stod(mine[i].substr(prefix.size())));
  }
  check_close(b, a, eps, eps, prefix);
}
}  // namespace

TEST_CASE(
    "DDP through the facade: 2 ranks x batch 8 match 1 process x batch 16 (AdamW, clipping)") {
  auto one = run_world(worker(), {"ddp_mlp", "16"}, 1, {}, 60s);
  check_ok(one, "ddp_mlp");
  auto two = run_world(worker(), {"ddp_mlp", "8"}, 2, {}, 60s);
  check_ok(two, "ddp_mlp");
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    check_lines_close(one[0].output, two[size_t(r)].output, "norm ", 1e-5);
    check_lines_close(one[0].output, two[size_t(r)].output, "param ", 1e-5);
  }
  // Several buckets per model (the 512-byte cap), reported by rank 0.
  CHECK(lines_with(two[0].output, "buckets ").size() == 1);
}

TEST_CASE("ZeRO 1/2/3 through prepare(): accumulation, clipping, fp16 match DDP and 1 process") {
  auto one = run_world(worker(), {"ddp_mlp", "16"}, 1, {}, 60s);
  check_ok(one, "ddp_mlp");
  for (std::string stage : {"1", "2", "3"}) {
    CAPTURE(stage);
    auto two = run_world(worker(), {"ddp_mlp", "8", stage}, 2, {}, 60s);
    check_ok(two, "ddp_mlp");
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      check_lines_close(one[0].output, two[size_t(r)].output, "norm ", 1e-5);
      check_lines_close(one[0].output, two[size_t(r)].output, "param ", 1e-5);
      // Sharded optimizer state: about half of AdamW's two slots per rank.
      auto mem = lines_with(two[size_t(r)].output, "zero params ");
      REQUIRE(mem.size() == 1);
      long long params, grads, opt, full;
      REQUIRE(std::sscanf(mem[0].c_str(), "zero params %lld grads %lld optimizer %lld full %lld",
                          &params, &grads, &opt, &full) == 4);
      CHECK(opt < full + 64);  // 2 slots over 2 ranks, + one step counter per bucket
      CHECK(opt > full - 64);
      if (stage != "1") CHECK(grads < full / 2 + 64);
    }
  }
  // fp16 (scaled loss, unscale and inf check on the shards): ZeRO-2 equals DDP with 2 ranks; both
  // are near the single process (fp16 rounding of per-rank activation gradients differs).
  auto one16 = run_world(worker(), {"ddp_mlp", "16", "0", "fp16"}, 1, {}, 60s);
  auto ddp16 = run_world(worker(), {"ddp_mlp", "8", "0", "fp16"}, 2, {}, 60s);
  auto zero16 = run_world(worker(), {"ddp_mlp", "8", "2", "fp16"}, 2, {}, 60s);
  check_ok(one16, "ddp_mlp");
  check_ok(ddp16, "ddp_mlp");
  check_ok(zero16, "ddp_mlp");
  check_lines_close(ddp16[0].output, zero16[0].output, "param ", 1e-5);
  check_lines_close(ddp16[0].output, zero16[1].output, "norm ", 1e-5);
  check_lines_close(one16[0].output, zero16[0].output, "param ", 1e-3);
}

TEST_CASE("ZeRO prepare() refuses optimizers it cannot rebuild, takes several param groups") {
  check_ok(run_world(worker(), {"zero_errors"}, 2, {}, 60s), "zero_errors");
}

TEST_CASE("ZeRO checkpoints: same world size resumes bit-exact; 3, 4 and 1 processes re-shard") {
  const std::string dir = fresh_dir(kScratch, "zero");
  // 2 ranks, stage 2, 8 steps of global batch 12, a checkpoint after 4.
  auto full = run_world(worker(), {"zero_train", dir, "2", "6", "8", "4", "0"}, 2, {}, 60s);
  check_ok(full, "zero_train");
  // Format 2: each rank wrote its own optimizer shard's pieces.
  CHECK(fs::exists(dir + "/ckpt/data_rank0.safetensors"));
  CHECK(fs::exists(dir + "/ckpt/data_rank1.safetensors"));
  CHECK(piece_files(dir + "/ckpt", ".exp_avg").size() == 2);
  const auto want_losses = lines_with(full[0].output, "loss ");
  REQUIRE(want_losses.size() == 8);
  {
    auto same = run_world(worker(), {"zero_train", dir, "2", "6", "8", "4", "1"}, 2, {}, 60s);
    check_ok(same, "zero_train");
    auto got = lines_with(same[0].output, "loss ");
    REQUIRE(got.size() == 4);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want_losses[4 + i]);
    CHECK(lines_with(same[1].output, "param ") == lines_with(full[1].output, "param "));
  }
  struct Case {
    int world;
    const char* stage;
    const char* batch;
  };
  for (Case c : {Case{3, "3", "4"}, Case{4, "1", "3"}, Case{1, "2", "12"}}) {
    CAPTURE(c.world);
    auto res =
        run_world(worker(), {"zero_train", dir, c.stage, c.batch, "8", "4", "1"}, c.world, {}, 60s);
    check_ok(res, "zero_train");
    for (int r = 0; r < c.world; ++r) {
      CHECK(res[size_t(r)].output.find("resumed at 4 lr 0.005") != std::string::npos);
      check_lines_close(full[0].output, res[size_t(r)].output, "param ", 1e-5);
    }
  }
  // A single-process checkpoint sharded into a 2-rank ZeRO-3 run.
  const std::string plain = fresh_dir(kScratch, "zero-plain");
  auto ref = run_world(worker(), {"zero_train", plain, "2", "12", "8", "4", "0"}, 1, {}, 60s);
  check_ok(ref, "zero_train");
  auto into = run_world(worker(), {"zero_train", plain, "3", "6", "8", "4", "1"}, 2, {}, 60s);
  check_ok(into, "zero_train");
  for (int r = 0; r < 2; ++r)
    check_lines_close(ref[0].output, into[size_t(r)].output, "param ", 1e-5);
}

TEST_CASE("ZeRO 1/2 with bf16 parameters: checkpoints hold the fp32 masters, resume, re-shard") {
  // ZeRO param_dtype bf16 (AcceleratorConfig::zero) with fp32 master shards, 2 ranks, 8 steps,
  // a checkpoint after 4. The checkpoint's model is the masters (not bf16-rounded values): a
  // resumed run of the same kind continues bit-exactly, and a plain fp32 process (or another
  // world size and stage) loads exactly those values.
  struct Run {
    const char* stage;
    const char* mp;
  };
  for (Run run : {Run{"2", "bf16"}, Run{"1", "bf16-fp32"}}) {
    CAPTURE(run.stage);
    CAPTURE(run.mp);
    const std::string dir = fresh_dir(kScratch, std::string("zero-mp") + run.stage);
    auto full =
        run_world(worker(), {"zero_train", dir, run.stage, "6", "8", "4", "0", run.mp}, 2, {}, 60s);
    check_ok(full, "zero_train");
    const auto saved = lines_with(full[0].output, "saved ");
    const auto unrounded = lines_with(full[0].output, "saved-unrounded ");
    REQUIRE(saved.size() > 100);
    REQUIRE(unrounded.size() == 1);
    CHECK(std::stoll(unrounded[0].substr(16)) > int64_t(saved.size()) / 2);  // fp32 values
    CHECK(lines_with(full[1].output, "saved ") == saved);
    const auto want_losses = lines_with(full[0].output, "loss ");
    REQUIRE(want_losses.size() == 8);
    auto loaded = [&](const RankResult& r) {
      auto v = lines_with(r.output, "loaded ");
      for (auto& l : v) l = "saved " + l.substr(7);
      return v;
    };
    {
      auto same = run_world(worker(), {"zero_train", dir, run.stage, "6", "8", "4", "1", run.mp}, 2,
                            {}, 60s);
      check_ok(same, "zero_train");
      CHECK(loaded(same[0]) == saved);
      auto got = lines_with(same[0].output, "loss ");
      REQUIRE(got.size() == 4);
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want_losses[4 + i]);
      CHECK(lines_with(same[1].output, "param ") == lines_with(full[1].output, "param "));
    }
    // One plain fp32 process; three ranks of the other stage in bf16.
    auto one = run_world(worker(), {"zero_train", dir, "2", "12", "8", "4", "1"}, 1, {}, 60s);
    check_ok(one, "zero_train");
    CHECK(one[0].output.find("resumed at 4 lr 0.005") != std::string::npos);
    CHECK(loaded(one[0]) == saved);
    if (run.stage[0] == '2') {
      // And the other way: a plain fp32 single-process checkpoint into bf16 ZeRO-2 at 2 ranks.
      const std::string plain = fresh_dir(kScratch, "zero-mp-plain");
      auto ref = run_world(worker(), {"zero_train", plain, "2", "12", "8", "4", "0"}, 1, {}, 60s);
      check_ok(ref, "zero_train");
      auto into =
          run_world(worker(), {"zero_train", plain, "2", "6", "8", "4", "1", run.mp}, 2, {}, 60s);
      check_ok(into, "zero_train");
      for (int r = 0; r < 2; ++r)
        CHECK(loaded(into[size_t(r)]) == lines_with(ref[0].output, "saved "));
    }
    const char* other = run.stage[0] == '1' ? "2" : "1";
    auto three =
        run_world(worker(), {"zero_train", dir, other, "4", "8", "4", "1", run.mp}, 3, {}, 60s);
    check_ok(three, "zero_train");
    for (int r = 0; r < 3; ++r) {
      CHECK(three[size_t(r)].output.find("resumed at 4 lr 0.005") != std::string::npos);
      CHECK(loaded(three[size_t(r)]) == saved);
    }
  }
}

TEST_CASE("ZeRO-3 sharded checkpoints: 4 ranks resume at 4 bit-exact, at 2 and 1 re-sharded") {
  const std::string dir = fresh_dir(kScratch, "zero3");
  auto full = run_world(worker(), {"zero_train", dir, "3", "3", "8", "4", "0"}, 4, {}, 60s);
  check_ok(full, "zero_train");
  // Every rank wrote its own slices; nobody wrote the whole model.
  for (int r = 0; r < 4; ++r)
    CHECK(fs::exists(dir + "/ckpt/data_rank" + std::to_string(r) + ".safetensors"));
  CHECK(index_tensors(dir + "/ckpt").at("model.0.0.weight") == 4);
  CHECK(full[0].output.find("export matches") != std::string::npos);
  const auto want_losses = lines_with(full[0].output, "loss ");
  REQUIRE(want_losses.size() == 8);
  {
    auto same = run_world(worker(), {"zero_train", dir, "3", "3", "8", "4", "1"}, 4, {}, 60s);
    check_ok(same, "zero_train");
    auto got = lines_with(same[0].output, "loss ");
    REQUIRE(got.size() == 4);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want_losses[4 + i]);
    CHECK(lines_with(same[0].output, "param ") == lines_with(full[0].output, "param "));
  }
  for (int world : {2, 1}) {
    CAPTURE(world);
    const std::string batch = std::to_string(12 / world);
    auto res = run_world(worker(), {"zero_train", dir, "3", batch, "8", "4", "1"}, world, {}, 60s);
    check_ok(res, "zero_train");
    CHECK(res[0].output.find("resumed at 4 lr 0.005") != std::string::npos);
    CHECK(res[0].output.find("export matches") != std::string::npos);
    for (int r = 0; r < world; ++r)
      check_lines_close(full[0].output, res[size_t(r)].output, "param ", 1e-5);
  }
  // The checkpoint of another model: a clear error naming the parameter, nothing changed.
  check_ok(run_world(worker(), {"wrong_model", dir, "3"}, 2, {}, 60s), "wrong_model");
  check_ok(run_world(worker(), {"wrong_model", dir, "3"}, 1, {}, 60s), "wrong_model");
  // DDP: the main process's failed export does not leave the other rank waiting either.
  check_ok(run_world(worker(), {"wrong_model", dir, "0"}, 2, {}, 60s), "wrong_model");
}

TEST_CASE("plain DDP checkpoints load into another world size (2 ranks -> 1 and 3)") {
  const std::string dir = fresh_dir(kScratch, "ddp-reshard");
  // 2 ranks, DDP, 8 steps of global batch 12, a checkpoint after 4.
  auto full = run_world(worker(), {"zero_train", dir, "0", "6", "8", "4", "0"}, 2, {}, 60s);
  check_ok(full, "zero_train");
  CHECK(index_tensors(dir + "/ckpt").at("rng.default") == 1);       // seeded alike: written once
  CHECK(index_tensors(dir + "/ckpt").at("model.0.0.weight") == 1);  // rank 0's only
  struct Case {
    int world;
    const char* batch;
  };
  for (Case c : {Case{1, "12"}, Case{3, "4"}}) {
    CAPTURE(c.world);
    auto res =
        run_world(worker(), {"zero_train", dir, "0", c.batch, "8", "4", "1"}, c.world, {}, 60s);
    check_ok(res, "zero_train");
    const auto want = lines_with(full[0].output, "loss ");
    REQUIRE(want.size() == 8);
    for (int r = 0; r < c.world; ++r) {
      CHECK(res[size_t(r)].output.find("resumed at 4 lr 0.005") != std::string::npos);
      // The same global batches follow: the losses and parameters of the 2-rank run.
      auto got = lines_with(res[size_t(r)].output, "loss ");
      REQUIRE(got.size() == 4);
      for (size_t i = 0; i < got.size(); ++i) {
        const std::string& w = want[4 + i];
        double a = std::strtod(w.substr(w.rfind(' ') + 1).c_str(), nullptr),
               b = std::strtod(got[i].substr(got[i].rfind(' ') + 1).c_str(), nullptr);
        CHECK(b == doctest::Approx(a).epsilon(1e-5));
      }
      check_lines_close(full[0].output, res[size_t(r)].output, "param ", 1e-5);
    }
  }
}

// Issue 12's matrix: ZeRO stages 0-3 x world sizes 1-4 x accumulation 1 and 3 give the loss curve
// and the parameters of one process (same global batch of 12 per micro-batch), up to float
// reduction order. rtol 1e-4: a wrong param group, a lost micro-batch or a mis-scaled gradient
// moves the curve by far more.
TEST_CASE("strategy matrix: stages 0-3 x world 1-4 x accumulation 1/3 equal one process") {
  for (std::string accum : {"1", "3"}) {
    CAPTURE(accum);
    auto ref = run_world(worker(), {"matrix", "0", "12", accum}, 1, {}, 60s);
    check_ok(ref, "matrix");
    REQUIRE(lines_with(ref[0].output, "loss ").size() == (accum == "1" ? 20u : 60u));
    for (std::string stage : {"0", "1", "2", "3"}) {
      for (int world = 2; world <= 4; ++world) {
        CAPTURE(stage);
        CAPTURE(world);
        auto res = run_world(worker(), {"matrix", stage, std::to_string(12 / world), accum}, world,
                             {}, 60s);
        check_ok(res, "matrix");
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          check_lines_close(ref[0].output, res[size_t(r)].output, "loss ", 1e-4);
          check_lines_close(ref[0].output, res[size_t(r)].output, "param ", 1e-4);
        }
      }
    }
  }
}

TEST_CASE("ZeRO-1 with bf16 parameters: a checkpoint inside an accumulation window resumes") {
  // Stage 1 under param_dtype keeps the window in fp32 gradient shards (zero_grads_rank<r>).
  const std::string dir = fresh_dir(kScratch, "zero-mp-window");
  auto full =
      run_world(worker(), {"zero_train", dir, "1", "6", "8", "5", "0", "bf16", "2"}, 2, {}, 60s);
  check_ok(full, "zero_train");
  CHECK(index_tensors(dir + "/ckpt").count("grad.accum.0.0.rank0"));
  CHECK(index_tensors(dir + "/ckpt").count("grad.accum.0.0.rank1"));
  const auto want = lines_with(full[0].output, "loss ");
  REQUIRE(want.size() == 8);
  auto res =
      run_world(worker(), {"zero_train", dir, "1", "6", "8", "5", "1", "bf16", "2"}, 2, {}, 60s);
  check_ok(res, "zero_train");
  auto got = lines_with(res[0].output, "loss ");
  REQUIRE(got.size() == 3);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[5 + i]);
  for (int r = 0; r < 2; ++r)
    CHECK(lines_with(res[size_t(r)].output, "param ") ==
          lines_with(full[size_t(r)].output, "param "));
}

TEST_CASE("ZeRO 1/2 with bf16 parameters and accumulation: stage 1 equals stage 2, near fp32") {
  // With two ranks a reduction is one addition whatever the collective, so stage 1 (all-reduce,
  // the window added up in fp32 shards) and stage 2 (reduce-scatter) give the same bits; bf16
  // compute stays near the fp32 run. Clipping acts on the fp32 gradient shards.
  auto fp32 = run_world(worker(), {"matrix", "2", "6", "3"}, 2, {}, 60s);
  check_ok(fp32, "matrix");
  for (std::string mp : {"bf16", "bf16-fp32", "fp16"}) {
    CAPTURE(mp);
    auto one = run_world(worker(), {"matrix", "1", "6", "3", mp}, 2, {}, 60s);
    auto two = run_world(worker(), {"matrix", "2", "6", "3", mp}, 2, {}, 60s);
    check_ok(one, "matrix");
    check_ok(two, "matrix");
    for (std::string what : {"loss ", "norm ", "param "}) {
      CAPTURE(what);
      CHECK(lines_with(one[0].output, what).size() >= 20);
      CHECK(lines_with(one[0].output, what) == lines_with(two[0].output, what));
      CHECK(lines_with(one[1].output, what) == lines_with(two[1].output, what));
    }
    check_lines_close(fp32[0].output, two[0].output, "loss ", 5e-2);
  }
}

TEST_CASE("save, kill during save, resume: previous checkpoint loads, losses bit-identical") {
  const std::map<std::string, std::string> env = {{"DIST_TIMEOUT_MS", "3000"}};
  const std::string base = fresh_dir(kScratch, "base");
  auto full = run_world(worker(), {"train", base, "12", "4", "0"}, 2, env, 90s);
  check_ok(full, "train");
  struct Case {
    const char* stage;
    int rank;
  };
  for (Case c : {Case{"rank_files", 1}, Case{"commit", 0}}) {
    CAPTURE(c.stage);
    const std::string dir = fresh_dir(kScratch, std::string("crash-") + c.stage);
    // Dies in the second save (after 8 steps): rank `c.rank` is killed at stage `c.stage`.
    auto crashed =
        run_world(worker(), {"train", dir, "12", "4", "0", c.stage, std::to_string(c.rank)}, 2, env,
                  60s, /*kill_after_survivors=*/true);
    {
      INFO("victim output:\n" << crashed[size_t(c.rank)].output);
      CHECK(crashed[size_t(c.rank)].code == -SIGKILL);
    }
    CHECK(crashed[size_t(1 - c.rank)].code != 0);  // the survivor notices, not hangs
    CHECK(fs::exists(dir + "/checkpoints/checkpoint_0/index.json"));
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

namespace {
// The largest relative difference between the "p64 <hex>" lines of two outputs.
double max_rel_diff_p64(const std::string& want, const std::string& got) {
  auto a = lines_with(want, "p64 "), b = lines_with(got, "p64 ");
  REQUIRE(a.size() > 100);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::strtod(a[i].c_str() + 4, nullptr),
                 y = std::strtod(b[i].c_str() + 4, nullptr);
    worst = std::max(worst, std::abs(x - y) / std::max(std::abs(x), 1e-3));
  }
  return worst;
}
}  // namespace

// Issue 22, item 13: re-sharding a float64 ZeRO checkpoint kept the optimizer state in float32
// (the default dtype): resumed runs differed by ~1e-9 where float64 holds ~1e-16.
TEST_CASE("float64 ZeRO state survives re-sharding: 2 ranks -> 1 and 1 -> 2 resume to 1e-14") {
  const std::string dir = fresh_dir(kScratch, "zero-f64");
  auto full = run_world(worker(), {"zero_train", dir, "2", "6", "8", "4", "0", "f64"}, 2, {}, 60s);
  check_ok(full, "zero_train");
  auto one = run_world(worker(), {"zero_train", dir, "2", "12", "8", "4", "1", "f64"}, 1, {}, 60s);
  check_ok(one, "zero_train");
  CHECK(one[0].output.find("resumed at 4 lr 0.005") != std::string::npos);
  const double down = max_rel_diff_p64(full[0].output, one[0].output);
  MESSAGE("2 -> 1: largest relative parameter difference " << down);
  CHECK(down < 1e-14);
  // A single-process checkpoint (plain optimizer state) sharded into two ZeRO-2 ranks.
  const std::string plain = fresh_dir(kScratch, "zero-f64-plain");
  auto ref =
      run_world(worker(), {"zero_train", plain, "2", "12", "8", "4", "0", "f64"}, 1, {}, 60s);
  check_ok(ref, "zero_train");
  auto two = run_world(worker(), {"zero_train", plain, "2", "6", "8", "4", "1", "f64"}, 2, {}, 60s);
  check_ok(two, "zero_train");
  for (int r = 0; r < 2; ++r) {
    const double up = max_rel_diff_p64(ref[0].output, two[size_t(r)].output);
    MESSAGE("1 -> 2, rank " << r << ": largest relative parameter difference " << up);
    CHECK(up < 1e-14);
  }
}

// Issue 22, item 12 (Note [plain backward] in accelerate/accelerator.cc): a plain loss.backward()
// on a prepared model syncs as acc.backward(loss) does, bit for bit in float64, under DDP and ZeRO
// 1-3, with no_sync() windows; where acc.backward would scale the loss (accumulation > 1) the
// first step refuses, naming acc.backward.
TEST_CASE("plain loss.backward() equals acc.backward() under DDP and ZeRO 1-3 (2 ranks)") {
  for (std::string stage : {"0", "1", "2", "3"}) {
    CAPTURE(stage);
    auto with_acc = run_world(worker(), {"plain_backward", stage, "acc"}, 2, {}, 60s);
    check_ok(with_acc, "plain_backward");
    auto plain = run_world(worker(), {"plain_backward", stage, "plain"}, 2, {}, 60s);
    check_ok(plain, "plain_backward");
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      for (std::string what : {"p64 ", "loss ", "norm "}) {
        CAPTURE(what);
        const auto want = lines_with(with_acc[size_t(r)].output, what);
        CHECK(want.size() >= 4);
        CHECK(lines_with(plain[size_t(r)].output, what) == want);
      }
    }
    check_ok(run_world(worker(), {"plain_backward", stage, "scaled"}, 2, {}, 60s),
             "plain_backward");
  }
}

// Issue 22, item 16 (Note [fsdp loading memory] in accelerate/strategy_fsdp.cc): a resumed run's
// load_state peaks no higher than 1.10 x its own training peak (CPU allocator bytes, exact), at
// the saving world size and re-sharded. Before, the load held whole rank files, assembled copies
// and a snapshot of the model at once.
TEST_CASE("load_state needs no more memory than training: ZeRO-3 and ZeRO-2, re-sharded too") {
  for (std::string stage : {"3", "2"}) {
    CAPTURE(stage);
    const std::string dir = fresh_dir(kScratch, "resume-peak-" + stage);
    check_ok(run_world(worker(), {"resume_peak", dir, "save", stage}, 2, {}, 60s), "resume_peak");
    for (int world : {2, 3, 1}) {
      CAPTURE(world);
      auto res = run_world(worker(), {"resume_peak", dir, "load", stage}, world, {}, 60s);
      check_ok(res, "resume_peak");
      MESSAGE(lines_with(res[0].output, "load_peak ")[0]);
    }
  }
}

// Issue 22, item 17: Accelerator::load_model streams a safetensors file, or a sharded set with
// its index, into each rank's part of a prepared model under every strategy (one process, DDP,
// ZeRO 1-3) at 1, 2 and 3 ranks: the exact saved weights, no copy of the model on any rank
// (checked in the worker), strict about names, converting dtypes.
TEST_CASE("load_model: a ZeRO-3 export loads at 1, 2 and 3 ranks under every strategy") {
  const std::string dir = fresh_dir(kScratch, "load-model");
  check_ok(run_world(worker(), {"load_model", dir, "save", "3"}, 2, {}, 60s), "load_model");
  REQUIRE(fs::exists(dir + "/sharded/model.safetensors.index.json"));
  for (int world : {1, 2, 3}) {
    for (std::string stage : {"0", "1", "2", "3"}) {
      CAPTURE(world);
      CAPTURE(stage);
      check_ok(run_world(worker(), {"load_model", dir, "load", stage, "file"}, world, {}, 60s),
               "load_model");
    }
  }
  struct Case {
    int world;
    const char* stage;
    const char* what;
  };
  for (Case c :
       {Case{2, "3", "index"}, Case{3, "3", "dir"}, Case{2, "3", "f64"}, Case{2, "0", "index"},
        Case{3, "2", "f64"}, Case{1, "0", "dir"}, Case{2, "2", "mp"}, Case{2, "3", "mp"}}) {
    CAPTURE(c.world);
    CAPTURE(c.stage);
    CAPTURE(c.what);
    check_ok(run_world(worker(), {"load_model", dir, "load", c.stage, c.what}, c.world, {}, 60s),
             "load_model");
  }
}

// Note [module calls], Note [tied parameters]: a model of two-input units with tuple and struct
// results and a weight tied across units, trained through prepare() and step(closure) under
// every strategy, equals one process.
TEST_CASE(
    "typed units and a tied weight: DDP, ZeRO 1/2/3 and ZeRO-3 checkpointing equal 1 process") {
  const std::string dir = fresh_dir(kScratch, "typed");
  auto one = run_world(worker(), {"typed", dir, "0", "8"}, 1, {}, 60s);
  check_ok(one, "typed");
  for (std::string stage : {"0", "1", "2", "3", "3+ckpt"}) {
    CAPTURE(stage);
    const bool ckpt = stage == "3+ckpt";
    auto two =
        run_world(worker(), {"typed", dir, ckpt ? "3" : stage, "4", ckpt ? "1" : "0"}, 2, {}, 60s);
    check_ok(two, "typed");
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      check_lines_close(one[0].output, two[size_t(r)].output, "loss ", 1e-5);
      check_lines_close(one[0].output, two[size_t(r)].output, "param ", 1e-5);
    }
  }
  fs::remove_all(dir);
}

// Issue 24 item 5: the elementwise optimizers shard under ZeRO 1/2/3 (rebuild over the shards,
// state in 1/N slices) and give the single process's float64 trajectory; save_state / load_state
// resumes bit-exact (each optimizer at another stage, and in one process).
TEST_CASE("Adadelta, Adagrad, RMSprop under ZeRO 1/2/3 equal one process; resume bit-exact") {
  const char* opts[] = {"adadelta", "adagrad", "rmsprop"};
  for (int k = 0; k < 3; ++k) {
    const std::string opt = opts[k];
    CAPTURE(opt);
    const std::string one_dir = fresh_dir(kScratch, "opt-one-" + opt);
    auto one = run_world(
        worker(), {"zero_train", one_dir, "0", "12", "6", "3", "0", "f64", "1", opt}, 1, {}, 60s);
    check_ok(one, "zero_train");
    auto one_res = run_world(
        worker(), {"zero_train", one_dir, "0", "12", "6", "3", "1", "f64", "1", opt}, 1, {}, 60s);
    check_ok(one_res, "zero_train");
    CHECK(lines_with(one_res[0].output, "p64 ") == lines_with(one[0].output, "p64 "));
    for (std::string stage : {"1", "2", "3"}) {
      CAPTURE(stage);
      const std::string dir = fresh_dir(kScratch, "opt-" + opt + "-" + stage);
      auto two = run_world(
          worker(), {"zero_train", dir, stage, "6", "6", "3", "0", "f64", "1", opt}, 2, {}, 60s);
      check_ok(two, "zero_train");
      for (int r = 0; r < 2; ++r) {
        const double d = max_rel_diff_p64(one[0].output, two[size_t(r)].output);
        MESSAGE(opt << " zero" << stage << " rank " << r << " vs one process: " << d);
        CHECK(d < 1e-12);
      }
      if (stage[0] - '1' != k) continue;  // one resume per optimizer, each at another stage
      auto res = run_world(
          worker(), {"zero_train", dir, stage, "6", "6", "3", "1", "f64", "1", opt}, 2, {}, 60s);
      check_ok(res, "zero_train");
      for (int r = 0; r < 2; ++r)
        CHECK(lines_with(res[size_t(r)].output, "p64 ") ==
              lines_with(two[size_t(r)].output, "p64 "));
    }
  }
}

// LBFGS cannot be sharded (Note [LBFGS and sharding]): ZeRO prepare refuses it by name; under DDP
// its step(closure) averages the loss across ranks, so 2 ranks follow the single process, and a
// checkpoint (its history in the optimizer file) resumes bit-exact.
TEST_CASE("LBFGS: DDP equals one process, resumes bit-exact; ZeRO refuses it by name") {
  const std::string dir = fresh_dir(kScratch, "lbfgs");
  auto one = run_world(worker(), {"lbfgs", dir, "0", "full"}, 1, {}, 60s);
  check_ok(one, "lbfgs");
  auto two = run_world(worker(), {"lbfgs", dir, "0", "save"}, 2, {}, 60s);
  check_ok(two, "lbfgs");
  REQUIRE(lines_with(one[0].output, "loss ").size() == 4);
  for (int r = 0; r < 2; ++r) {
    const double d = max_rel_diff_p64(one[0].output, two[size_t(r)].output);
    MESSAGE("LBFGS DDP rank " << r << " vs one process: " << d);
    CHECK(d < 1e-9);
  }
  auto res = run_world(worker(), {"lbfgs", dir, "0", "resume"}, 2, {}, 60s);
  check_ok(res, "lbfgs");
  for (int r = 0; r < 2; ++r)
    CHECK(lines_with(res[size_t(r)].output, "p64 ") == lines_with(two[size_t(r)].output, "p64 "));
  for (std::string stage : {"1", "3"})
    check_ok(run_world(worker(), {"lbfgs", dir, stage, "full"}, 2, {}, 60s), "lbfgs");
}

// Note [mesh support] in accelerate/accelerator_mesh.cc: the mesh is built from the ACCEL_*_SIZE
// variables on every rank and holds its process groups (Note [accelerator mesh groups]: the
// world group where a group is the world, groups of one, new_group otherwise); prepare() runs
// the strategies on dp (HSDP included); with tp_size > 1 a model needs
// AcceleratorConfig::tp_plan (Note [tp step] in parallel/tp_step.cc).
TEST_CASE("device mesh: acc.mesh() from the environment, with groups; tp needs a plan") {
  struct Case {
    int world;
    std::map<std::string, std::string> env;
    std::vector<std::string> rank1;  // lines rank 1 prints
    const char* refusal;             // nullptr: everything is prepared
    bool model_only = false;         // the refusal is the model's; optimizer and loader prepare
  };
  const std::vector<Case> cases = {
      {2,
       {},
       {"mesh pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 1", "group dp_shard 0 1",
        "group dp 0 1", "pg dp_shard rank 1 of 0 1", "pg dp_replicate rank 0 of 1",
        "pg tp rank 0 of 1", "sum dp_shard 2", "sum dp 2", "sum tp 1", "sum dp_replicate 1"},
       nullptr},
      {2,
       {{"ACCEL_DP_REPLICATE_SIZE", "2"}},
       {"group dp_replicate 0 1", "group dp_shard 1", "group dp 0 1",
        "pg dp_replicate rank 1 of 0 1", "sum dp_replicate 2", "sum dp_shard 1"},
       nullptr},
      {2,
       {{"ACCEL_TP_SIZE", "2"}},
       {"mesh pp 1 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 2", "group tp 0 1", "group dp 1",
        "sum tp 2", "sum dp 1"},
       "tp_size 2 splits every prepared model over its tp group, but "
       "AcceleratorConfig::tp_plan is empty",
       true},
      {2,
       {{"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}},
       {"group dp_replicate 0 1"},
       nullptr},
      {4,
       {{"ACCEL_DP_REPLICATE_SIZE", "2"}},
       {"mesh pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1", "group dp_replicate 1 3",
        "group dp_shard 0 1", "group dp 0 1 2 3", "pg dp_replicate rank 0 of 1 3",
        "pg dp_shard rank 1 of 0 1", "pg dp rank 1 of 0 1 2 3", "sum dp_replicate 2",
        "sum dp_shard 2", "sum dp 4"},
       nullptr},
  };
  for (const Case& c : cases) {
    CAPTURE(c.world);
    std::string env;
    for (const auto& [k, v] : c.env) env += k + "=" + v + " ";
    CAPTURE(env);
    auto res = run_world(worker(), {"mesh"}, c.world, c.env, 60s);
    check_ok(res, "mesh");
    const std::string& out = res[1].output;
    for (const std::string& line : c.rank1) {
      const auto got = lines_with(out, line);
      CHECK_MESSAGE(std::find(got.begin(), got.end(), line) != got.end(), line, " not in:\n", out);
    }
    for (const char* what : {"model", "optimizer", "loader"}) {
      for (const RankResult& r : res) {
        if (!c.refusal || (c.model_only && std::string(what) != "model")) {
          CHECK_MESSAGE(r.output.find(std::string("prepared ") + what) != std::string::npos,
                        r.output);
        } else {
          const auto refused = lines_with(r.output, std::string("refused ") + what + ": ");
          REQUIRE_MESSAGE(refused.size() == 1, r.output);
          CHECK_MESSAGE(refused[0].find(c.refusal) != std::string::npos, refused[0]);
          CHECK(refused[0].find("[prepare]") != std::string::npos);
        }
      }
    }
    // Note [process data shard]: under tp the ranks of one dp index must read the same batches,
    // so a loader that shards over the world (RANK / WORLD_SIZE) raises when its epoch starts
    // (before: tp peers trained on different batches without a word); one given the dp
    // coordinate, or any loader on a mesh whose dp is the world, iterates.
    const bool tp = c.env.count("ACCEL_TP_SIZE") > 0;
    for (const RankResult& r : res) {
      CHECK_MESSAGE(r.output.find("iterated explicit loader") != std::string::npos, r.output);
      if (!tp) {
        CHECK_MESSAGE(r.output.find("iterated unprepared loader") != std::string::npos, r.output);
        continue;
      }
      const auto refused = lines_with(r.output, "refused unprepared loader: ");
      REQUIRE_MESSAGE(refused.size() == 1, r.output);
      CHECK_MESSAGE(refused[0].find("[DataLoader] this loader shards over WORLD_SIZE = 2 ranks") !=
                        std::string::npos,
                    refused[0]);
      CHECK_MESSAGE(refused[0].find("the Accelerator's mesh has dp size 1 of world 2 (tp 2)") !=
                        std::string::npos,
                    refused[0]);
    }
  }
  // tp with ZeRO-1/2 (before: a ValueError naming the strategy): every strategy composes with tp
  // (Note [apply order] in parallel/parallelize.h); the model still needs its plan.
  for (const char* stage : {"1", "2"}) {
    auto zero_tp = run_world(worker(), {"mesh"}, 2,
                             {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", stage}}, 60s);
    check_ok(zero_tp, "mesh");
    for (const RankResult& r : zero_tp) {
      CHECK_MESSAGE(r.output.find("prepared optimizer") != std::string::npos, r.output);
      CHECK_MESSAGE(r.output.find("AcceleratorConfig::tp_plan is empty") != std::string::npos,
                    r.output);
    }
  }
  // Note [mesh agreement]: ranks started with different sizes or plans raise at once on every
  // rank, naming the setting (before: new_group waited the collective timeout).
  auto differ = run_world(
      worker(), {"mesh"}, 4,
      {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_TP_SIZE@3", "1"}, {"ACCEL_ZERO_STAGE@1", "3"}}, 60s);
  for (const RankResult& r : differ) {
    CHECK(r.exited);
    CHECK(r.code == 3);
    CHECK_MESSAGE(r.output.find("[accelerator] the ranks were started with different settings") !=
                      std::string::npos,
                  r.output);
    CHECK_MESSAGE(r.output.find("tp_size (ACCEL_TP_SIZE, --tp_size, "
                                "parallelism_config.parallelism_config_tp_size): ranks 0-2 have "
                                "2, rank 3 has 1") != std::string::npos,
                  r.output);
    CHECK_MESSAGE(r.output.find("zero_stage (ACCEL_ZERO_STAGE, --zero_stage): ranks 0, 2-3 have "
                                "0, rank 1 has 3") != std::string::npos,
                  r.output);
  }
  // Sizes that do not fit the world: a ValueError in the constructor, before the process group
  // is initialised (no rank waits for another).
  auto bad = run_world(worker(), {"mesh"}, 2, {{"ACCEL_TP_SIZE", "3"}}, 60s);
  for (const RankResult& r : bad) {
    CHECK(r.exited);
    CHECK(r.code == 3);
    CHECK_MESSAGE(
        r.output.find("dp_replicate_size unset, dp_shard_size unset, cp_size unset, tp_size 3") !=
            std::string::npos,
        r.output);
    CHECK_MESSAGE(r.output.find("do not fit 2 processes (WORLD_SIZE)") != std::string::npos,
                  r.output);
  }
}
