// Format-1 checkpoints read as pieces (parallel/checkpoint/legacy.h, Note [format-1 checkpoints
// as pieces]): the committed fixtures (tests/parallel/fixtures/legacy/README.md; saved by main's
// format-1 save_state on 1 process, ZeRO-2 at 2, ZeRO-2 over 2 replicas x 2, ZeRO-3 at 2, HSDP 2x2,
// tp 2 x shard 2 and tp 2 x DDP 2; three more inside an accumulation window) hold, model and
// optimizer state alike, exactly the tensors the format-1 loader read from them
// (expected.safetensors), whole and in other regions, bit for bit; hostile optimizer files
// (truncated shards, lies in records and entries, links, a run that does not match) are refused by
// name. One process, no old code run.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "examples/models.h"
#include "io/safetensors.h"
#include "optim/adam.h"
#include "parallel/checkpoint/legacy.h"
#include "parallel/checkpoint/names.h"
#include "tests/common/util.h"
#include "tests/parallel/legacy_model.h"
#include "tests/parallel/region_steps.h"

using namespace accel;
using namespace accel::dist;
using accel::test::contains;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy";
const std::vector<std::string> kMeshes = {"one",     "zero2",     "hsdp-zero2", "zero3",
                                          "hsdp2x2", "tp2shard2", "tp2dp2"};
constexpr size_t kBucketCapBytes = 1024;  // make_legacy_fixture's

// make_legacy_fixture's model and optimizer (not trained: the context needs names and groups).
ckpt::LegacyContext context(size_t cap = kBucketCapBytes) {
  auto model = accel::test::legacy_model();
  auto opt = accel::test::legacy_optimizer(*model);
  return ckpt::legacy_context({model}, {opt.get()}, cap);
}

void expect_bytes_equal(const Tensor& want, const Tensor& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.sizes() == want.sizes());
  const Tensor x = want.contiguous(), y = got.contiguous();
  CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * dtype_size(x.dtype())) == 0);
}

Tensor read(ckpt::CheckpointSource& src, const std::string& name, const Region& r) {
  Tensor t = empty(r.local_shape(), TensorOptions(src.tensor(name).dtype));
  src.read(name, r, t);
  return t;
}

// A copy of fixture `mesh`'s checkpoint to edit.
std::string copy_of(const test::TempDir& tmp, const std::string& mesh) {
  static int n = 0;
  const std::string dst = tmp.str() + "/" + mesh + "-" + std::to_string(n++);
  fs::copy(kFixtures + "/" + mesh + "/ckpt", dst, fs::copy_options::recursive);
  return dst;
}

// Rewrites entry `key` of a safetensors file (a lie the format-1 files cannot reveal by their
// header alone).
void edit(const std::string& file, const std::string& key, const Tensor& value) {
  io::TensorDict d = io::load_safetensors(file);
  if (value.defined()) {
    d[key] = value;
  } else {
    d.erase(key);
  }
  fs::remove(file);
  io::save_safetensors(file, d);
}

