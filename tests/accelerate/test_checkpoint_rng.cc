// The random state in format-2 checkpoints (Note [generator state in checkpoints] in
// accelerate/accelerator_state.cc; docs/checkpointing.md): the default generator saved once
// (Replicate) when every rank's is alike, per rank (sharded over the world) when not; dropout
// under tp and sequence parallelism resumed from it; the earlier per-rank entries still read
// (tests/accelerate/fixtures/rng-per-rank); what is not a generator state refused by name; and a
// ZeRO-3 checkpoint of 2 ranks re-sharded unevenly at 3.
// Workers: rng_worker (an MLP with dropout, every rank on the whole batch: one process's training
// at every world size when the generators are alike), mesh_worker (a GPT under tp, sequence
// parallelism and a prepared loader) and accel_worker's zero_train.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "accelerate/accelerator.h"
#include "core/generator.h"
#include "parallel/checkpoint/writer.h"
#include "tests/common/spawn.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;

namespace {

constexpr double kTolerance = 1e-12;
const char* const kNote = "per-rank generator states were saved on ";

// A fresh folder `tag` in this run's scratch folder (removed at exit).
std::string scratch(const std::string& tag) {
  static const accel::test::TempDir s("ckpt-rng");
  const std::string d = s / tag;
  std::filesystem::create_directories(d);
  return d;
}

std::vector<std::string> lines_with(const std::string& out, const std::string& prefix) {
  std::vector<std::string> v;
  std::istringstream is(out);
  for (std::string l; std::getline(is, l);)
    if (l.rfind(prefix, 0) == 0) v.push_back(l);
  return v;
}

// "loss <step> <value>" lines of a worker's output or file.
std::map<int, double> losses(const std::string& text) {
  std::map<int, double> out;
  for (const std::string& l : lines_with(text, "loss ")) {
    std::istringstream is(l.substr(5));
    int s = 0;
    std::string v;
    is >> s >> v;
    out[s] = std::strtod(v.c_str(), nullptr);
  }
  return out;
}

// The steps of `got`, each within kTolerance of `ref`'s (`count` of them).
void expect_losses(const std::map<int, double>& ref, const std::map<int, double>& got, size_t count,
                   const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.size() == count);
  double worst = 0;
  for (const auto& [s, v] : got) {
    REQUIRE(ref.count(s));
    worst = std::max(worst, std::abs(ref.at(s) - v));
  }
  CHECK_MESSAGE(worst <= kTolerance, what, ": losses differ by ", worst);
}

// The rank's "rng <when> <rank> <hash>" hash.
std::string rng_hash(const std::string& out, const std::string& when) {
  const auto l = lines_with(out, "rng " + when + " ");
  REQUIRE_MESSAGE(l.size() == 1, out);
  return l[0].substr(l[0].rfind(' ') + 1);
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The index's record of "rng.default": shape and number of pieces; no "rng.default.rank<r>".
struct RngRecord {
  std::vector<int64_t> shape;
  size_t pieces = 0;
};
RngRecord rng_record(const std::string& ckpt) {
  const nlohmann::json j = nlohmann::json::parse(accel::test::read_file(ckpt + "/index.json"));
  for (auto it = j.at("tensors").begin(); it != j.at("tensors").end(); ++it)
    CHECK_MESSAGE(it.key().rfind("rng.default.rank", 0) != 0, "per-rank entry ", it.key());
  REQUIRE(j.at("tensors").contains("rng.default"));
  const nlohmann::json& r = j.at("tensors").at("rng.default");
  CHECK(r.at("dtype") == "U8");
  return {r.at("shape").get<std::vector<int64_t>>(), r.at("pieces").size()};
}

std::vector<accel::test::RankResult> rng_run(int world, const std::string& dir,
                                             std::vector<std::string> args) {
  args.insert(args.begin(), {dir, "10"});
  auto res = run_world(accel::test::helper_path("rng_worker"), args, world, {}, 60s);
  check_ok(res, "rng_train");
  return res;
}

}  // namespace

