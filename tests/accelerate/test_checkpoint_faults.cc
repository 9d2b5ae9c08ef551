// Checkpoints under faults (Note [atomic checkpoints] in accelerate/checkpoint.h, Note [checkpoint
// loading] in accelerate/accelerator.cc): a re-save killed at every step, `latest` pointing outside
// its root, malformed state.json, and loads that fail halfway.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "accelerate/checkpoint.h"
#include "tests/common/child_process.h"
#include "tests/common/spawn.h"
#include "tests/accelerate/training.h"
#include "tests/common/scoped_env.h"
#include "tests/common/util.h"

using namespace accel;
using accel::test::base_config;
using accel::test::Run;
namespace fs = std::filesystem;
using accel::test::fresh_dir;
using accel::test::read_file;
using accel::test::run_in_child;
using accel::test::write_file;

namespace {

// fresh_dir's prefix: /tmp/accel-ckpt-faults-<pid>-<tag>.
constexpr char kScratch[] = "accel-ckpt-faults";

// The step of a committed checkpoint: state.json's (format 1) or index.json's (format 2).
int64_t saved_step(const std::string& ckpt_dir) {
  const std::string f = fs::exists(ckpt_dir + "/" + dist::kCheckpointStateFile)
                            ? dist::kCheckpointStateFile
                            : "index.json";
  return nlohmann::json::parse(read_file(ckpt_dir + "/" + f)).at("step").get<int64_t>();
}

// One step, save to root/ck (step 1); one more step, save to root/ck again (step 2), the
// process killed at `stage` of that second save.
int save_twice_and_die_at(const std::string& root, const std::string& stage) {
  Accelerator acc(base_config(root));
  Run run(acc, 8, false, 0.0);
  run.step(acc, *run.loader->begin());
  acc.save_state(root + "/ck");
  run.step(acc, *run.loader->begin());
  dist::set_checkpoint_hook([&](const std::string& s) {
    if (s == stage) kill(getpid(), SIGKILL);
  });
  acc.save_state(root + "/ck");
  return 0;  // the stage never came
}

void resave_killed_at_every_step(bool exchange) {
  const std::vector<std::string> stages = {"begin",  "rank_files", "state", "commit_swap",
                                           "commit", "latest",     "rotate"};
  // The fallback's "commit_swap" comes between its two renames: the old copy is still current.
  std::vector<std::string> old_until = {"begin", "rank_files", "state"};
  if (!exchange) old_until.push_back("commit_swap");
  if (!exchange) setenv("ACCEL_CHECKPOINT_NO_EXCHANGE", "1", 1);
  for (const std::string& stage : stages) {
    CAPTURE(stage);
    const std::string root =
        fresh_dir(kScratch, std::string("resave-") + (exchange ? "x-" : "f-") + stage);
    CHECK(run_in_child([&] { return save_twice_and_die_at(root, stage); }).signal == SIGKILL);
    // `latest` resolves to a complete checkpoint: the old one (step 1) until the new directory
    // took the name, the new one (step 2) from then on.
    std::string resolved;
    REQUIRE_NOTHROW(resolved = dist::resolve_checkpoint_dir(root));
    const bool old = std::find(old_until.begin(), old_until.end(), stage) != old_until.end();
    CHECK(saved_step(resolved) == (old ? 1 : 2));
    // With an atomic exchange the named directory itself is complete at every instant.
    if (exchange) CHECK(saved_step(root + "/ck") == (old ? 1 : 2));
    // And it loads: every file of it is there.
    CHECK(run_in_child([&] {
            Accelerator acc(base_config(root));
            Run run(acc, 8, false, 0.0);
            acc.load_state(root);
            return acc.step() == (old ? 1 : 2) ? 0 : 1;
          }).ok());
    // The next save cleans up whatever the killed one left behind.
    CHECK(run_in_child([&] {
            Accelerator acc(base_config(root));
            Run run(acc, 8, false, 0.0);
            acc.save_state(root + "/ck");
            return 0;
          }).ok());
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"ck", "latest"});
    fs::remove_all(root);
  }
  unsetenv("ACCEL_CHECKPOINT_NO_EXCHANGE");
}

}  // namespace

TEST_CASE("checkpoint faults: a re-save killed at any step leaves latest complete (exchange)") {
  resave_killed_at_every_step(true);
}

TEST_CASE("checkpoint faults: a re-save killed at any step leaves latest complete (fallback)") {
  resave_killed_at_every_step(false);
}