void edit_state(const std::string& dir, const std::function<void(nlohmann::json&)>& fn) {
  nlohmann::json s = nlohmann::json::parse(test::read_file(dir + "/state.json"));
  fn(s);
  test::write_file(dir + "/state.json", s.dump());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return std::string("IoError: ") + e.what();
  } catch (const ValueError& e) {
    return std::string("ValueError: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE(
    "legacy: every fixture's model and optimizer tensors read bit for bit, whole and in parts") {
  const ckpt::LegacyContext ctx = context();
  for (const std::string& mesh : kMeshes) {
    INFO(mesh);
    auto src = ckpt::open_legacy(kFixtures + "/" + mesh + "/ckpt", ctx);
    const io::TensorDict want =
        io::load_safetensors(kFixtures + "/" + mesh + "/expected.safetensors");
    std::vector<std::string> names;
    for (const auto& [n, t] : want) names.push_back(n);
    CHECK(src->names() == names);
    size_t optim = 0;
    for (const auto& [name, w] : want) {
      INFO(name);
      if (name.rfind("optim.", 0) == 0) ++optim;
      REQUIRE(src->contains(name));
      const ckpt::TensorRecord& rec = src->tensor(name);
      REQUIRE(rec.dtype == w.dtype());
      REQUIRE(rec.shape == w.sizes());
      expect_bytes_equal(w, read(*src, name, Region::whole(rec.shape)), "whole");
      if (rec.shape.empty()) continue;
      // tp 2's shards along dim 0 (where they divide), and a flat span.
      if (rec.shape[0] % 2 == 0)
        for (int64_t i = 0; i < 2; ++i) {
          const int64_t n = rec.shape[0] / 2;
          expect_bytes_equal(w.narrow(0, i * n, n),
                             read(*src, name, Region::whole(rec.shape).shard(0, 1, 2, i)),
                             "shard " + std::to_string(i));
        }
      const int64_t numel = w.numel(), lo = numel / 3, hi = numel - numel / 5;
      expect_bytes_equal(w.reshape({-1}).narrow(0, lo, hi - lo),
                         read(*src, name, Region::whole(rec.shape).flat(lo, hi)), "flat");
      // The regions ranks of other meshes read (tp 2 with qkv's 3 chunks, tp 2 x 2 over two dims,
      // tp 2 then a ZeRO-3 span), against the brute-force element map of tests/parallel.
      const int64_t last = int64_t(rec.shape.size()) - 1;
      std::vector<test::Steps> regions;
      for (int64_t t = 0; t < 2; ++t) {
        regions.push_back({rec.shape, {{0, rec.shape[0] % 3 == 0 ? 3 : 1, 2, t}}});
        regions.push_back({rec.shape, {{0, 1, 2, t}, {last, 1, 2, 1 - t}}});
        test::Steps s{rec.shape, {{0, 1, 3, t}}};
        const int64_t local = shape_numel(s.region().box_shape());
        s.flat_lo = local / 4;
        s.flat_hi = local - local / 3;
        regions.push_back(s);
      }
      const Tensor flat = w.reshape({-1});
      for (const test::Steps& s : regions) {
        const std::vector<int64_t> at = s.offsets();
        const Tensor idx = tensor(at, Shape{int64_t(at.size())});
        expect_bytes_equal(index_select(flat, 0, idx).reshape(s.region().local_shape()),
                           read(*src, name, s.region()), s.region().str());
      }
    }
    // 17 parameters: exp_avg, exp_avg_sq and step each; 2 groups of lr, weight_decay, params.
    CHECK(optim == 17 * 3 + 6);
    Tensor step = empty({}, TensorOptions(kInt64));
    src->read("optim.0.0.head.weight.step", Region::whole({}), step);
    CHECK(step.item<int64_t>() == 3);
    // Values convert on the way (float32 here), as the format-2 reader's do.
    const std::string slot = ckpt::names::optim_slot(0, 0, "blocks.0.attn.qkv.weight", "exp_avg");
    Tensor f = empty(src->tensor(slot).shape, TensorOptions(kFloat32));
    src->read(slot, Region::whole(f.sizes()), f);
    CHECK(f.equal(want.at(slot).to(kFloat32)));
  }
}

TEST_CASE("legacy: the layouts are the records' (buckets, spans, tp cuts)") {
  const ckpt::LegacyContext ctx = context();
  auto zero2 = ckpt::open_legacy(kFixtures + "/zero2/ckpt", ctx);
  // A ZeRO-2 slot's pieces: the slices of the bucket slices of both ranks that meet the parameter.
  const ckpt::TensorRecord& r =
      zero2->tensor(ckpt::names::optim_slot(0, 0, "blocks.0.fc.weight", "exp_avg"));
  int64_t n = 0;
  for (const auto& p : r.pieces) {
    CHECK(p.region.is_flat());
    CHECK(contains(p.entry, "exp_avg"));
    n += p.region.numel();
  }
  CHECK(n == 256);
  CHECK(r.pieces.size() == 2);  // its bucket holds it alone, split over 2 ranks
  auto tp = ckpt::open_legacy(kFixtures + "/tp2shard2/ckpt", ctx);
  const ckpt::TensorRecord& q =
      tp->tensor(ckpt::names::optim_slot(0, 0, "blocks.0.attn.qkv.weight", "exp_avg_sq"));
  CHECK(q.layout == "tp: Shard(0, chunks=3), dp_shard: Flat");
  CHECK(q.shape == Shape{24, 8});
  // Without a context: the model only.
  auto model_only = ckpt::open_legacy(kFixtures + "/zero2/ckpt");
  for (const std::string& name : model_only->names()) CHECK(name.rfind("model.0.", 0) == 0);
  CHECK(model_only->names().size() == 17);
}

TEST_CASE("legacy: truncated optimizer shards are refused naming the file") {
  const ckpt::LegacyContext ctx = context();
  test::TempDir tmp("legacy");
  for (const auto& [mesh, file] : std::vector<std::pair<std::string, std::string>>{
           {"zero2", "zero_optimizer_rank1.safetensors"},
           {"zero3", "fsdp_optimizer_rank1.safetensors"},
           {"hsdp2x2", "fsdp_optimizer_rank0.safetensors"},
           {"tp2dp2", "tp1/optimizer.safetensors"},
           {"one", "optimizer.safetensors"}}) {
    INFO(mesh);
    const std::string dir = copy_of(tmp, mesh);
    fs::resize_file(dir + "/" + file, fs::file_size(dir + "/" + file) - 8);
    const std::string e = error_of([&] {
      auto src = ckpt::open_legacy(dir, ctx);
      for (const std::string& n : src->names()) read(*src, n, Region::whole(src->tensor(n).shape));
    });
    CHECK_MESSAGE((contains(e, "IoError") && contains(e, file)), e);
  }
}

TEST_CASE("legacy: lies in optimizer records and entries are refused") {
  const ckpt::LegacyContext ctx = context();
  test::TempDir tmp("legacy");
  auto refused = [&](const std::string& dir, const std::vector<std::string>& words,
                     const char* kind = "IoError") {
    const std::string e = error_of([&] { ckpt::open_legacy(dir, ctx); });
    CHECK_MESSAGE(contains(e, kind), e);
    for (const std::string& w : words) CHECK_MESSAGE(contains(e, w), e);
  };
  {  // ZeRO-2: the ranks' steps of one bucket differ
    const std::string dir = copy_of(tmp, "zero2");
    edit(dir + "/zero_optimizer_rank1.safetensors", "state.2.step", scalar_tensor(2, kInt64));
    refused(dir, {"zero_optimizer_rank1.safetensors", "state.2.step is 2", "3"});
  }
  {  // ZeRO-2: a slot slice missing on one rank
    const std::string dir = copy_of(tmp, "zero2");
    edit(dir + "/zero_optimizer_rank1.safetensors", "state.4.exp_avg", Tensor());
    refused(dir, {"zero_optimizer_rank1.safetensors", "bucket 4"});
  }
  {  // ZeRO-2: a slice of another size, of another dtype
    const std::string dir = copy_of(tmp, "zero2");
    edit(dir + "/zero_optimizer_rank0.safetensors", "state.1.exp_avg_sq",
         zeros({3}, TensorOptions(kFloat64)));
    refused(dir, {"zero_optimizer_rank0.safetensors", "state.1.exp_avg_sq", "(3,)"});
    const std::string dir2 = copy_of(tmp, "zero2");
    edit(dir2 + "/zero_optimizer_rank1.safetensors", "state.1.exp_avg",
         zeros({32}, TensorOptions(kFloat32)));
    refused(dir2, {"zero_optimizer_rank1.safetensors", "float32, rank 0's float64"});
  }
  {  // ZeRO-2: the record's bucket sizes lie (still a valid layout over 2 ranks)
    const std::string dir = copy_of(tmp, "zero2");
    edit_state(dir, [](nlohmann::json& s) { s["zero"][0]["buckets"][1] = {63, 64}; });
    refused(dir, {"do not match"}, "ValueError");
    edit_state(dir, [](nlohmann::json& s) { s["zero"][0]["buckets"][1] = {64, 66}; });
    refused(dir, {"zero[0].buckets[1]"});
    edit_state(dir, [](nlohmann::json& s) {
      s["zero"][0]["buckets"][1] = {64, 64};
      s["zero_world"] = 3;
    });
    refused(dir, {"zero_world"});
  }
  {  // ZeRO-3: the optimizer's parameters swapped in the record (other spans)
    const std::string dir = copy_of(tmp, "zero3");
    edit_state(dir, [](nlohmann::json& s) {
      auto& p = s["fsdp"]["optimizers"][0]["params"];
      std::swap(p[0], p[4]);
    });
    refused(dir, {"fsdp_optimizer_rank", "state.0.exp_avg"});
    edit_state(dir, [](nlohmann::json& s) {
      s["fsdp"]["optimizers"][0]["params"][0] = "0:no.such.weight";
    });
    refused(dir, {"fsdp.optimizers[0].params[0]"});
  }
  {  // ZeRO-3: a rank's slice missing, a step that is no integer, a slice of another size
    const std::string dir = copy_of(tmp, "hsdp2x2");
    edit(dir + "/fsdp_optimizer_rank1.safetensors", "state.1.exp_avg_sq", Tensor());
    refused(dir, {"fsdp_optimizer_rank1.safetensors", "state.1.exp_avg_sq"});
    const std::string dir2 = copy_of(tmp, "zero3");
    edit(dir2 + "/fsdp_optimizer_rank0.safetensors", "state.3.step", scalar_tensor(3.0, kFloat64));
    refused(dir2, {"fsdp_optimizer_rank0.safetensors", "state.3.step must be one integer"});
    const std::string dir3 = copy_of(tmp, "zero3");  // a slice longer than its span
    edit(dir3 + "/fsdp_optimizer_rank0.safetensors", "state.2.exp_avg",
         zeros({100}, TensorOptions(kFloat64)));
    refused(dir3, {"fsdp_optimizer_rank0.safetensors", "state.2.exp_avg", "(100,)", "(192,)"});
  }
  {  // tp: a slot of a cut parameter of another shape at one tp index; state not per parameter
    const std::string dir = copy_of(tmp, "tp2dp2");
    edit(dir + "/tp1/optimizer.safetensors", "state.4.exp_avg",
         zeros({12, 4}, TensorOptions(kFloat64)));
    refused(dir, {"tp1/optimizer.safetensors", "blocks.0.fc.weight.exp_avg"});
    const std::string dir2 = copy_of(tmp, "tp2shard2");
    edit(dir2 + "/tp0/fsdp_optimizer_rank0.safetensors", "state.lbfgs.d", zeros({4}));
    refused(dir2, {"state.lbfgs.d", "tp"});
    const std::string dir3 = copy_of(tmp, "one");  // outside tp: whole
    edit(dir3 + "/optimizer.safetensors", "state.lbfgs.d", zeros({4}));
    CHECK(ckpt::open_legacy(dir3, ctx)->contains("optim.0.opaque.lbfgs.d"));
  }
  {  // plain: a step that is a float, a slot that is an integer
    const std::string dir = copy_of(tmp, "one");
    edit(dir + "/optimizer.safetensors", "state.0.step", scalar_tensor(3.0, kFloat64));
    refused(dir, {"optimizer.safetensors", "state.0.step"});
  }
}

TEST_CASE("legacy: links to optimizer files are refused, inside tp folders too") {
  const ckpt::LegacyContext ctx = context();
  test::TempDir tmp("legacy");
  for (const auto& [mesh, file] : std::vector<std::pair<std::string, std::string>>{
           {"zero2", "zero_optimizer_rank1.safetensors"},
           {"tp2dp2", "tp0/optimizer.safetensors"},
           {"tp2shard2", "tp1/fsdp_optimizer_rank1.safetensors"}}) {
    INFO(mesh);
    const std::string dir = copy_of(tmp, mesh);
    const std::string real = tmp.str() + "/elsewhere-" + mesh;
    fs::rename(dir + "/" + file, real);
    fs::create_symlink(real, dir + "/" + file);
    const std::string e = error_of([&] { ckpt::open_legacy(dir, ctx); });
    CHECK_MESSAGE((contains(e, "IoError") && contains(e, file) && contains(e, "link")), e);
  }
}

TEST_CASE("legacy: a run whose optimizers do not match the checkpoint is told so") {
  test::TempDir tmp("legacy");
  // Another bucket cap: other buckets than the save's.
  std::string e = error_of([] { ckpt::open_legacy(kFixtures + "/zero2/ckpt", context(4096)); });
  CHECK_MESSAGE((contains(e, "ValueError") && contains(e, "ddp.bucket_cap_bytes")), e);
  // The parameters in another order: other buckets.
  ckpt::LegacyContext reordered = context();
  std::reverse(reordered.optimizers[0].begin(), reordered.optimizers[0].end());
  e = error_of([&] { ckpt::open_legacy(kFixtures + "/zero2/ckpt", reordered); });
  CHECK_MESSAGE(contains(e, "do not match"), e);
  // No optimizer, or fewer parameters than the plain file holds state for.
  ckpt::LegacyContext none = context();
  none.optimizers.clear();
  e = error_of([&] { ckpt::open_legacy(kFixtures + "/one/ckpt", none); });
  CHECK_MESSAGE(contains(e, "holds 1 optimizer(s), this run prepared 0"), e);
  ckpt::LegacyContext fewer = context();
  fewer.optimizers[0].resize(5);
  e = error_of([&] { ckpt::open_legacy(kFixtures + "/one/ckpt", fewer); });
  CHECK_MESSAGE((contains(e, "ValueError") && contains(e, "has 5 parameters")), e);
  // A parameter the model does not hold.
  ckpt::LegacyContext stranger = context();
  stranger.optimizers[0][0].name = "no.such.weight";
  e = error_of([&] { ckpt::open_legacy(kFixtures + "/zero2/ckpt", stranger); });
  CHECK_MESSAGE(contains(e, "'no.such.weight'"), e);
  // A tensor of no prepared model: its plain state is opaque; under ZeRO it has no name to load by.
  optim::AdamW stray({zeros({2})}, {});
  const ckpt::LegacyContext strays = ckpt::legacy_context({}, {&stray}, 1024);
  REQUIRE(strays.optimizers.size() == 1);
  CHECK(strays.optimizers[0].at(0).name.empty());
  ckpt::LegacyContext opaque = context();
  opaque.optimizers[0][3].name.clear();
  auto src = ckpt::open_legacy(kFixtures + "/one/ckpt", opaque);
  CHECK(src->contains("optim.0.opaque.3.exp_avg"));
  CHECK(src->contains("optim.0.opaque.3.step"));
  CHECK_FALSE(src->contains("optim.0.0.blocks.0.attn.proj.weight.exp_avg"));
  e = error_of([&] { ckpt::open_legacy(kFixtures + "/zero2/ckpt", opaque); });
  CHECK_MESSAGE(contains(e, "parameter 3 is no parameter of a prepared model"), e);
}

TEST_CASE("legacy: gradients of an accumulation window, per rank, named by world rank") {
  const ckpt::LegacyContext ctx = context();
  struct Window {
    std::string mesh;
    int64_t tp, ranks;  // tp folders, ranks per folder
    std::string grads;  // the per-rank gradient files' stem
  };
  for (const Window& w : std::vector<Window>{{"window-zero2", 1, 2, "grads"},
                                             {"window-tp2dp2", 2, 2, "grads"},
                                             {"window-zero3", 1, 2, "fsdp_grads"}}) {
    INFO(w.mesh);
    const std::string dir = kFixtures + "/" + w.mesh + "/ckpt";
    auto src = ckpt::open_legacy(dir, ctx);
    // What every rank's files hold, named as fmt 2 names a rank's window (tp innermost).
    std::map<std::string, Tensor> want;
    for (int64_t t = 0; t < w.tp; ++t)
      for (int64_t r = 0; r < w.ranks; ++r) {
        const std::string sub = w.tp > 1 ? dir + "/tp" + std::to_string(t) : dir;
        const int64_t rank = r * w.tp + t;
        for (auto& [n, g] : io::load_safetensors(sub + "/" + w.grads + "_rank" + std::to_string(r) +
                                                 ".safetensors"))
          want[ckpt::names::grad_of_rank(0, n, rank)] = g;
        const std::string acc = sub + "/zero_grads_rank" + std::to_string(r) + ".safetensors";
        if (fs::exists(acc))
          for (auto& [n, g] : io::load_safetensors(acc))
            want[ckpt::names::zero_accum_of_rank(0, std::stoul(n.substr(7)), rank)] = g;
      }
    CHECK(want.size() >= 14);  // a gradient per parameter, or a shard per bucket (7), per rank
    std::vector<std::string> got, expected;
    for (const std::string& n : src->names())
      if (n.rfind("grad.", 0) == 0) got.push_back(n);
    for (const auto& [n, g] : want) expected.push_back(n);
    CHECK(got == expected);
    for (const auto& [n, g] : want)
      expect_bytes_equal(g, read(*src, n, Region::whole(g.sizes())), n);
    // The model and optimizer as in a save at a sync point.
    CHECK(src->contains(ckpt::names::optim_step(0, 0, "head.weight")));
  }
  // Saved at a sync point: no gradients.
  for (const std::string& n : ckpt::open_legacy(kFixtures + "/zero2/ckpt", ctx)->names())
    CHECK(n.rfind("grad.", 0) != 0);
  // Hostile: a shard that is not "bucket.<b>", a gradient that is no floating-point tensor.
  test::TempDir tmp("legacy");
  const std::string dir = copy_of(tmp, "window-zero2");
  edit(dir + "/zero_grads_rank1.safetensors", "bucket.x", zeros({2}));
  std::string e = error_of([&] { ckpt::open_legacy(dir, ctx); });
  CHECK_MESSAGE((contains(e, "zero_grads_rank1.safetensors") && contains(e, "'bucket.x'")), e);
  const std::string dir2 = copy_of(tmp, "window-tp2dp2");
  edit(dir2 + "/tp1/grads_rank0.safetensors", "ln_f.bias", zeros({8}, TensorOptions(kInt64)));
  e = error_of([&] { ckpt::open_legacy(dir2, ctx); });
  CHECK_MESSAGE((contains(e, "tp1/grads_rank0.safetensors") && contains(e, "ln_f.bias")), e);
  // A gradient of another shape than its parameter, a shard of another size than its bucket's.
  const std::string dir3 = copy_of(tmp, "window-tp2dp2");
  edit(dir3 + "/tp0/grads_rank1.safetensors", "blocks.0.fc.weight", zeros({32, 8}));
  e = error_of([&] { ckpt::open_legacy(dir3, ctx); });
  CHECK_MESSAGE((contains(e, "tp0/grads_rank1.safetensors") && contains(e, "(16, 8)")), e);
  const std::string dir4 = copy_of(tmp, "window-zero2");
  edit(dir4 + "/zero_grads_rank0.safetensors", "bucket.2", zeros({5}, TensorOptions(kFloat64)));
  e = error_of([&] { ckpt::open_legacy(dir4, ctx); });
  CHECK_MESSAGE((contains(e, "zero_grads_rank0.safetensors") && contains(e, "'bucket.2' is (5,)")),
                e);
}
