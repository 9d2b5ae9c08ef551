// HSDP and the strategies on the Accelerator's mesh (Note [mesh support] in
// accelerate/accelerator_mesh.cc, Note [hsdp] in parallel/hsdp.h): a small GPT trained 20 AdamW
// steps (2 micro-batches each, gradient clipping that clips) in float64 by hsdp_worker on meshes
// of 4 processes equals the run of one process, losses and final weights within 1e-10 (and stays
// close with bf16 compute parameters on HSDP); the bytes
// each rank sends across replicas per step are one shard's; checkpoints of an HSDP run load on
// other meshes and world sizes and continue.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "nn/linear.h"
#include "io/safetensors.h"
#include "optim/optim.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "autograd/ops.h"
#include "core/tensor.h"
#include "tests/common/spawn.h"
#include "tests/common/util.h"
#include "parallel/fsdp.h"
#include "parallel/zero.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::RankResult;
using accel::test::run_world;

namespace {

namespace fs = std::filesystem;
using Env = std::map<std::string, std::string>;

std::string worker() { return accel::test::helper_path("hsdp_worker"); }

// Rank r's values of "<key> <n> <value>" lines, by n.
std::map<int, double> values(const std::string& out, const std::string& key) {
  std::map<int, double> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + " ", 0) != 0) continue;
    std::istringstream ls(line.substr(key.size() + 1));
    int n = 0;
    std::string x;
    ls >> n >> x;
    v[n] = std::strtod(x.c_str(), nullptr);
  }
  return v;
}

struct Run {
  std::vector<RankResult> ranks;
  std::string dir;
  std::map<int, double> losses, clips;
};

std::string g_root;  // this test's scratch directory

Run train(const std::string& name, int world, const std::string& strategy, Env env, int start,
          int stop, const std::string& load = "-", const std::string& save = "-", int save_at = 0) {
  Run r;
  r.dir = g_root + "/" + name;
  fs::create_directories(r.dir);
  r.ranks = run_world(worker(),
                      {r.dir, strategy, std::to_string(start), std::to_string(stop), load, save,
                       std::to_string(save_at)},
                      world, env, 240s);
  check_ok(r.ranks, "hsdp");
  r.losses = values(r.ranks[0].output, "loss");
  r.clips = values(r.ranks[0].output, "clip");
  return r;
}

accel::io::TensorDict weights(const std::string& f) { return accel::io::load_safetensors(f); }

// Every tensor of `b` within `tol` of `a` (tol 0: bit-equal).
void check_weights(const std::string& fa, const std::string& fb, double tol) {
  INFO(fa << " vs " << fb);
  REQUIRE(fs::exists(fa));
  REQUIRE(fs::exists(fb));
  const accel::io::TensorDict a = weights(fa), b = weights(fb);
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name));
    const accel::Tensor& u = b.at(name);
    REQUIRE(u.sizes() == t.sizes());
    if (tol == 0) {
      CHECK(u.equal(t));
    } else {
      const double d = accel::amax(accel::abs(accel::sub(u, t))).item<double>();
      CHECK(d <= tol);
    }
  }
}

// The losses of micro-batches [from, to) and the clipped norms of steps (from/2, to/2] in `r`
// equal the reference's within 1e-10.
void check_losses(const Run& ref, const Run& r, int from, int to) {
  for (int m = from; m < to; ++m) {
    INFO("micro-batch " << m << " of " << r.dir);
    REQUIRE(r.losses.count(m));
    CHECK(std::abs(r.losses.at(m) - ref.losses.at(m)) <= 1e-10);
  }
  for (int s = from / 2 + 1; s <= to / 2; ++s) {
    INFO("step " << s << " of " << r.dir);
    REQUIRE(r.clips.count(s));
    CHECK(std::abs(r.clips.at(s) - ref.clips.at(s)) <= 1e-10 * ref.clips.at(s));
  }
}

const Env kShard4 = {{"ACCEL_DP_SHARD_SIZE", "4"}};
const Env kHsdp = {{"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_DP_SHARD_SIZE", "2"}};