// The same protocol with format 2 (index.json is the completing file; the meson test runs this
// file on the transitional format-1 writer otherwise).
TEST_CASE("checkpoint faults: format 2: a re-save killed at any step leaves latest complete") {
  resave_killed_at_every_step(true);
  resave_killed_at_every_step(false);
}

namespace {

// Everything load_state may change, bit for bit.
std::string fingerprint(Accelerator& acc, Run& run, std::map<std::string, std::string>& custom) {
  std::ostringstream os;
  auto dump = [&](const char* what, const io::TensorDict& d) {
    for (auto& [k, v] : d) {
      Tensor c = v.contiguous().to(kFloat64);
      os << what << "." << k << ":";
      const double* p = static_cast<const double*>(c.data_ptr());
      for (int64_t i = 0; i < c.numel(); ++i) os << test::hex(p[i]) << ",";
      os << "\n";
    }
  };
  dump("model", run.model->state_dict());
  io::TensorDict grads;
  for (auto& [n, p] : run.model->named_parameters())
    if (p.grad().defined()) grads[n] = p.grad();
  dump("grad", grads);
  dump("optimizer", run.opt->state_dict());
  dump("scheduler", run.sched->state_dict());
  for (auto& [k, v] : run.loader->state_dict()) os << "loader." << k << "=" << v << "\n";
  os << "rng=" << default_generator().state() << "\n";
  for (auto& [k, v] : acc.scaler().state_dict()) os << "scaler." << k << "=" << v << "\n";
  for (auto& [k, v] : custom) os << "custom." << k << "=" << v << "\n";
  os << "step=" << acc.step() << " optimizer_steps=" << acc.optimizer_steps()
     << " sync=" << acc.sync_gradients() << "\n";
  return os.str();
}

// A run with a registered custom object, checkpointed after 3 micro-steps (inside an
// accumulation window), then trained on so that every piece of state differs from it.
// `from_env`: one rank of a group under the env contract, in a directory the caller owns.
struct Trained {
  std::string dir, ckpt;
  bool owns_dir;
  AcceleratorConfig config;
  std::unique_ptr<Accelerator> acc;
  std::unique_ptr<Run> run;
  std::map<std::string, std::string> custom{{"counter", "0"}};
  bool custom_load_throws = false;

  explicit Trained(const std::string& tag, const std::string& shared_dir = "")
      : dir(shared_dir.empty() ? fresh_dir(kScratch, tag) : shared_dir),
        owns_dir(shared_dir.empty()),
        config(base_config(dir)) {
    config.gradient_accumulation_steps = 2;
    if (!owns_dir) {
      config.read_env = true;
      config.timeout = std::chrono::seconds(60);
    }
    acc = std::make_unique<Accelerator>(config);
    run = std::make_unique<Run>(*acc, 4);
    acc->register_for_checkpointing(
        "counter", [this] { return custom; },
        [this](const std::map<std::string, std::string>& m) {
          if (custom_load_throws) throw ValueError("test: the custom object refuses its state");
          custom = m;
        });
    train(3);  // inside an accumulation window: the checkpoint holds gradients too
    ckpt = acc->save_state();
    train(2);
  }
  ~Trained() {
    if (owns_dir) fs::remove_all(dir);
  }
  void train(int steps) {
    auto it = run->loader->begin();
    for (int i = 0; i < steps; ++i, ++it) {
      if (it == run->loader->end()) it = run->loader->begin();
      run->step(*acc, *it);
      custom["counter"] = std::to_string(std::stoi(custom["counter"]) + 1);
    }
  }
  std::string state() { return fingerprint(*acc, *run, custom); }
};

}  // namespace

