// `accel-run merge-weights` (accelerate/merge_weights.h, Note [merge-weights]) over format-1
// checkpoints read as pieces (parallel/checkpoint/legacy.h, Note [format-1 checkpoints as
// pieces]): checkpoints of 1 process, ZeRO-3 over 4, HSDP 2 x 2, tp 2 x DDP 2 and tp 2 x ZeRO-3 2
// (tests/accelerate/mesh_worker ranks) merge into the tensors save_model exports at the same step,
// bit for bit; a capped merge writes transformers' sharded set and --split round-trips; tied
// names survive plain and ZeRO-3 checkpoints; bad input and foreign output folders are refused.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "accelerate/accelerator.h"
#include "accelerate/merge_weights.h"
#include "autograd/ops.h"
#include "core/generator.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/writer.h"
#include "tests/accelerate/training.h"
#include "tests/common/spawn.h"
#include "tests/common/scoped_env.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace std::chrono_literals;
using accel::test::contains;
namespace fs = std::filesystem;

namespace {

std::string scratch() {
  static const accel::test::TempDir s("merge-weights");
  return s.str();
}

struct Saved {
  std::string root;     // save_state's parent (holds `latest`)
  std::string ckpt;     // the checkpoint folder
  std::string export_;  // what save_model wrote at the same step
};

// Two optimizer steps of mesh_worker's GPT on `world` processes under `env`; the state saved after
// step 2 and the model exported at the end (the same step).
const Saved& saved(const std::string& tag, int world, const std::map<std::string, std::string>& env,
                   const std::vector<std::string>& extra = {}) {
  static std::map<std::string, Saved> cache;
  auto it = cache.find(tag);
  if (it != cache.end()) return it->second;
  Saved s;
  s.root = scratch() + "/" + tag;
  s.ckpt = s.root + "/ckpt";
  s.export_ = s.root + "/export.safetensors";
  fs::create_directories(s.root);
  std::vector<std::string> args = {
      s.root + "/out.txt", "2", "save", "2", s.ckpt, "export", s.export_};
  args.insert(args.end(), extra.begin(), extra.end());
  auto res =
      accel::test::run_world(accel::test::helper_path("mesh_worker"), args, world, env, 180s);
  accel::test::check_ok(res, "mesh_train");
  return cache.emplace(tag, s).first->second;
}

// Every tensor of `want` is in `got` under the same name with the same dtype, shape and bytes.
void expect_same_tensors(const io::TensorDict& want, const io::TensorDict& got) {
  std::vector<std::string> a, b;
  for (const auto& [n, t] : want) a.push_back(n);
  for (const auto& [n, t] : got) b.push_back(n);
  REQUIRE(a == b);
  for (const auto& [name, t] : want) {
    CAPTURE(name);
    const Tensor& u = got.at(name);
    REQUIRE(u.dtype() == t.dtype());
    REQUIRE(u.sizes() == t.sizes());
    const Tensor x = t.contiguous(), y = u.contiguous();
    CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * dtype_size(x.dtype())) == 0);
  }
}

// Every tensor of a sharded set (or single file), read through its index.
io::TensorDict read_set(const std::string& path) {
  const io::SafetensorsCheckpoint c(path);
  io::TensorDict out;
  for (const std::string& n : c.names()) {
    const io::SafetensorsFile::Info& in = c.info(n);
    Tensor t = empty(in.shape, TensorOptions(in.dtype));
    c.read_range(n, 0, in.numel, t);
    out[n] = t;
  }
  return out;
}

struct Mesh {
  const char* tag;
  int world;
  std::map<std::string, std::string> env;
};
const std::vector<Mesh>& meshes() {
  static const std::vector<Mesh> m = {
      {"one", 1, {}},
      {"shard4", 4, {{"ACCEL_ZERO_STAGE", "3"}}},
      {"hsdp2x2", 4, {{"ACCEL_DP_REPLICATE_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
      {"tp2dp2", 4, {{"ACCEL_TP_SIZE", "2"}}},
      {"tp2shard2", 4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "3"}}},
  };
  return m;
}

}  // namespace