// The run of one process both test cases compare with, made once; the scratch directory goes
// when the test program ends.
const Run& reference() {
  static const Run ref = [] {
    g_root = "/tmp/accel-hsdp-" + std::to_string(getpid());
    fs::remove_all(g_root);
    static struct Cleanup {
      ~Cleanup() { fs::remove_all(g_root); }
    } cleanup;
    return train("ref", 1, "ddp", {}, 0, 20);
  }();
  REQUIRE(ref.losses.size() == 40);
  REQUIRE(ref.clips.size() == 20);
  // The clipping must act (else a wrong norm would go unseen): the norms exceed max_norm 0.1.
  for (const auto& [step, norm] : ref.clips) CHECK(norm > 0.1);
  return ref;
}

}  // namespace

TEST_CASE("HSDP: dp 4, shard 4, replicate 2 x shard 2 (FSDP, ZeRO-2) equal one process") {
  const Run& ref = reference();
  {
    struct Mesh {
      const char* name;
      const char* strategy;
      Env env;
    };
    Env hsdp_ckpt = kHsdp;
    hsdp_ckpt["HSDP_CHECKPOINTING"] = "1";  // FSDP activation checkpointing on HSDP
    const std::vector<Mesh> meshes = {
        {"ddp4", "ddp", {}},
        {"fsdp4", "fsdp", kShard4},
        {"fsdp2x2", "fsdp", hsdp_ckpt},
        {"zero2x2", "zero2", kHsdp},
        // ZeRO-1's replicate leg (whole buckets), over shard
        // groups of one
        {"zero1-replicate4", "zero1", {{"ACCEL_DP_REPLICATE_SIZE", "4"}}}};
    for (const Mesh& m : meshes) {
      const std::string name = m.name;
      CAPTURE(name);
      const Run r = train(m.name, 4, m.strategy, m.env, 0, 20);
      check_losses(ref, r, 0, 40);
      check_weights(ref.dir + "/final.safetensors", r.dir + "/final.safetensors", 1e-10);
      if (std::string(m.name).find("2x2") == std::string::npos) continue;
      // Note [hsdp]: per step a rank sends its gradient shard across replicas (the all-reduce of
      // one shard, about 1/2 of the model on shard 2), nothing else.
      for (const RankResult& rank : r.ranks) {
        INFO(rank.output);
        const auto bytes = values(rank.output, "rbytes");
        REQUIRE(bytes.size() == 20);
        std::istringstream mem(rank.output.substr(rank.output.find("grad_bytes ")));
        std::string k1, k2;
        long long grad_bytes = 0, model_bytes = 0;
        mem >> k1 >> grad_bytes >> k2 >> model_bytes;
        REQUIRE(model_bytes > 0);
        for (const auto& [step, b] : bytes) {
          CAPTURE(step);
          CHECK(b == double(grad_bytes));  // the gradient shard the rank holds
          CHECK(b < 0.6 * double(model_bytes));
          CHECK(b > 0.4 * double(model_bytes));
        }
      }
    }
  }
  // Mixed precision on HSDP: bf16 compute parameters, float64 masters, gradients reduced in the
  // master dtype (reduce_in_fp32). Not equal to the float64 run, but close (bf16 keeps 8 bits);
  // the bytes across replicas are still one master-dtype gradient shard per step.
  Env bf16 = kHsdp;
  bf16["HSDP_BF16"] = "1";
  const Run r = train("fsdp2x2bf16", 4, "fsdp", bf16, 0, 20);
  for (int m = 0; m < 40; ++m) {
    CAPTURE(m);
    REQUIRE(r.losses.count(m));
    CHECK(std::abs(r.losses.at(m) - ref.losses.at(m)) <= 0.05);
  }
  for (const RankResult& rank : r.ranks) {
    const auto bytes = values(rank.output, "rbytes");
    const auto at = rank.output.find("grad_bytes ");
    REQUIRE(at != std::string::npos);
    const long long grad_bytes = std::atoll(rank.output.c_str() + at + 11);
    REQUIRE(bytes.size() == 20);
    for (const auto& [step, b] : bytes) CHECK(b == double(grad_bytes));
  }
}