// Format 2 inside an accumulation window (Note [format-2 facade]): 2 ranks save and resume their
// own window gradients; one process refuses them, naming both meshes, and changes nothing.
// (Before the single-process cases: the parent must not have run kernels when it forks.)
TEST_CASE("checkpoint faults: format 2: window gradients resume on their mesh only") {
  constexpr int kWorld = 2;
  const std::string dir = fresh_dir(kScratch, "window-mesh");
  const int port = accel::test::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid > 0) {
      pids.push_back(pid);
      continue;
    }
    int rc = 1;
    try {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      Trained t("", dir);
      t.acc->load_state();
      rc = t.acc->step() == 3 && !t.acc->sync_gradients() ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
    std::fflush(stderr);
    _exit(rc);
  }
  for (int r = 0; r < kWorld; ++r) {
    int st = 0;
    REQUIRE(waitpid(pids[size_t(r)], &st, 0) == pids[size_t(r)]);
    CAPTURE(r);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  REQUIRE(fs::exists(dir + "/checkpoints/checkpoint_0/index.json"));
  const std::string one_dir = fresh_dir(kScratch, "window-mesh-one");  // made here: removed here
  CHECK(run_in_child([&] {
          AcceleratorConfig c = base_config(one_dir);
          c.gradient_accumulation_steps = 2;
          Accelerator acc(c);
          Run run(acc, 4);
          const int64_t step = acc.step();
          try {
            acc.load_state(dir + "/checkpoints");
          } catch (const ValueError& e) {
            const std::string m = e.what();
            const bool named =
                m.find("inside a gradient accumulation window on the mesh") != std::string::npos &&
                m.find("\"world\":2") != std::string::npos &&
                m.find("\"world\":1") != std::string::npos;
            if (!named) std::fprintf(stderr, "message: %s\n", e.what());
            return named && acc.step() == step ? 0 : 1;
          }
          return 2;
        }).ok());
  fs::remove_all(dir);
}

// Before the single-process cases below: the parent must not have run kernels when it forks.
TEST_CASE("checkpoint faults: one rank's unreadable file makes every rank refuse, unchanged") {
  constexpr int kWorld = 2, kBad = 1;
  const std::string dir = fresh_dir(kScratch, "ranks");
  const int port = accel::test::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid > 0) {
      pids.push_back(pid);
      continue;
    }
    int rc = 99;
    try {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      Trained t("", dir);
      // A per-rank file only rank kBad reads: its registered object's state.
      const std::string rng = t.ckpt + "/custom_counter_rank" + std::to_string(kBad) + ".json";
      const std::string good = read_file(rng);
      if (r == kBad) write_file(rng, good.substr(0, good.size() / 2));
      t.acc->wait_for_everyone();
      const std::string before = t.state();
      std::string msg = "(no error)";
      try {
        t.acc->load_state();
      } catch (const IoError& e) {
        msg = e.what();
      }
      const std::string want = r == kBad ? rng : "rank(s) 1 could not read";
      rc = 0;
      if (msg.find(want) == std::string::npos) {
        std::fprintf(stderr, "rank %d: error '%s' lacks '%s'\n", r, msg.c_str(), want.c_str());
        rc = 1;
      }
      if (t.state() != before) {
        std::fprintf(stderr, "rank %d: the failed load changed the state\n", r);
        rc = 1;
      }
      // The group is still in step: with the file repaired, both load.
      if (r == kBad) write_file(rng, good);
      t.acc->wait_for_everyone();
      t.acc->load_state();
      if (t.acc->step() != 3) rc = 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
    std::fflush(stderr);
    _exit(rc);
  }
  for (int r = 0; r < kWorld; ++r) {
    int st = 0;
    // Bounded: a rank stuck in a collective gives up at the 60 s timeout.
    REQUIRE(waitpid(pids[size_t(r)], &st, 0) == pids[size_t(r)]);
    CAPTURE(r);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoint faults: latest must name a directory inside its root") {
  Trained t("latest");
  // A complete checkpoint one level up: a `latest` of ".." would reach it.
  const std::string root = t.ckpt + "/inner";
  fs::create_directories(root);
  for (const std::string bad : {"..", "../checkpoint_0", "/tmp", ".", "", "a/../..", "\n"}) {
    CAPTURE(bad);
    write_file(root + "/latest", std::string(bad) + "\n");
    const std::string before = t.state();
    CHECK_THROWS_AS(t.acc->load_state(root), IoError);
    CHECK(t.state() == before);
  }
  try {
    write_file(root + "/latest", "..\n");
    t.acc->load_state(root);
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find(root + "/latest") != std::string::npos);
  }
  // A plain name inside the root is fine (the checkpoint without the stray folder, which a load
  // refuses: only a save's own files belong in it).
  fs::remove_all(root);
  write_file(t.dir + "/checkpoints/latest", "checkpoint_0\n");
  CHECK(t.acc->load_state() == t.ckpt);
}