TEST_CASE("generators alike on every rank: one rng.default, resumed exactly at world 1 and 3") {
  const std::string dir = scratch("alike");
  // One process without interruption; 2 ranks saving after step 4 (every rank trains on the
  // whole batch with the same masks: one process's losses).
  const auto ref = losses(rng_run(1, dir + "/ref", {"alike"})[0].output);
  REQUIRE(ref.size() == 10);
  const auto saved = rng_run(2, dir, {"alike", "save", "4"});
  expect_losses(ref, losses(saved[0].output), 10, "world 2");
  const RngRecord rec = rng_record(dir + "/ckpt");
  CHECK(rec.shape.size() == 1);  // Replicate: one state, written once
  CHECK(rec.pieces == 1);
  const std::string state = rng_hash(saved[0].output, "saved");
  CHECK(rng_hash(saved[1].output, "saved") == state);
  for (int world : {1, 3}) {
    const auto res = rng_run(world, dir, {"alike", "load"});
    expect_losses(ref, losses(res[0].output), 6, "resumed at world " + std::to_string(world));
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(rng_hash(res[size_t(r)].output, "loaded") == state);
      CHECK(res[size_t(r)].output.find(kNote) == std::string::npos);
    }
  }
}

TEST_CASE("per-rank generators: rng.default sharded over the world; world 2 exact, world 3 told") {
  const std::string dir = scratch("specific");
  // set_seed(11, device_specific): each rank its own stream.
  const auto full = rng_run(2, dir, {"specific", "save", "4"});
  const auto want = losses(full[0].output);
  REQUIRE(want.size() == 10);
  const std::string s0 = rng_hash(full[0].output, "saved"), s1 = rng_hash(full[1].output, "saved");
  CHECK(s0 != s1);
  const RngRecord rec = rng_record(dir + "/ckpt");
  REQUIRE(rec.shape.size() == 2);
  CHECK(rec.shape[0] == 2);  // [W, S]: one row per rank, each written by its rank
  CHECK(rec.pieces == 2);
  {
    const auto res = rng_run(2, dir, {"specific", "load"});
    const auto got = losses(res[0].output);
    REQUIRE(got.size() == 6);
    for (const auto& [s, v] : got) CHECK(v == want.at(s));  // bit for bit
    CHECK(rng_hash(res[0].output, "loaded") == s0);
    CHECK(rng_hash(res[1].output, "loaded") == s1);
    for (const auto& r : res) CHECK(r.output.find(kNote) == std::string::npos);
  }
  {
    // Rank 2 has no row of its own: rank 0's, said once by rank 0.
    const auto res = rng_run(3, dir, {"specific", "load"});
    CHECK(losses(res[0].output).size() == 6);
    CHECK(rng_hash(res[0].output, "loaded") == s0);
    CHECK(rng_hash(res[1].output, "loaded") == s1);
    CHECK(rng_hash(res[2].output, "loaded") == s0);
    CHECK(count_of(res[0].output,
                   std::string(kNote) + "2 ranks; ranks >= 2 continue from rank 0's") == 1);
    CHECK(res[1].output.find(kNote) == std::string::npos);
    CHECK(res[2].output.find(kNote) == std::string::npos);
  }
  {
    const auto res = rng_run(1, dir, {"specific", "load"});
    CHECK(rng_hash(res[0].output, "loaded") == s0);
    CHECK(res[0].output.find(kNote) == std::string::npos);
  }
}

// tests/accelerate/fixtures/rng-per-rank (its README.md): 2 ranks of an earlier version, each
// rank's state as "rng.default.rank<r>".
TEST_CASE("format-2 checkpoints with rng.default.rank<r> entries still load, at world 2 and 3") {
  const std::string fixture =
      std::string(ACCEL_SOURCE_ROOT) + "/tests/accelerate/fixtures/rng-per-rank";
  const std::string expected = accel::test::read_file(fixture + "/expected.txt");
  const auto want = losses(expected);
  REQUIRE(want.size() == 10);
  auto saved = [&](int rank) {
    const auto l = lines_with(expected, "rng saved " + std::to_string(rank) + " ");
    REQUIRE(l.size() == 1);
    return l[0].substr(l[0].rfind(' ') + 1);
  };
  const std::string s0 = saved(0), s1 = saved(1);
  for (int world : {2, 3}) {
    CAPTURE(world);
    const std::string dir = scratch("old" + std::to_string(world));
    std::filesystem::copy(fixture + "/ckpt", dir + "/ckpt");
    const auto res = rng_run(world, dir, {"specific", "load"});
    CHECK(rng_hash(res[0].output, "loaded") == s0);
    CHECK(rng_hash(res[1].output, "loaded") == s1);
    if (world == 2) {
      expect_losses(want, losses(res[0].output), 6, "the fixture at world 2");
      CHECK(res[0].output.find(kNote) == std::string::npos);
    } else {
      CHECK(rng_hash(res[2].output, "loaded") == s0);
      CHECK(count_of(res[0].output,
                     std::string(kNote) + "2 ranks; ranks >= 2 continue from rank 0's") == 1);
    }
  }
}

