// Format-1 checkpoints through Accelerator::load_state (issue 37: one load path for both formats;
// Note [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h). Each committed fixture of
// tests/parallel/fixtures/legacy/ is loaded by legacy_worker ranks at one process and at tp 2 x
// shard 2 (tp x ZeRO-3: the old converter's bug B1) and re-saved in format 2: every tensor the
// format-1 loader read from it (expected.safetensors) comes back bit for bit, and the training
// continued from it equals one process's. The accumulation-window fixtures resume on their own
// mesh with their per-rank gradients, and refuse another tp size.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "accelerate/accelerator.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "examples/models.h"
#include "io/safetensors.h"
#include "optim/adam.h"
#include "parallel/checkpoint/legacy.h"
#include "parallel/checkpoint/names.h"
#include "parallel/checkpoint/reader.h"
#include "tests/common/spawn.h"
#include "tests/common/util.h"
#include "tests/parallel/legacy_model.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using namespace accel;
using accel::test::check_ok;
using accel::test::run_world;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy";
using Env = std::map<std::string, std::string>;

std::string worker() { return accel::test::helper_path("legacy_worker"); }

std::string scratch() {
  static const accel::test::TempDir s("legacy-load");
  return s.str();
}

// Runs legacy_worker on fixture `mesh` at `world` ranks with `env`; returns its output folder.
std::string load(const std::string& mesh, const std::string& tag, int world, const Env& env,
                 int steps = 2) {
  const std::string out = scratch() + "/" + mesh + "-" + tag;
  fs::create_directories(out);
  // A copy: load_state must not need to write into the fixture (and cannot change it).
  const std::string ckpt = out + "/ckpt";
  fs::copy(kFixtures + "/" + mesh + "/ckpt", ckpt, fs::copy_options::recursive);
  auto res = run_world(worker(), {ckpt, out, std::to_string(steps)}, world, env, 180s);
  check_ok(res, "legacy_worker");
  return out;
}

std::vector<double> losses(const std::string& out) {
  std::ifstream in(out + "/losses.txt");
  REQUIRE_MESSAGE(in.good(), "no losses in ", out);
  std::vector<double> v;
  std::string word;
  int step = 0;
  double x = 0;
  while (in >> word >> step >> x) v.push_back(x);
  return v;
}

void expect_bytes_equal(const Tensor& want, const Tensor& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.sizes() == want.sizes());
  const Tensor x = want.contiguous(), y = got.contiguous();
  CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * dtype_size(x.dtype())) == 0);
}

Tensor read_whole(dist::ckpt::CheckpointSource& src, const std::string& name) {
  const dist::ckpt::TensorRecord& r = src.tensor(name);
  Tensor t = empty(r.shape, TensorOptions(r.dtype));
  src.read(name, dist::Region::whole(r.shape), t);
  return t;
}

// Every tensor of expected.safetensors is in the format-2 checkpoint the worker re-saved, bit for
// bit.
void check_resaved(const std::string& mesh, const std::string& out) {
  const io::TensorDict want =
      io::load_safetensors(kFixtures + "/" + mesh + "/expected.safetensors");
  REQUIRE(want.size() > 10);
  auto src = dist::ckpt::open_checkpoint(out + "/resaved");
  for (const auto& [name, t] : want) {
    INFO(mesh, ": ", name);
    REQUIRE(src->contains(name));
    expect_bytes_equal(t, read_whole(*src, name), mesh + " " + name);
  }
}

// make_legacy_fixture's model and optimizer (names and groups: the legacy context).
dist::ckpt::LegacyContext context() {
  auto model = accel::test::legacy_model();
  auto opt = accel::test::legacy_optimizer(*model);
  return dist::ckpt::legacy_context({model}, {opt.get()}, 1024);
}

const Env kTp2Shard2 = {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}};
const std::vector<std::string> kMeshes = {"one",     "zero2",     "hsdp-zero2", "zero3",
                                          "hsdp2x2", "tp2shard2", "tp2dp2"};

}  // namespace