TEST_CASE("merge-weights: every mesh's checkpoint merges to what save_model exports") {
  for (const Mesh& m : meshes()) {
    INFO(std::string(m.tag));
    const Saved& s = saved(m.tag, m.world, m.env);
    // The root resolves through `latest`, as load_state does.
    const std::string out = s.root + "/merged.safetensors";
    const merge::Written w = merge::merge_weights(s.root, out, {});
    io::Metadata meta;
    const io::TensorDict got = io::load_safetensors(out, &meta);
    expect_same_tensors(io::load_safetensors(s.export_), got);
    CHECK(w.tensors == got.size());
    CHECK_FALSE(w.indexed);
    CHECK(meta.at("format") == "pt");
  }
}

TEST_CASE("merge-weights: a size cap writes transformers' sharded set; --split round-trips") {
  const Saved& s = saved("tp2shard2", 4, meshes()[4].env);
  const io::TensorDict want = io::load_safetensors(s.export_);
  const uint64_t cap = 20000;  // the GPT's tensors: 128 B .. 32 KiB of float64
  // Through accel-run, as a user runs it.
  const std::string sharded = s.root + "/sharded";
  auto cli = [](std::vector<std::string> args) {
    args.insert(args.begin(), "merge-weights");
    return accel::test::run_world(ACCEL_RUN_PATH, args, 1, {}, 60s).front();
  };
  auto r = cli({s.ckpt, sharded, "--max_shard_size", "20KB"});
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "model.safetensors.index.json"));
  const nlohmann::json index =
      nlohmann::json::parse(accel::test::read_file(sharded + "/" + merge::kIndexFile));
  uint64_t total = 0;
  for (const auto& [n, t] : want) total += uint64_t(t.numel()) * dtype_size(t.dtype());
  CHECK(index["metadata"]["total_size"].get<uint64_t>() == total);
  REQUIRE(index["weight_map"].size() == want.size());
  // transformers' greedy rule in name order: a new shard when the next tensor would pass the cap.
  std::map<std::string, uint64_t> bytes_of;
  size_t shards = 1;
  uint64_t in_shard = 0;
  std::string previous;
  for (const auto& [n, t] : want) {
    const uint64_t b = uint64_t(t.numel()) * dtype_size(t.dtype());
    const std::string file = index["weight_map"][n].get<std::string>();
    if (!previous.empty() && file != previous) {
      ++shards;
      CHECK(in_shard + b > cap);
      in_shard = 0;
    }
    in_shard += b;
    previous = file;
  }
  CHECK(shards > 2);
  CHECK(fs::exists(sharded + "/model-00001-of-" +
                   std::string(5 - std::to_string(shards).size(), '0') + std::to_string(shards) +
                   ".safetensors"));
  expect_same_tensors(want, read_set(sharded));

  // The merged file split again at the cap, and a sharded set merged by split's inverse.
  const std::string one = s.root + "/one.safetensors";
  merge::merge_weights(s.ckpt, one, {});
  r = cli({"--split", one, s.root + "/split", "--max_shard_size", "20000"});
  REQUIRE_MESSAGE(r.code == 0, r.output);
  expect_same_tensors(want, read_set(s.root + "/split"));
  CHECK(accel::test::read_file(s.root + "/split/" + merge::kIndexFile) ==
        accel::test::read_file(sharded + "/" + merge::kIndexFile));

  // An earlier output is replaced whole: no shard of it is left beside the new single file.
  const merge::Written w = merge::merge_weights(s.ckpt, sharded, {});
  CHECK(w.files == std::vector<std::string>{merge::kSingleFile});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(sharded)) left.push_back(e.path().filename());
  CHECK(left == std::vector<std::string>{merge::kSingleFile});
  for (const auto& e : fs::directory_iterator(s.root))
    CHECK_FALSE(e.path().filename().string().rfind(".tmp-", 0) == 0);
}