TEST_CASE("checkpoint faults: a malformed state.json is an IoError naming the file") {
  Trained t("malformed");
  // A format-1 checkpoint (tests/parallel/fixtures/legacy: state.json is read, and refused, before
  // the models are compared).
  const std::string legacy = t.dir + "/legacy";
  fs::copy(std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy/one/ckpt", legacy,
           fs::copy_options::recursive);
  const std::string file = legacy + "/" + dist::kCheckpointStateFile;
  const std::string good = read_file(file);
  const nlohmann::json j = nlohmann::json::parse(good);
  std::vector<std::pair<std::string, std::string>> cases = {
      {"not JSON", "{\"format\": 1, "},
      {"not an object", "[1, 2, 3]"},
      {"empty", ""},
  };
  auto edited = [&](const std::string& name, const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json k = j;
    f(k);
    cases.emplace_back(name, k.dump());
  };
  edited("format is a string", [](nlohmann::json& k) { k["format"] = "1"; });
  edited("step is a float", [](nlohmann::json& k) { k["step"] = 1.5; });
  edited("world_size is negative", [](nlohmann::json& k) { k["world_size"] = -2; });
  edited("scaler is a number", [](nlohmann::json& k) { k["scaler"] = 3; });
  edited("scaler value is a number", [](nlohmann::json& k) { k["scaler"]["scale"] = 3; });
  edited("sync_gradients is a string", [](nlohmann::json& k) { k["sync_gradients"] = "yes"; });
  edited("num_models missing", [](nlohmann::json& k) { k.erase("num_models"); });
  edited("step missing", [](nlohmann::json& k) { k.erase("step"); });
  edited("save_iteration missing", [](nlohmann::json& k) { k.erase("save_iteration"); });
  edited("scaler missing", [](nlohmann::json& k) { k.erase("scaler"); });
  // (ZeRO records: tests/accelerate/test_hostile_checkpoints.cc.)
  for (auto& [name, text] : cases) {
    CAPTURE(name);
    write_file(file, text);
    const std::string before = t.state();
    bool named = false;
    try {
      t.acc->load_state(legacy);
    } catch (const IoError& e) {
      named = std::string(e.what()).find(file) != std::string::npos;
      INFO(std::string(e.what()));
      CHECK(named);
    } catch (const std::exception& e) {
      FAIL("not an IoError: " << std::string(e.what()));
    }
    CHECK(named);
    CHECK(t.state() == before);
  }
  write_file(file, good);
  CHECK_NOTHROW(t.acc->load_state());  // the run's own checkpoint
}

TEST_CASE("checkpoint faults: load_state changes nothing unless everything loads") {
  Trained t("atomic");
  const std::string before = t.state();
  // Every file load_state reads, each truncated in turn (the last-read first).
  std::vector<std::string> files = {"custom_counter_rank0.json", "data_rank0.safetensors",
                                    "index.json"};
  for (const std::string& f : files) {
    CAPTURE(f);
    const std::string path = t.ckpt + "/" + f;
    REQUIRE(fs::exists(path));
    const std::string good = read_file(path);
    write_file(path, good.substr(0, good.size() / 2));
    try {
      t.acc->load_state();
      FAIL("loaded a truncated " << f);
    } catch (const IoError& e) {
      CHECK(std::string(e.what()).find(f) != std::string::npos);
    }
    CHECK(t.state() == before);
    write_file(path, good);
  }
  // A failure while applying (the last object refuses its state): everything is rolled back.
  t.custom_load_throws = true;
  CHECK_THROWS_AS(t.acc->load_state(), ValueError);
  CHECK(t.state() == before);
  // And with nothing wrong it loads, and then the state is the checkpoint's.
  t.custom_load_throws = false;
  CHECK_NOTHROW(t.acc->load_state());
  CHECK(t.state() != before);
  CHECK(t.acc->step() == 3);
  CHECK(t.custom.at("counter") == "3");
}