TEST_CASE("every format-1 fixture loads at one process and at tp 2 x shard 2, bit for bit") {
  for (const std::string& mesh : kMeshes) {
    const std::string one = load(mesh, "one", 1, {});
    check_resaved(mesh, one);
    const std::string tp = load(mesh, "tp2shard2", 4, kTp2Shard2);
    check_resaved(mesh, tp);
    // The continued training: the same steps on both meshes (float64; tp x ZeRO-3 reduces in
    // another order).
    const std::vector<double> a = losses(one), b = losses(tp);
    REQUIRE(a.size() == 2);
    REQUIRE(b.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(mesh, " loss ", i, ": ", a[i], " vs ", b[i]);
      CHECK(std::abs(a[i] - b[i]) <= 1e-12 * std::max(1.0, std::abs(a[i])));
    }
  }
}

TEST_CASE("format-1 accumulation windows resume on their mesh with their gradients") {
  struct Window {
    const char* mesh;
    int world;
    Env env;
  };
  const std::vector<Window> windows = {
      {"window-zero2", 2, {{"ACCEL_ZERO_STAGE", "2"}}},
      {"window-zero3", 2, {{"ACCEL_ZERO_STAGE", "3"}}},
      {"window-tp2dp2", 4, {{"ACCEL_TP_SIZE", "2"}}},
  };
  for (const Window& w : windows) {
    Env env = w.env;
    env["ACCEL_GRADIENT_ACCUMULATION_STEPS"] = "2";
    // One micro-batch: the window closes with the loaded gradients in it.
    const std::string out = load(w.mesh, "same", w.world, env, 1);
    auto src = dist::ckpt::open_checkpoint(out + "/resaved");
    // The gradients as format 1 held them (open_legacy: the test's own reading of the fixture).
    auto legacy = dist::ckpt::open_legacy(kFixtures + "/" + w.mesh + "/ckpt", context());
    size_t grads = 0;
    for (const std::string& n : legacy->names()) {
      if (n.rfind("grad.", 0) != 0) continue;
      ++grads;
      INFO(w.mesh, ": ", n);
      REQUIRE(src->contains(n));
      expect_bytes_equal(read_whole(*legacy, n), read_whole(*src, n), n);
    }
    INFO(w.mesh);
    CHECK(grads > 0);
    CHECK(src->meta()["sync_gradients"] == false);
  }
  // The same world at another tp size: refused by name, on every rank.
  const std::string out = scratch() + "/window-tp2dp2-dp4";
  fs::create_directories(out);
  fs::copy(kFixtures + "/window-tp2dp2/ckpt", out + "/ckpt", fs::copy_options::recursive);
  auto res = run_world(worker(), {out + "/ckpt", out, "1"}, 4,
                       {{"ACCEL_GRADIENT_ACCUMULATION_STEPS", "2"}}, 180s);
  for (const auto& r : res) {
    CHECK(r.code != 0);
    CHECK(accel::test::contains(r.output, "only resume at that tp_size"));
  }
}