// mesh_worker's GPT with its head tied to the token embedding: a plain checkpoint keeps the
// sorted-first name (head.weight) with `tok.weight -> head.weight` in the file; ZeRO-3 shards keep
// tok.weight (the parameter's first name) and no record of head.weight, which state.json's
// "aliases" supplies.
TEST_CASE("merge-weights: tied names kept from plain and ZeRO-3 checkpoints, and through split") {
  for (const Mesh& m : {meshes()[0], meshes()[1]}) {
    INFO(std::string(m.tag));
    const Saved& s = saved(std::string("tied-") + m.tag, m.world, m.env, {"tied"});
    CHECK(fs::exists(s.ckpt + "/data_rank3.safetensors") == (m.world == 4));
    io::Metadata want_meta, got_meta;
    const io::TensorDict want = io::load_safetensors(s.export_, &want_meta);
    REQUIRE(want_meta.size() == 1);  // one alias, whichever name is kept
    const std::string merged = s.root + "/merged.safetensors";
    merge::merge_weights(s.ckpt, merged, {});
    const io::TensorDict got = io::load_safetensors(merged, &got_meta);
    got_meta.erase("format");
    // Format 2 keeps the parameter's first name (tok.weight) on every mesh; the exports keep
    // either: one alias between the two names.
    REQUIRE(got_meta.size() == 1);
    const std::set<std::string> pair = {got_meta.begin()->first, got_meta.begin()->second};
    CHECK(pair == std::set<std::string>{"head.weight", "tok.weight"});
    expect_same_tensors(want, got);  // both names, restored from the alias on both sides
    CHECK(got.at("head.weight").is_same(got.at("tok.weight")));

    // A cap that puts each tensor in a shard of its own: the alias rides with the kept tensor.
    merge::merge_weights(s.ckpt, s.root + "/sharded", {.max_shard_bytes = 8});
    const nlohmann::json index =
        nlohmann::json::parse(accel::test::read_file(s.root + "/sharded/" + merge::kIndexFile));
    CHECK(index["weight_map"].size() == want.size() - 1);  // transformers lists stored names
    expect_same_tensors(want, read_set(s.root + "/sharded"));
    merge::split_weights(merged, s.root + "/split", 8);
    expect_same_tensors(want, read_set(s.root + "/split"));
  }
}

TEST_CASE("merge-weights: refusals name the problem") {
  // Format-1 files (fsdp shard files, state.json's spans, tp<t>/ folders): the committed fixtures
  // of tests/parallel/fixtures/legacy (ZeRO-3 at 2, tp 2 x DDP 2).
  const std::string fixtures = std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy";
  struct Fixture {
    std::string ckpt;
  };
  const Fixture s{fixtures + "/zero3/ckpt"};
  auto copy = [&](const std::string& from, const std::string& tag) {
    const std::string to = scratch() + "/" + tag;
    fs::remove_all(to);
    fs::copy(from, to, fs::copy_options::recursive);
    return to;
  };
  auto refused = [](const std::string& ckpt, const std::string& out, const std::string& says) {
    CAPTURE(ckpt);
    try {
      merge::merge_weights(ckpt, out, {});
      FAIL("no error; expected one saying: ", says);
    } catch (const IoError& e) {
      CHECK_MESSAGE(contains(e.what(), says), e.what());
    }
    CHECK_FALSE(fs::exists(out));
  };
  const std::string out = scratch() + "/refused.safetensors";

  // Not a checkpoint.
  fs::create_directories(scratch() + "/empty");
  refused(scratch() + "/empty", out, "is not a checkpoint");

  // A link in place of a shard, and a link inside a tp folder.
  std::string bad = copy(s.ckpt, "link");
  fs::remove(bad + "/fsdp_model_rank1.safetensors");
  fs::create_symlink(s.ckpt + "/fsdp_model_rank1.safetensors",
                     bad + "/fsdp_model_rank1.safetensors");
  refused(bad, out, "fsdp_model_rank1.safetensors' is a symbolic link");
  const Fixture tp{fixtures + "/tp2dp2/ckpt"};
  bad = copy(tp.ckpt, "tplink");
  fs::create_symlink(tp.ckpt + "/tp0/model.safetensors", bad + "/tp1/notes.safetensors");
  refused(bad, out, "tp1/notes.safetensors' is a symbolic link");

  // A truncated shard: its header promises bytes the file lacks.
  bad = copy(s.ckpt, "truncated");
  const std::string victim = bad + "/fsdp_model_rank1.safetensors";
  fs::resize_file(victim, fs::file_size(victim) - 100);
  refused(bad, out, "fsdp_model_rank1.safetensors");

  // A span record that does not match its file: the boundary of ranks 0 and 1 moved by one.
  bad = copy(s.ckpt, "spans");
  nlohmann::json state = nlohmann::json::parse(accel::test::read_file(bad + "/state.json"));
  auto& spans = state["fsdp"]["models"][0]["params"][0]["spans"];
  REQUIRE(spans[0][1].get<int64_t>() > spans[0][0].get<int64_t>());
  spans[0][1] = spans[0][1].get<int64_t>() - 1;
  spans[1][0] = spans[0][1];
  accel::test::write_file(bad + "/state.json", state.dump());
  refused(bad, out, "its span in state.json is");

  // A tp checkpoint whose tp1 folder is gone.
  bad = copy(tp.ckpt, "tpgone");
  fs::remove_all(bad + "/tp1");
  refused(bad, out, "has no folder 'tp1'");

  // An output folder holding a file of someone else's: refused before anything is read, kept.
  const std::string foreign = scratch() + "/foreign";
  fs::create_directories(foreign);
  accel::test::write_file(foreign + "/notes.txt", "mine");
  try {
    merge::merge_weights(s.ckpt, foreign, {});
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK_MESSAGE(contains(e.what(), "holds 'notes.txt', which merge-weights does not write"),
                  e.what());
  }
  CHECK(accel::test::read_file(foreign + "/notes.txt") == "mine");
  CHECK_THROWS_AS(merge::merge_weights(s.ckpt, out, {.max_shard_bytes = 100}), ValueError);
  CHECK_THROWS_AS(merge::merge_weights(s.ckpt, out, {.model = 1}), ValueError);
}