// Dropout under tp draws from the default generator (Note [dropout under tensor parallelism] in
// parallel/tp_random.cc): nothing per tp rank to save, and a tp run resumes at any tp size.
TEST_CASE(
    "dropout under tp 2 + sequence parallel resumes as the uninterrupted run; a tp group "
    "continues from one row") {
  const std::string dir = scratch("tp");
  const std::string worker = accel::test::helper_path("mesh_worker");
  using Env = std::map<std::string, std::string>;
  // mesh_worker <out> 12 loader sp dropout <rest...>
  auto launch = [&](int world, const Env& env, const std::string& out,
                    std::vector<std::string> rest = {}) {
    std::vector<std::string> args = {out, "12", "loader", "sp", "dropout"};
    args.insert(args.end(), rest.begin(), rest.end());
    auto res = run_world(worker, args, world, env, 120s);
    check_ok(res, "mesh_train");
    return res;
  };
  const Env tp2 = {{"ACCEL_TP_SIZE", "2"}}, tp4 = {{"ACCEL_TP_SIZE", "4"}};
  // mesh_worker seeds set_seed(11, device_specific): at dp 1 every rank alike.
  launch(1, {}, dir + "/ref.txt");
  const auto ref = losses(accel::test::read_file(dir + "/ref.txt"));
  REQUIRE(ref.size() == 12);
  launch(2, tp2, dir + "/tp2.txt", {"save", "5", dir + "/ckpt-tp2"});
  expect_losses(ref, losses(accel::test::read_file(dir + "/tp2.txt")), 12, "tp 2 + sp");
  const RngRecord rec = rng_record(dir + "/ckpt-tp2");
  CHECK(rec.shape.size() == 1);
  CHECK(rec.pieces == 1);
  // tp 2 x dp 2: the dp ranks' streams differ (rows A A B B), so the sharded form.
  launch(4, tp2, dir + "/tp2dp2.txt", {"save", "5", dir + "/ckpt-tp2dp2"});
  const RngRecord rows = rng_record(dir + "/ckpt-tp2dp2");
  REQUIRE(rows.shape.size() == 2);
  CHECK(rows.shape[0] == 4);

  launch(2, tp2, dir + "/load-tp2", {"loadall", "tp2=" + dir + "/ckpt-tp2"});
  expect_losses(ref, losses(accel::test::read_file(dir + "/load-tp2.tp2")), 7, "tp 2 -> tp 2");
  launch(1, {}, dir + "/load-one",
         {"loadall", "tp2=" + dir + "/ckpt-tp2,tp2dp2=" + dir + "/ckpt-tp2dp2"});
  expect_losses(ref, losses(accel::test::read_file(dir + "/load-one.tp2")), 7, "tp 2 -> 1");
  // One process continues the tp 2 x dp 2 checkpoint from row 0 (dp rank 0's stream, A).
  const auto one_a = losses(accel::test::read_file(dir + "/load-one.tp2dp2"));
  REQUIRE(one_a.size() == 7);
  // At tp 4 every rank of the one tp group takes tp rank 0's row (A), so the group draws as one
  // process with A does. Rows by rank would give ranks 2 and 3 stream B: masks that disagree with
  // their peers' (the replicas drift apart; mesh_worker calls forward(), which the tp generator
  // check of parallel/tp_random.cc does not see).
  const auto res = launch(4, tp4, dir + "/load-tp4",
                          {"loadall", "tp2dp2=" + dir + "/ckpt-tp2dp2,tp2=" + dir + "/ckpt-tp2"});
  expect_losses(ref, losses(accel::test::read_file(dir + "/load-tp4.tp2")), 7, "tp 2 -> tp 4");
  expect_losses(one_a, losses(accel::test::read_file(dir + "/load-tp4.tp2dp2")), 7,
                "tp 2 x dp 2 -> tp 4 (row A) as -> 1");
  CHECK(count_of(res[0].output, std::string(kNote) + "4 ranks; the ranks of each tp group") == 1);
  for (size_t r = 1; r < res.size(); ++r) CHECK(res[r].output.find(kNote) == std::string::npos);
}

