// Hostile checkpoints (issue 22, item 3): real format-1 ZeRO-2 and ZeRO-3 checkpoints (the
// committed fixtures of tests/parallel/fixtures/legacy, read through ckpt::open_legacy), one field
// of their record or one slice of their files broken at a time, loaded by 1 and 2 legacy_worker
// processes. Every case
// must be an IoError on every rank naming the file and the field (Note [checkpoint record
// validation] in parallel/checkpoint_records.h), with nothing changed: never a crash (a bucket
// smaller than the world size was a division by zero, SIGFPE on every rank) or garbage (overlapping
// ZeRO-3 spans loaded uninitialised memory without an error).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"
#include "tests/common/util.h"

using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::run_world;
namespace fs = std::filesystem;
using json = nlohmann::json;
using accel::test::fresh_dir;

namespace {

// fresh_dir's prefix: /tmp/accel-hostile-<pid>-<tag>.
constexpr char kScratch[] = "accel-hostile";

std::string worker() { return accel::test::helper_path("legacy_worker"); }

const std::string kFixtures = std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy";

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// A copy of checkpoint `base`/ckpt in a fresh directory with state.json edited by `edit`.
std::string mutated(const std::string& base, const std::string& tag,
                    const std::function<void(json&)>& edit) {
  const std::string dir = fresh_dir(kScratch, tag);
  fs::copy(base + "/ckpt", dir + "/ckpt", fs::copy_options::recursive);
  json s = read_json(dir + "/ckpt/state.json");
  edit(s);
  std::ofstream(dir + "/ckpt/state.json") << s.dump(2);
  return dir;
}

// load_state of `dir`'s checkpoint by `world` ranks at zero stage `stage` ("0": DDP): an IoError
// naming every word, on every rank.
void expect_refused(const std::string& dir, const std::string& stage, int world,
                    std::vector<std::string> words) {
  std::map<std::string, std::string> env;
  if (world > 1 && stage != "0") env["ACCEL_ZERO_STAGE"] = stage;
  const std::string out = dir + "/out";
  fs::create_directories(out);
  auto res = run_world(worker(), {dir + "/ckpt", out, "0"}, world, env, 60s);
  for (const auto& r : res) {
    CHECK(r.exited);
    CHECK(r.code == 3);
    CHECK_MESSAGE(accel::test::contains(r.output, "legacy_worker: IoError: "), r.output);
    for (const std::string& w : words) CHECK_MESSAGE(accel::test::contains(r.output, w), r.output);
  }
}

}  // namespace