// A format-1 tp checkpoint's record comes from a file: a tp size that does not divide the world, a
// split out of range, or no inner record fails the load by name on every rank (ckpt::open_legacy
// checks it as the format-1 strategy did); a link inside tp0/ or at the top is refused before
// anything is read; a file accel did not write inside tp0/ blocks a save that would replace the
// folder. (Moved from test_mesh_training, which made its tp checkpoint with the format-1 writer.)
TEST_CASE("format-1 tp checkpoints: a hostile record or a link fails the load by name") {
  const std::string dir = scratch() + "/hostile-ckpt";
  fs::copy(kFixtures + "/tp2shard2/ckpt", dir, fs::copy_options::recursive);
  const std::string state = dir + "/state.json";
  const std::string original = accel::test::read_file(state);
  struct Edit {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Edit> edits = {
      {"size 3", [](nlohmann::json& j) { j["tp"]["size"] = 3; }, "tp.size 3 does not divide"},
      {"size text", [](nlohmann::json& j) { j["tp"]["size"] = "2"; }, "tp.size must be a count"},
      {"dim 99",
       [](nlohmann::json& j) {
         auto& m = j["tp"]["models"][0];
         m[m.begin().key()]["dim"] = 99;
       },
       "out of range"},
      {"no inner", [](nlohmann::json& j) { j["tp"].erase("inner"); }, "tp.inner must be"},
  };
  auto load_fails = [&](const std::string& expect) {
    const std::string out = scratch() + "/hostile-out";
    fs::remove_all(out);
    fs::create_directories(out);
    auto res = run_world(worker(), {dir, out, "1"}, 4, {{"ACCEL_TP_SIZE", "4"}}, 120s);
    for (const auto& r : res) {
      CHECK(r.exited);
      CHECK(r.code == 3);
      CHECK_MESSAGE(accel::test::contains(r.output, expect), r.output);
    }
  };
  for (const Edit& e : edits) {
    CAPTURE(std::string(e.what));
    nlohmann::json j = nlohmann::json::parse(original);
    e.edit(j);
    accel::test::write_file(state, j.dump(2));
    load_fails(e.expect);
  }
  accel::test::write_file(state, original);
  // A link inside tp0/ (or at the top) is refused like a link at the top, before anything is read.
  for (const std::string sub : {"/tp0", ""}) {
    CAPTURE(sub);
    std::string victim;
    for (const auto& e : fs::directory_iterator(dir + sub)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name != "state.json" && name != ".accel_checkpoint")
        victim = e.path().string();
    }
    REQUIRE(!victim.empty());
    const std::string moved = scratch() + "/moved";
    fs::rename(victim, moved);
    fs::create_symlink(moved, victim);
    load_fails("'" + victim + "' is a symbolic link");
    fs::remove(victim);
    fs::rename(moved, victim);
  }
  // A file accel did not write inside tp0/: a save that would replace the folder refuses.
  const std::string target = scratch() + "/hostile-target";
  fs::create_directories(target);
  fs::copy(dir, target + "/resaved", fs::copy_options::recursive);
  accel::test::write_file(target + "/resaved/tp0/notes.txt", "mine");
  auto res = run_world(worker(), {dir, target, "1"}, 4, kTp2Shard2, 120s);
  for (const auto& r : res) {
    CHECK(r.code == 3);
    CHECK_MESSAGE(accel::test::contains(r.output, "tp0/"), r.output);
  }
  CHECK(fs::exists(target + "/resaved/tp0/notes.txt"));
}

// Checkpoints of versions before the global loader position hold each rank's loader state
// (loader_rank<r>.json, version 1: batches consumed of its dp shard): load_state converts rank 0's
// into the global position (Note [global loader position] in data/sampler.cc). No writer makes
// these any more: the 'one' fixture with such a file added.
TEST_CASE("format-1: a per-rank loader file of an earlier version resumes the loader") {
  const std::string dir = scratch() + "/loader-v1";
  fs::copy(kFixtures + "/one/ckpt", dir, fs::copy_options::recursive);
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = scratch();
  cfg.log_with = {};
  cfg.read_env = false;
  cfg.ddp.bucket_cap_bytes = 1024;
  Accelerator acc(cfg);
  auto model = accel::test::legacy_model();
  auto opt = accel::test::legacy_optimizer(*model);
  auto prepared = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  (void)prepared;
  data::DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = true;
  lo.seed = 3;
  Generator g(99);
  const Tensor seqs = randint(0, 8, {40, 5}, TensorOptions(kInt64), &g);
  auto loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{seqs}), lo));
  const data::StateDict pos = loader->state_dict();
  const nlohmann::json v1 = {{"version", "1"},
                             {"epoch", "0"},
                             {"batches_consumed", "3"},
                             {"seed", pos.at("seed")},
                             {"batch_size", "4"},
                             {"world_size", "1"},
                             {"rank", "0"},
                             {"sampler_size", pos.at("sampler_size")},
                             {"drop_last", "0"},
                             {"even_batches", "1"},
                             {"split_batches", "0"},
                             {"sampler.seed", pos.at("sampler.seed")}};
  accel::test::write_file(dir + "/loader_rank0.json", v1.dump());
  nlohmann::json state = nlohmann::json::parse(accel::test::read_file(dir + "/state.json"));
  state["num_loaders"] = 1;
  state["files"].push_back("loader_rank0.json");
  accel::test::write_file(dir + "/state.json", state.dump(2));
  CHECK(loader->batches_consumed() == 0);
  acc.load_state(dir);
  CHECK(loader->batches_consumed() == 3);
  CHECK(acc.step() == 3);
}