// A format-2 checkpoint (parallel/checkpoint/, not yet written by save_state) merges through the
// same interface: w (4, 6) cut in two by rows (Shard(0)), the second half in two flat ranges: three
// ranks' pieces; b whole; v an alias of w in the index.
TEST_CASE("merge-weights: a format-2 checkpoint") {
  const std::string dir = scratch() + "/format2";
  fs::create_directories(dir);
  const Tensor w = arange(24, TensorOptions(kFloat64)).reshape({4, 6});
  const Tensor b = arange(6, TensorOptions(kFloat32));
  using dist::Region;
  const Region r0 = Region::whole({4, 6}).shard(0, 1, 2, 0);
  const Region r1 = Region::whole({4, 6}).shard(0, 1, 2, 1);
  const Tensor rows = w.narrow(0, 2, 2).reshape({12});
  std::vector<std::string> records;
  records.push_back(
      dist::ckpt::write_rank_pieces(dir, 0,
                                    {{"model.0.w", r0, w.narrow(0, 0, 2).contiguous(), true, ""},
                                     {"model.0.b", Region::whole({6}), b, true, ""}}));
  records.push_back(dist::ckpt::write_rank_pieces(
      dir, 1, {{"model.0.w", r1.flat(0, 5), rows.narrow(0, 0, 5).contiguous(), true, ""}}));
  records.push_back(dist::ckpt::write_rank_pieces(
      dir, 2, {{"model.0.w", r1.flat(5, 12), rows.narrow(0, 5, 7).contiguous(), true, ""}}));
  dist::ckpt::write_index(dir, records,
                          {{"counts", {{"models", 1}}}, {"aliases", {{"model.0.v", "model.0.w"}}}});
  io::Metadata meta;
  merge::merge_weights(dir, dir + ".safetensors", {});
  const io::TensorDict got = io::load_safetensors(dir + ".safetensors", &meta);
  CHECK(meta.at("v") == "w");
  expect_same_tensors({{"w", w}, {"v", w}, {"b", b}}, got);
}

TEST_CASE("merge-weights: --max_shard_size reads sizes as transformers does") {
  CHECK(merge::parse_size("5GB") == 5000000000ULL);
  CHECK(merge::parse_size("5gb") == 5000000000ULL / 8);  // bits, as transformers reads "5Gb"
  CHECK(merge::parse_size("2GiB") == (uint64_t(2) << 30));
  CHECK(merge::parse_size("500MB") == 500000000ULL);
  CHECK(merge::parse_size("100KiB") == 102400);
  CHECK(merge::parse_size("20KB") == 20000);
  CHECK(merge::parse_size("4096") == 4096);
  for (const char* bad : {"", "GB", "5XB", "0", "-5GB", "5 GB"})
    CHECK_THROWS_AS(merge::parse_size(bad), ValueError);
}