// Format 2 (Note [format-2 facade] in accelerate/accelerator_state.cc), saved inside an
// accumulation window: a truncated data file, index or registered object's file, a flipped byte
// of a piece, an edited index: each an IoError naming it, and nothing changed.
TEST_CASE("checkpoint faults: format 2: truncated, flipped or edited files change nothing") {
  Trained t("atomic-format2");
  REQUIRE(fs::exists(t.ckpt + "/index.json"));
  REQUIRE_FALSE(fs::exists(t.ckpt + "/state.json"));
  const std::string before = t.state();
  auto refused = [&](const std::string& f, const std::function<std::string(std::string)>& edit,
                     const std::string& says) {
    CAPTURE(f);
    CAPTURE(says);
    const std::string path = t.ckpt + "/" + f;
    REQUIRE(fs::exists(path));
    const std::string good = read_file(path);
    write_file(path, edit(good));
    try {
      t.acc->load_state();
      FAIL("loaded an edited " << f);
    } catch (const IoError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
    CHECK(t.state() == before);
    write_file(path, good);
  };
  auto half = [](std::string s) { return s.substr(0, s.size() / 2); };
  refused("custom_counter_rank0.json", half, "custom_counter_rank0.json");
  refused("data_rank0.safetensors", half, "data_rank0.safetensors");
  refused("index.json", half, "index.json");
  refused(
      "data_rank0.safetensors",
      [](std::string s) {
        s.back() = char(s.back() ^ 0x40);
        return s;
      },
      "fails its CRC-32");
  refused(
      "index.json",
      [](std::string s) {
        const size_t at = s.find("\"step\":3");
        REQUIRE(at != std::string::npos);
        s[at + 7] = '4';
        return s;
      },
      "index.json");
  // A link in place of the data file, and a folder inside: refused, nothing read.
  {
    const std::string data = t.ckpt + "/data_rank0.safetensors", copy = t.dir + "/data-copy";
    fs::copy_file(data, copy);
    fs::remove(data);
    fs::create_symlink(copy, data);
    CHECK_THROWS_WITH_AS(t.acc->load_state(), doctest::Contains("data_rank0.safetensors"), IoError);
    CHECK(t.state() == before);
    fs::remove(data);
    fs::rename(copy, data);
    fs::create_directories(t.ckpt + "/inner");
    CHECK_THROWS_WITH_AS(t.acc->load_state(), doctest::Contains("inner"), IoError);
    CHECK(t.state() == before);
    fs::remove(t.ckpt + "/inner");
  }
  // A failure while applying: rolled back; then it loads (gradients of the window included).
  t.custom_load_throws = true;
  CHECK_THROWS_AS(t.acc->load_state(), ValueError);
  CHECK(t.state() == before);
  t.custom_load_throws = false;
  CHECK_NOTHROW(t.acc->load_state());
  CHECK(t.state() != before);
  CHECK(t.acc->step() == 3);
  CHECK(t.custom.at("counter") == "3");
  CHECK_FALSE(t.acc->sync_gradients());
}

// Note [what save_state replaces]: save_state(dir) replaced a folder of the user's without a word.
TEST_CASE("checkpoint faults: save_state refuses a folder that is not a checkpoint of accel's") {
  Trained t("refuse");
  auto refusal = [&](const std::string& dir) -> std::string {
    try {
      t.acc->save_state(dir);
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  // The folder of the report: notes, logs and a final model, kept as they were.
  const std::string user = t.dir + "/results";
  fs::create_directories(user + "/logs");
  write_file(user + "/notes.txt", "notes");
  write_file(user + "/logs/train.log", "log");
  write_file(user + "/final_model.bin", "model");
  std::string msg = refusal(user);
  CHECK(has(msg, "[save_state] '" + user + "' holds final_model.bin, logs/, notes.txt"));
  CHECK(has(msg, "not a checkpoint folder of accel's"));
  CHECK(read_file(user + "/notes.txt") == "notes");
  CHECK(read_file(user + "/logs/train.log") == "log");
  CHECK(read_file(user + "/final_model.bin") == "model");
  CHECK(!fs::exists(t.dir + "/.tmp-results"));
  // A checkpoints root (latest and checkpoint_<N>/) is not a checkpoint either.
  msg = refusal(t.dir + "/checkpoints");
  CHECK(has(msg, "checkpoint_0/"));
  CHECK(has(msg, "latest"));
  CHECK(fs::exists(t.ckpt + "/index.json"));
  // Automatic saves too: the next one (no save succeeded yet) goes to checkpoint_1.
  fs::create_directories(t.dir + "/checkpoints/checkpoint_1");
  write_file(t.dir + "/checkpoints/checkpoint_1/notes.txt", "notes");
  CHECK(has(refusal(""), "checkpoint_1' holds notes.txt"));
  CHECK(read_file(t.dir + "/checkpoints/checkpoint_1/notes.txt") == "notes");
  // Empty or missing: fine. A checkpoint of ours: replaced, as before.
  fs::create_directories(t.dir + "/empty");
  CHECK(refusal(t.dir + "/empty").empty());
  CHECK(refusal(t.dir + "/empty").empty());
  CHECK(fs::exists(t.dir + "/empty/" + dist::kCheckpointMarker));
  // ... unless something of the user's was put inside it.
  write_file(t.dir + "/empty/notes.txt", "mine");
  msg = refusal(t.dir + "/empty");
  CHECK(has(msg, "also holds what accel did not write there: notes.txt"));
  CHECK(read_file(t.dir + "/empty/notes.txt") == "mine");
  fs::remove(t.dir + "/empty/notes.txt");
  // A checkpoint of the previous version (no marker, no manifest) is recognised by its files.
  // (format 1: a fixture of tests/parallel/fixtures/legacy without marker and manifest.)
  const std::string old = t.dir + "/old";
  auto old_version = [&] {
    fs::remove_all(old);
    fs::copy(std::string(ACCEL_SOURCE_ROOT) + "/tests/parallel/fixtures/legacy/zero2/ckpt", old,
             fs::copy_options::recursive);
    fs::remove(old + "/" + dist::kCheckpointMarker);
    nlohmann::json s = nlohmann::json::parse(read_file(old + "/" + dist::kCheckpointStateFile));
    s.erase("files");
    write_file(old + "/" + dist::kCheckpointStateFile, s.dump());
  };
  old_version();
  CHECK(refusal(old).empty());
  CHECK(fs::exists(old + "/index.json"));
  old_version();
  write_file(old + "/final_model.bin", "model");
  CHECK(has(refusal(old),
            "also holds what accel did not write there: "
            "final_model.bin"));
  // A link at the folder's name, and a stale temporary folder holding the user's files.
  fs::create_directory_symlink(user, t.dir + "/alias");
  CHECK(has(refusal(t.dir + "/alias"), "is a symbolic link"));
  fs::create_directories(t.dir + "/.tmp-fresh");
  write_file(t.dir + "/.tmp-fresh/notes.txt", "notes");
  msg = refusal(t.dir + "/fresh");
  CHECK(has(msg,
            "'" + t.dir + "/.tmp-fresh' (the temporary folder of a save to it) holds notes.txt"));
  CHECK(read_file(t.dir + "/.tmp-fresh/notes.txt") == "notes");
  // A tp save killed midway leaves its temporary folder with the marker, tp<t>/ folders and no
  // state.json: the next save to the same folder replaces it (before: refused, so every restart
  // of the job died at the same checkpoint_<N>) ...
  const std::string crashed = t.dir + "/.tmp-crashed";
  fs::create_directories(crashed + "/tp0");
  fs::create_directories(crashed + "/tp1");
  write_file(crashed + "/" + dist::kCheckpointMarker, "");
  write_file(crashed + "/tp0/model_0.safetensors", "partial");
  write_file(crashed + "/tp1/model_0.safetensors.tmp", "partial");
  write_file(crashed + "/optimizer_0.bin", "partial");
  CHECK(refusal(t.dir + "/crashed").empty());
  CHECK(!fs::exists(crashed));
  CHECK(fs::exists(t.dir + "/crashed/index.json"));
  // ... but not when a tp folder in it holds a link (not something a rank writes).
  fs::create_directories(crashed + "/tp0");
  write_file(crashed + "/" + dist::kCheckpointMarker, "");
  fs::create_symlink(user + "/notes.txt", crashed + "/tp0/model_0.safetensors");
  msg = refusal(t.dir + "/crashed");
  CHECK(has(msg, "tp0/"));
  CHECK(fs::is_symlink(crashed + "/tp0/model_0.safetensors"));
  fs::remove_all(crashed);
  // Nothing above moved `latest` or broke the group: it still loads.
  CHECK_NOTHROW(t.acc->load_state());
}

TEST_CASE("checkpoint faults: rotation deletes only checkpoint folders of accel's") {
  const std::string dir = fresh_dir(kScratch, "rotation");
  {
    AcceleratorConfig c = base_config(dir);
    c.total_limit = 1;
    Accelerator acc(c);
    Run run(acc, 8, false, 0.0);
    // A checkpoint_<N> of the user's, beyond the ones the saves make: the rotation counted and
    // deleted it with the oldest.
    fs::create_directories(dir + "/checkpoints/checkpoint_7/logs");
    write_file(dir + "/checkpoints/checkpoint_7/notes.txt", "notes");
    acc.save_state();
    acc.save_state();
    acc.save_state();
    CHECK(read_file(dir + "/checkpoints/checkpoint_7/notes.txt") == "notes");
    CHECK(!fs::exists(dir + "/checkpoints/checkpoint_0"));
    CHECK(!fs::exists(dir + "/checkpoints/checkpoint_1"));
    CHECK(fs::exists(dir + "/checkpoints/checkpoint_2"));
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoint faults: planted links redirect no write; open folders are refused") {
  Trained t("links");
  // A link at the old fixed temporary name of `latest`: a root-run job overwrote its target.
  write_file(t.dir + "/outside", "precious");
  fs::create_symlink(t.dir + "/outside", t.dir + "/checkpoints/latest.tmp");
  const std::string second = t.acc->save_state();
  CHECK(read_file(t.dir + "/outside") == "precious");
  CHECK(read_file(t.dir + "/checkpoints/latest") == "checkpoint_1\n");
  CHECK(second == t.dir + "/checkpoints/checkpoint_1");
  // A link at `latest` itself is replaced, not written through.
  fs::remove(t.dir + "/checkpoints/latest");
  fs::create_symlink(t.dir + "/outside", t.dir + "/checkpoints/latest");
  t.acc->save_state();
  CHECK(read_file(t.dir + "/outside") == "precious");
  CHECK(!fs::is_symlink(t.dir + "/checkpoints/latest"));
  CHECK(read_file(t.dir + "/checkpoints/latest") == "checkpoint_2\n");
  // A folder on the way that anyone may rewrite.
  fs::create_directories(t.dir + "/open");
  fs::permissions(t.dir + "/open", fs::perms::all);
  try {
    t.acc->save_state(t.dir + "/open/ck");
    FAIL("saved under a world-writable folder");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("world-writable without the sticky bit") != std::string::npos);
  }
  CHECK(!fs::exists(t.dir + "/open/.tmp-ck"));
}

TEST_CASE(
    "checkpoint faults: FIFOs and devices in a checkpoint are IoErrors, not hangs or bad_alloc") {
  Trained t("fifo");
  const std::string state = t.ckpt + "/index.json";
  const std::string rng = t.ckpt + "/custom_counter_rank0.json";
  const std::string good_state = read_file(state);
  // state.json as a FIFO: the read blocked in open() until a writer came. In a child with a
  // deadline, so that a regression fails here instead of hanging the suite.
  fs::remove(state);
  REQUIRE(mkfifo(state.c_str(), 0600) == 0);
  auto r = test::expect_error_child<IoError>([&] { t.acc->load_state(); }, "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "load_state blocked on a FIFO state.json");
  CHECK(r.ok());
  fs::remove(state);
  write_file(state, good_state);
  // rng_rank0.txt linked to /dev/zero was read until std::bad_alloc (the child's memory is
  // capped so a regression fails fast). accel never writes a link there: refused as one.
  const std::string good_rng = read_file(rng);
  fs::remove(rng);
  fs::create_symlink("/dev/zero", rng);
  {
    // In this process (a child would run kernels after fork): the data segment is capped at
    // 4 GiB meanwhile, so that a regression ends in bad_alloc soon.
    struct rlimit old {};
    REQUIRE(getrlimit(RLIMIT_DATA, &old) == 0);
    struct rlimit cap = old;
    cap.rlim_cur = rlim_t(4) << 30;
    REQUIRE(setrlimit(RLIMIT_DATA, &cap) == 0);
    std::string msg = "(no error)";
    try {
      t.acc->load_state();
    } catch (const std::exception& e) {
      msg = e.what();
    }
    setrlimit(RLIMIT_DATA, &old);
    CHECK_MESSAGE(msg.find(rng + "' is a symbolic link") != std::string::npos, msg);
  }
  // A state.json far larger than any real one is refused by its size, before it is read.
  fs::remove(rng);
  write_file(rng, good_rng);
  {
    std::ofstream f(state, std::ios::binary | std::ios::trunc);
    f.seekp(std::streamoff(dist::kMaxCheckpointFileBytes));
    f.put('}');
  }
  CHECK_THROWS_WITH_AS(t.acc->load_state(), doctest::Contains("bytes this kind of file may hold"),
                       IoError);
  write_file(state, good_state);
  CHECK_NOTHROW(t.acc->load_state());
}