TEST_CASE("hostile ZeRO-1/2 layouts: IoError naming state.json and the bucket, on every rank") {
  const std::string base = kFixtures + "/zero2";  // ZeRO-2 at 2 ranks, 7 buckets
  const json saved = read_json(base + "/ckpt/state.json");
  REQUIRE(saved["zero"][0]["buckets"].size() >= 2);
  const int64_t used = saved["zero"][0]["buckets"][0][0].get<int64_t>();
  struct Case {
    const char* tag;
    std::function<void(json&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      // The case: a bucket smaller than the world size (numel / world was a divisor).
      {"smaller-than-world",
       [&](json& s) {
         s["zero"][0]["buckets"][0] = {used, 1};
       },
       {"state.json", "zero[0].buckets[0]", "2 ranks"}},
      {"not-a-multiple",
       [&](json& s) {
         s["zero"][0]["buckets"][1][1] = s["zero"][0]["buckets"][1][0].get<int64_t>() * 2 + 1;
       },
       {"state.json", "zero[0].buckets[1]"}},
      {"padding-too-large",
       [&](json& s) { s["zero"][0]["buckets"][0][1] = used + 64; },
       {"state.json", "zero[0].buckets[0]"}},
      {"negative",
       [&](json& s) {
         s["zero"][0]["buckets"][0] = {-4, 2};
       },
       {"state.json", "zero[0].buckets[0][0] (used)"}},
      {"float",
       [&](json& s) { s["zero"][0]["buckets"][0][1] = 1e30; },
       {"state.json", "zero[0].buckets[0][1] (numel)", "integer"}},
      {"three-values",
       [&](json& s) {
         s["zero"][0]["buckets"][0] = {used, used, used};
       },
       {"state.json", "zero[0].buckets[0]"}},
      {"stage", [&](json& s) { s["zero"][0]["stage"] = 9; }, {"state.json", "zero[0].stage"}},
      {"count", [&](json& s) { s["zero"].push_back(nullptr); }, {"state.json", "zero"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.tag);
    const std::string dir = mutated(base, std::string("zero-") + c.tag, c.edit);
    // Another world size (the re-sharding path) and the saving one.
    expect_refused(dir, "2", 1, c.words);
    if (std::string(c.tag) == "smaller-than-world" || std::string(c.tag) == "float")
      expect_refused(dir, "2", 2, c.words);
    fs::remove_all(dir);
  }
  // A slice of the wrong size in a shard file: the file is named.
  {
    const std::string dir = mutated(base, "zero-short-slice", [](json&) {});
    const std::string f = dir + "/ckpt/zero_optimizer_rank1.safetensors";
    accel::io::TensorDict d = accel::io::load_safetensors(f);
    for (auto& [k, v] : d)
      if (k.rfind("state.0.", 0) == 0 && v.numel() > 1) v = v.narrow(0, 0, v.numel() - 1).clone();
    accel::io::save_safetensors(f, d);
    expect_refused(dir, "2", 1, {"zero_optimizer_rank1.safetensors", "state.0."});
    fs::remove_all(dir);
  }
}

TEST_CASE("hostile ZeRO-3 records: overlapping, missing or stray spans are IoErrors") {
  const std::string base = kFixtures + "/zero3";  // ZeRO-3 at 2 ranks
  const json saved = read_json(base + "/ckpt/state.json");
  const json& params = saved["fsdp"]["models"][0]["params"];
  // A parameter both ranks hold part of: spans [0, a) and [a, n).
  size_t k = 0;
  int64_t a = 0, n = 0;
  for (; k < params.size(); ++k) {
    a = params[k]["spans"][0][1].get<int64_t>();
    n = params[k]["spans"][1][1].get<int64_t>();
    if (params[k]["spans"][0][0] == 0 && a > 1 && params[k]["spans"][1][0] == a && n > a + 1) break;
  }
  REQUIRE(k + 1 < params.size());
  const std::string field = "fsdp.models[0].params[" + std::to_string(k) + "]";
  auto spans = [&](json& s) -> json& { return s["fsdp"]["models"][0]["params"][k]["spans"]; };
  struct Case {
    const char* tag;
    std::function<void(json&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      // The case: overlapping spans whose lengths still add up to the parameter.
      {"overlap",
       [&](json& s) {
         spans(s) = {{0, a}, {a - 1, n - 1}};
       },
       {"state.json", field + ".spans", "overlap"}},
      {"gap",
       [&](json& s) {
         spans(s) = {{0, a - 1}, {a, n}};
       },
       {"state.json", field + ".spans", "no rank holds"}},
      {"short",
       [&](json& s) {
         spans(s) = {{0, a}, {a, n - 1}};
       },
       {"state.json", field + ".spans", "cover"}},
      {"outside",
       [&](json& s) {
         spans(s) = {{0, a}, {a, n + 7}};
       },
       {"state.json", field + ".spans[1][1]"}},
      {"reversed",
       [&](json& s) {
         spans(s) = {{a, 0}, {a, n}};
       },
       {"state.json", field + ".spans[0][1]"}},
      {"count",
       [&](json& s) {
         spans(s).push_back({n, n});
       },
       {"state.json", field + ".spans"}},
      {"shape",
       [&](json& s) { s["fsdp"]["models"][0]["params"][k]["shape"][0] = -3; },
       {"state.json", field + ".shape[0]"}},
      {"duplicate",
       [&](json& s) { s["fsdp"]["models"][0]["params"][k + 1]["name"] = params[k]["name"]; },
       {"state.json", "fsdp.models[0].params[" + std::to_string(k + 1) + "].name", "twice"}},
      {"world", [&](json& s) { s["fsdp"]["world"] = 3; }, {"state.json", "fsdp.world"}},
      {"key",
       [&](json& s) { s["fsdp"]["optimizers"][0]["params"][0] = "0:nope"; },
       {"state.json", "fsdp.optimizers[0].params[0]", "0:nope"}},
      {"bad-key",
       [&](json& s) { s["fsdp"]["optimizers"][0]["params"][0] = "99999999999:x"; },
       {"state.json", "fsdp.optimizers[0].params[0]"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.tag);
    const std::string dir = mutated(base, std::string("fsdp-") + c.tag, c.edit);
    expect_refused(dir, "3", 1, c.words);  // one process reads every span
    if (std::string(c.tag) == "overlap") {
      expect_refused(dir, "3", 2, c.words);
      expect_refused(dir, "0", 2, c.words);  // DDP reads the whole parameters too
    }
    fs::remove_all(dir);
  }
  // A slice whose size disagrees with its span, and one of an integer dtype.
  for (bool wrong_dtype : {false, true}) {
    CAPTURE(wrong_dtype);
    const std::string dir =
        mutated(base, wrong_dtype ? "fsdp-int-slice" : "fsdp-short-slice", [](json&) {});
    const std::string f = dir + "/ckpt/fsdp_model_rank1.safetensors";
    accel::io::TensorDict d = accel::io::load_safetensors(f);
    const std::string name = params[k]["name"].get<std::string>();
    REQUIRE(d.count(name));
    d[name] =
        wrong_dtype ? d[name].to(accel::kInt32) : d[name].narrow(0, 0, d[name].numel() - 1).clone();
    accel::io::save_safetensors(f, d);
    expect_refused(dir, "3", 1, {"fsdp_model_rank1.safetensors", name});
    fs::remove_all(dir);
  }
}