TEST_CASE("a ZeRO-3 checkpoint of 2 ranks continues at 3 (uneven shards) as the 2-rank run") {
  const std::string dir = scratch("zero3");
  const std::string worker = accel::test::helper_path("accel_worker");
  // zero_train <dir> <stage> <batch> <steps> <save_at> <resume> f64: global batch 12.
  auto full = run_world(worker, {"zero_train", dir, "3", "6", "8", "4", "0", "f64"}, 2, {}, 60s);
  check_ok(full, "zero_train");
  auto three = run_world(worker, {"zero_train", dir, "3", "4", "8", "4", "1", "f64"}, 3, {}, 60s);
  check_ok(three, "zero_train");
  // "loss <step> <hex float>" on every rank.
  const auto want = losses(full[0].output);
  REQUIRE(want.size() == 8);
  CHECK(three[0].output.find("resumed at 4") != std::string::npos);
  expect_losses(want, losses(three[0].output), 4, "ZeRO-3 2 -> 3");
  // Every float64 parameter bit of the end, within the same tolerance.
  const auto a = lines_with(full[0].output, "p64 "), b = lines_with(three[0].output, "p64 ");
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(std::strtod(a[i].c_str() + 4, nullptr) -
                                     std::strtod(b[i].c_str() + 4, nullptr)));
  CHECK(worst <= kTolerance);
}

// What is not a generator state: an IoError naming "rng.default" on load, nothing changed.
TEST_CASE("an rng.default that is not a generator state is refused by name") {
  using namespace accel;
  const std::string dir = scratch("refused");
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = dir;
  cfg.log_with = {};
  Accelerator acc(cfg);
  acc.save_state(dir + "/good");
  // The index's meta as save_state wrote it, without what write_index adds itself.
  nlohmann::json meta = nlohmann::json::parse(accel::test::read_file(dir + "/good/index.json"));
  for (const char* own : {"format", "tensors", "files", "crc_block_bytes", "index_crc32"})
    meta.erase(own);
  auto bytes = [](const std::string& text, Shape shape) {
    Tensor t = empty(shape, TensorOptions(kUInt8));
    std::memcpy(t.data_ptr(), text.data(), text.size());
    return t;
  };
  const std::string state = default_generator().state();
  const int64_t n = int64_t(state.size());
  struct Case {
    const char* tag;
    Tensor value;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"dtype", zeros({4}), "not a generator state (of a world of 1)"},
      {"rows of another world", bytes(state + state, {2, n}),
       "not a generator state (of a world of 1)"},
      {"3-d", bytes(state, {1, 1, n}), "not a generator state (of a world of 1)"},
      {"text", bytes("not a state", {11}), "is not a valid generator state"},
      {"row text", bytes("not a state", {1, 11}), "is not a valid generator state"},
  };
  acc.load_state(dir + "/good");  // loads
  manual_seed(123);
  const std::string before = default_generator().state();
  for (const Case& c : cases) {
    CAPTURE(c.tag);
    const std::string d = dir + "/" + c.tag;
    std::filesystem::create_directories(d);
    dist::ckpt::save_pieces(
        d, nullptr, 0, {{"rng.default", dist::Region::whole(c.value.sizes()), c.value, true, ""}},
        meta);
    try {
      acc.load_state(d);
      FAIL("loaded");
    } catch (const IoError& e) {
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find("[load_state]") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find("'rng.default'") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find(c.want) != std::string::npos, msg);
    }
    CHECK(default_generator().state() == before);
  }
}