// The data files holding pieces of the format-2 checkpoint's tensors named `prefix`...
std::set<int> piece_files(const std::string& ckpt, const std::string& prefix) {
  const nlohmann::json j = nlohmann::json::parse(accel::test::read_file(ckpt + "/index.json"));
  std::set<int> out;
  for (auto it = j.at("tensors").begin(); it != j.at("tensors").end(); ++it)
    if (it.key().rfind(prefix, 0) == 0)
      for (const auto& p : it->at("pieces")) out.insert(p.at("file").get<int>());
  return out;
}

TEST_CASE("HSDP checkpoints: FSDP 2x2 -> 1 process -> shard 4 -> dp 4 (ddp); ZeRO-2 2x2 -> 1") {
  const Run& ref = reference();
  {
    const std::string ck_a = g_root + "/ck_a", ck_b = g_root + "/ck_b", ck_c = g_root + "/ck_c";
    const Run a = train("a", 4, "fsdp", kHsdp, 0, 10, "-", ck_a, 10);
    check_losses(ref, a, 0, 20);
    // Format 2: one copy of each shard, from replica 0's 2 ranks.
    CHECK(piece_files(ck_a, "model.").size() == 2);
    const Run b = train("b", 1, "ddp", {}, 10, 13, ck_a, ck_b, 13);
    check_weights(a.dir + "/saved.safetensors", b.dir + "/loaded.safetensors", 0);
    check_losses(ref, b, 20, 26);
    const Run c = train("c", 4, "fsdp", kShard4, 13, 16, ck_b, ck_c, 16);
    check_weights(b.dir + "/saved.safetensors", c.dir + "/loaded.safetensors", 0);
    check_losses(ref, c, 26, 32);
    const Run d = train("d", 4, "ddp", {}, 16, 20, ck_c);
    check_weights(c.dir + "/saved.safetensors", d.dir + "/loaded.safetensors", 0);
    check_losses(ref, d, 32, 40);
    check_weights(ref.dir + "/final.safetensors", d.dir + "/final.safetensors", 1e-10);

    const std::string ck_z = g_root + "/ck_z";
    const Run z = train("z", 4, "zero2", kHsdp, 0, 10, "-", ck_z, 10);
    CHECK(piece_files(ck_z, "optim.0.").size() == 2);
    const Run y = train("y", 1, "ddp", {}, 10, 20, ck_z);
    check_weights(z.dir + "/saved.safetensors", y.dir + "/loaded.safetensors", 0);
    check_losses(ref, y, 20, 40);
    check_weights(ref.dir + "/final.safetensors", y.dir + "/final.safetensors", 1e-10);
  }
}

// Note [hsdp]: a replicate group that is the shard group itself (or shares more than this rank
// with it) is refused by name, by FSDP and by ZeRO.
TEST_CASE("HSDP: a replicate group that is the shard group is a ValueError") {
  using namespace accel;
  auto world = dist::init_process_group();
  auto model = std::make_shared<nn::Linear>(3, 2);
  dist::FsdpOptions fo;
  fo.replicate = world;
  CHECK_THROWS_WITH_AS(dist::FullyShardedModel(model, world, fo),
                       doctest::Contains("the replicate group is the shard group itself"),
                       ValueError);
  dist::ZeroOptions zo;
  zo.stage = 2;
  zo.replicate = world;
  auto make = [](std::vector<Tensor> shards) {
    return std::make_unique<optim::SGD>(std::move(shards), optim::SGDOptions(0.1));
  };
  CHECK_THROWS_WITH_AS(dist::ZeroOptimizer(model, make, world, zo),
                       doctest::Contains("the replicate group is the shard group itself"),
                       ValueError);
  // Groups that meet in this rank only are fine (two groups of one here).
  zo.replicate = dist::new_group({0});
  dist::ZeroOptimizer ok(model, make, dist::new_group({0}), zo);
  CHECK(ok.stage() == 2);
  world.reset();
  dist::destroy_process_group();
}
