// accel-run config files with odd YAML shapes: every one is a ConfigError naming the file and
// position, never an uncaught yaml-cpp exception (which aborted accel-run with exit 134).
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/settings.h"
#include "launcher/config.h"
#include "launcher/plan.h"

namespace al = accel::launcher;
namespace st = accel::settings;

namespace {

// The ConfigError message for `yaml`; fails the test for any other outcome.
std::string config_error(const std::string& yaml) {
  try {
    al::parse_config(yaml, "odd.yaml");
  } catch (const al::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a ConfigError, got: " << e.what());
    return "";
  }
  FAIL("expected a ConfigError, the config was accepted");
  return "";
}

}  // namespace

TEST_CASE("non-scalar keys are ConfigErrors with the file and line") {
  struct Case {
    std::string yaml, expect;
  };
  const std::vector<Case> cases = {
      {"? [a, b]\n: 1\n", "odd.yaml:1: a key must be a plain name, got a list as a key"},
      {"{a: 1}: 2\n", "odd.yaml:1: a key must be a plain name, got a mapping as a key"},
      {"num_processes: 2\n? [x]\n: 3\n", "odd.yaml:2: a key must be a plain name"},
      {"? \n: 1\n", "a key must be a plain name"},
      {"zero_config:\n  ? [zero_stage]\n  : 1\n", "odd.yaml:2: a key in zero_config must be"},
      {"zero_config: {{zero_stage: 1}: 2}\n", "a key in zero_config must be a plain name"},
  };
  for (const auto& c : cases) {
    INFO(c.yaml);
    const std::string msg = config_error(c.yaml);
    CHECK(msg.find("[config]") == 0);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
  }
}

TEST_CASE("other odd YAML shapes are ConfigErrors too") {
  const std::vector<std::string> odd = {
      std::string(5000, '[') + std::string(5000, ']'),  // yaml-cpp's recursion limit
      "num_processes: [\n",                             // unterminated flow sequence
      "a: &x 1\nb: *y\n",                               // unknown alias
      "- 1\n- 2\n",                                     // a list at the top level
      "just a string",
      "num_processes: {a: 1}\n",
      "gpu_ids: [[0]]\n",
      "\t- tab\n",
      "num_processes: !!binary aGVsbG8=\n",
      "<<: {num_processes: 2}\n",
      std::string("num_processes: 2\0x", 18),
  };
  for (const auto& yaml : odd) {
    INFO(yaml.substr(0, 40));
    const std::string msg = config_error(yaml);
    CHECK(msg.find("odd.yaml") != std::string::npos);
  }
}

TEST_CASE("num_machines: MIN:MAX in the config file is elastic membership, and round-trips") {
  const al::LaunchConfig c = al::parse_config("num_machines: 2:4\nnum_processes: 4\n", "e.yaml");
  CHECK(c.num_machines == 2);
  CHECK(c.max_machines == 4);
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
  CHECK(al::config_to_yaml(c).find("num_machines: 2:4\n") != std::string::npos);
  const al::LaunchConfig fixed = al::parse_config("num_machines: 2\nnum_processes: 4\n", "f.yaml");
  CHECK(fixed.max_machines == 0);
  CHECK(al::config_to_yaml(fixed).find("num_machines: 2\n") != std::string::npos);
  for (const char* bad : {"num_machines: 3:2\n", "num_machines: 2:x\n", "num_machines: 0:2\n"}) {
    INFO(bad);
    const std::string msg = config_error(bad);
    CHECK(msg.find("num_machines") != std::string::npos);
    CHECK(msg.find("odd.yaml") != std::string::npos);
  }
}

TEST_CASE("what config_to_yaml writes parses back to the same config") {
  al::LaunchConfig c;
  c.distributed_type = "MULTI_CPU";
  c.num_machines = 2;
  c.num_processes = 4;
  c.machine_rank = 1;
  c.main_process_ip = "node-0'1";
  c.main_process_port = 29501;
  c.main_training_function = "it's: #main";
  c.set("zero_config.zero_stage", "3");
  c.monitor_interval = 0.25;
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
  // Line breaks and other control characters: a single-quoted scalar folds line breaks into
  // spaces, so these are written double-quoted with escapes (found by fuzz_config).
  c.main_training_function = "mg:\n \ngrad\tx\\ \"y\" \x01";
  c.main_process_ip = "a\rb";
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
}

namespace {

// Values to try on row `s`: what it accepts and what it refuses, in the spellings a user might
// write. None is one of Accelerate's other spellings, which the reader translates before the row
// sees them (fsdp_sharding_strategy's numbers, mixed_precision: false).
std::vector<std::string> candidates(const st::Setting& s) {
  std::vector<std::string> v = {"no such value ?!", "", std::string(s.default_value)};
  auto upper = [](std::string x) {
    for (char& ch : x)
      if (ch >= 'a' && ch <= 'z') ch = char(ch - 'a' + 'A');
    return x;
  };
  switch (s.kind) {
    case st::Kind::Choice: {
      std::string_view rest = s.allowed;
      while (!rest.empty()) {
        const size_t bar = rest.find('|');
        const std::string one(rest.substr(0, bar));
        std::string dashed = one;
        for (char& ch : dashed)
          if (ch == '_') ch = '-';
        v.insert(v.end(), {one, upper(one), " " + dashed + " ", one + "x"});
        rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
      }
      break;
    }
    case st::Kind::Int:
      for (int64_t n : {s.lo, s.hi, s.lo - 1, s.hi + 1, (s.lo + s.hi) / 2})
        v.push_back(std::to_string(n));
      v.insert(v.end(), {" " + std::to_string(s.lo) + " ", "1.5", "0x10", "12abc"});
      break;
    case st::Kind::Bool:
      v.insert(v.end(), {"true", "FALSE", "yes", "Off", "1", "0", "maybe"});
      break;
    case st::Kind::Name:
      v.insert(v.end(), {"ddp", "my_strategy2", "Bad", "a b", "a-b", std::string(65, 'x')});
      break;
    case st::Kind::Names:
      v.insert(v.end(), {"Block", "Block, Layer", "_Private", "1bad", "Block,,Layer", "A-B"});
      break;
  }
  return v;
}

// A config file setting row key `key` ("a.b" is key b in mapping a) to `value`, single-quoted,
// with what the other keys need for it to be complete (fsdp_wrap: classes names the classes).
std::string yaml_setting(const std::string& key, const std::string& value) {
  std::string quoted = "'";
  for (char ch : value) quoted += ch == '\'' ? std::string("''") : std::string(1, ch);
  quoted += "'";
  const size_t dot = key.find('.');
  // A mesh size is checked against the world at launch: the world is the size itself.
  std::string world = "2";
  if (key.rfind("parallelism_config.", 0) == 0)
    if (auto n = st::parse(*st::find_by_yaml(key), value, nullptr)) world = *n;
  if (dot == std::string::npos)
    return "num_processes: " + world + "\n" + key + ": " + quoted + "\n";
  std::string yaml = "num_processes: " + world + "\n" + key.substr(0, dot) + ":\n  " +
                     key.substr(dot + 1) + ": " + quoted + "\n";
  if (key == "fsdp_config.fsdp_wrap" &&
      st::parse(*st::find_by_yaml(key), value, nullptr) == "classes")
    yaml += "  fsdp_wrap_classes: Block\n";
  return yaml;
}

}  // namespace

// Note [settings are checked by their row] (launcher/config.h): for every row of the settings
// table, the config file accepts exactly what the row's parser accepts, stores it in the row's
// spelling (read back as accel-run exports it), and refuses the rest naming the key and saying
// what the row says. A reader that checked a setting by its own list, bounds or message fails.
TEST_CASE("config file: every setting of the table is checked and spelled by its row") {
  for (const st::Setting& s : st::kSettings) {
    const std::string key(s.yaml);
    CAPTURE(key);
    std::string default_why;
    const bool default_is_value = st::parse(s, s.default_value, &default_why).has_value();
    // dp_shard_size's default is no number but what fills the world (Note [mesh sizes]).
    if (s.kind != st::Kind::Name && s.kind != st::Kind::Names &&
        key != "parallelism_config.parallelism_config_dp_shard_size")
      CHECK_MESSAGE(default_is_value,
                    "the default of a Choice, Int or Bool row is one of its "
                    "values: ",
                    default_why);
    int accepted = 0, refused = 0;
    for (const std::string& value : candidates(s)) {
      CAPTURE(value);
      const std::string yaml = yaml_setting(key, value);
      std::string why;
      const std::optional<std::string> want = st::parse(s, value, &why);
      if (want) {
        ++accepted;
        al::LaunchConfig c;
        try {
          c = al::parse_config(yaml, "rows.yaml");
        } catch (const std::exception& e) {
          FAIL_CHECK("the row accepts it, the config file refused it: " << std::string(e.what()));
          continue;
        }
        if (key == "use_cpu") {
          // Exported from the plan, which also turns it on where there is no GPU (here).
          CHECK(c.use_cpu() == (*want == "true"));
        } else {
          const al::LaunchPlan plan = al::resolve_plan(c, {}, {}, 0);
          CHECK(al::exported_setting(plan, s) == want);
        }
      } else {
        ++refused;
        const std::string msg = config_error(yaml);
        CHECK_MESSAGE(msg.find("'" + key + "'") != std::string::npos, msg);
        // The row's explanation (a translating reader may say "expected FULL_SHARD, ... or"
        // before the row's alternatives).
        const std::string said = why.rfind("expected ", 0) == 0 ? why.substr(9) : why;
        CHECK_MESSAGE(msg.find(said) != std::string::npos, "'", said, "' not in: ", msg);
      }
    }
    CHECK(accepted >= 2);
    CHECK(refused >= 2);
  }
}

// Accelerate's parallelism_config block: its size keys are read (each by its row), its context
// parallelism only while off; the sizes are checked against the world of the launch, before a
// worker starts, naming every size and the world size (Note [mesh sizes]).
TEST_CASE("parallelism_config: Accelerate's keys, and sizes that do not fit the world") {
  const al::LaunchConfig c = al::parse_config(
      "num_processes: 8\n"
      "parallelism_config:\n"
      "  parallelism_config_cp_comm_strategy: allgather\n"
      "  parallelism_config_cp_size: 1\n"
      "  parallelism_config_dp_replicate_size: 2\n"
      "  parallelism_config_dp_shard_size: null\n"
      "  parallelism_config_tp_size: 2\n",
      "accelerate.yaml");
  CHECK(c.get_int("--dp_replicate_size") == std::optional<int>(2));
  CHECK(!c.get_int("--dp_shard_size"));
  CHECK(c.get_int("--tp_size") == std::optional<int>(2));
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
  const al::LaunchPlan p = al::resolve_plan(c, {}, {}, 0);
  const al::EnvMap env = al::worker_env(
      [&] {
        al::LaunchPlan q = p;
        q.master_port = 1234;
        return q;
      }(),
      0, 0);
  CHECK(env.at("ACCEL_DP_REPLICATE_SIZE") == "2");
  CHECK(env.at("ACCEL_TP_SIZE") == "2");
  CHECK(env.count("ACCEL_DP_SHARD_SIZE") == 0);  // inferred by the Accelerator itself

  // Context parallelism is a size like the others (parallel/context_parallel.h).
  {
    const al::LaunchConfig cp = al::parse_config(
        "num_processes: 4\nparallelism_config:\n  parallelism_config_cp_size: 2\n", "cp.yaml");
    CHECK(cp.get_int("--cp_size") == std::optional<int>(2));
    const al::EnvMap cp_env = al::worker_env(
        [&] {
          al::LaunchPlan q = al::resolve_plan(cp, {}, {}, 0);
          q.master_port = 1234;
          return q;
        }(),
        0, 0);
    CHECK(cp_env.at("ACCEL_CP_SIZE") == "2");
  }
  CHECK(config_error("parallelism_config:\n  tp_size: 2\n")
            .find("'parallelism_config.tp_size': unknown key") != std::string::npos);
  CHECK(config_error("parallelism_config: 2\n").find("expected a mapping") != std::string::npos);
  CHECK(config_error("parallelism_config:\n  parallelism_config_tp_size: 0\n")
            .find("expected a size >= 1") != std::string::npos);

  // The world decides: the config file's 8 processes, or the flags'.
  auto refused = [](const al::LaunchConfig& file, const al::LaunchFlags& f) -> std::string {
    try {
      al::resolve_plan(file, f, {}, 0);
    } catch (const al::ConfigError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  al::LaunchFlags four;
  four.num_processes = 4;
  CHECK(refused(c, four) == "(accepted)");  // 2 x 2 fits 4: dp_shard 1
  al::LaunchFlags six;
  six.num_processes = 6;
  const std::string m6 = refused(c, six);
  CHECK_MESSAGE(m6.find("[launch]") == 0, m6);
  CHECK_MESSAGE(m6.find("does not fit 6 processes") != std::string::npos, m6);
  CHECK_MESSAGE(m6.find("dp_replicate_size 2, dp_shard_size unset, cp_size 1, tp_size 2") !=
                    std::string::npos,
                m6);
  al::LaunchFlags sizes;  // flags over the file's sizes, one by one
  al::set_setting_flag(sizes, "--dp_shard_size", "3");
  const std::string m3 = refused(c, sizes);
  CHECK_MESSAGE(
      m3.find("dp_replicate_size 2, dp_shard_size 3, cp_size 1, tp_size 2") != std::string::npos,
      m3);
  CHECK_MESSAGE(m3.find("= 12 is not the world size 8") != std::string::npos, m3);
  al::set_setting_flag(sizes, "--dp_shard_size", "2");
  const al::LaunchPlan ok = al::resolve_plan(c, sizes, {}, 0);
  CHECK(ok.config.get_int("--dp_shard_size") == std::optional<int>(2));
}

TEST_CASE("a key given twice is refused in every mapping, not only at the top") {
  struct Case {
    std::string yaml, expect;
  };
  const std::vector<Case> cases = {
      {"num_processes: 2\nnum_processes: 3\n",
       "odd.yaml:2: key 'num_processes': is given twice (first on line 1)"},
      {"zero_config:\n  zero_stage: 2\n  param_dtype: bf16\n  zero_stage: 3\n",
       "odd.yaml:4: key 'zero_config.zero_stage': is given twice (first on line 2)"},
      {"fsdp_config:\n  fsdp_offload_params: false\n  fsdp_offload_params: false\n",
       "odd.yaml:3: key 'fsdp_config.fsdp_offload_params': is given twice"},
      {"fsdp_config: {fsdp_prefetch: true, fsdp_prefetch: true}\n",
       "key 'fsdp_config.fsdp_prefetch': is given twice"},
      {"parallelism_config:\n  parallelism_config_tp_size: 2\n  parallelism_config_tp_size: 4\n",
       "odd.yaml:3: key 'parallelism_config.parallelism_config_tp_size': is given twice"},
      // Deeper, inside a mapping accepted only while off.
      {"deepspeed_config:\n  zero_optimization:\n    stage: null\n    stage: null\n",
       "odd.yaml:4: key 'deepspeed_config.zero_optimization.stage': is given twice"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.yaml);
    const std::string m = config_error(c.yaml);
    CHECK_MESSAGE(m.find(c.expect) != std::string::npos, m);
    CHECK_MESSAGE(m.find("remove the other") != std::string::npos, m);
  }
  // The same key in two different mappings is no duplicate.
  const al::LaunchConfig ok = al::parse_config(
      "zero_config:\n  zero_stage: 3\nfsdp_config:\n  fsdp_prefetch: true\n"
      "deepspeed_config: {a: null}\nmpirun_config: {a: null}\n",
      "ok.yaml");
  CHECK(ok.get_int("zero_config.zero_stage") == std::optional<int>(3));
}

namespace {

// The ConfigError resolve_plan raises for `file` + `flags` in environment `env`, or "(accepted)".
std::string launch_refusal(const al::LaunchConfig& file, const al::LaunchFlags& flags,
                           const al::EnvMap& env = {}, const std::string& where = "") {
  try {
    al::resolve_plan(file, flags, env, 0, where);
  } catch (const al::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("launch refuses what the Accelerator would refuse, naming where each value came from") {
  al::LaunchConfig four;
  four.num_processes = 4;
  al::LaunchFlags tp2;
  al::set_setting_flag(tp2, "--tp_size", "2");

  // Every strategy composes with tp (Note [apply order] in parallel/parallelize.h): --tp_size 2
  // with any ZeRO stage, from flags or the config file's keys, and a program's own strategy.
  al::LaunchFlags f = tp2;
  std::string m;
  al::set_setting_flag(f, "--zero_stage", "2");
  CHECK(launch_refusal(four, f) == "(accepted)");
  al::LaunchConfig file = four;
  file.set("--tp_size", "2");
  file.set("zero_config.zero_stage", "1");
  CHECK(launch_refusal(file, {}, {}, "cfg.yaml") == "(accepted)");
  f = tp2;
  al::set_setting_flag(f, "--strategy", "mine");
  CHECK(launch_refusal(four, f) == "(accepted)");
  for (int stage : {0, 1, 2, 3}) {
    f = tp2;
    al::set_setting_flag(f, "--zero_stage", std::to_string(stage));
    CHECK(launch_refusal(four, f) == "(accepted)");
  }
  f = tp2;
  al::set_setting_flag(f, "--strategy", "fsdp");
  CHECK(launch_refusal(four, f) == "(accepted)");
  CHECK(launch_refusal(four, tp2) == "(accepted)");  // the program's AcceleratorConfig decides

  // Inherited variables count as the workers will read them.
  const al::EnvMap tp3 = {{"ACCEL_TP_SIZE", "3"}};
  m = launch_refusal(four, {}, tp3);
  CHECK_MESSAGE(m.find("does not fit 4 processes") != std::string::npos, m);
  CHECK_MESSAGE(m.find("tp_size 3 from ACCEL_TP_SIZE inherited from accel-run's environment") !=
                    std::string::npos,
                m);
  CHECK_MESSAGE(m.find("unset it") != std::string::npos, m);
  CHECK(launch_refusal(four, tp2, tp3) == "(accepted)");  // the flag overrides it
  CHECK(launch_refusal(four, tp2, {{"ACCEL_ZERO_STAGE", "2"}}) == "(accepted)");
  m = launch_refusal(four, {}, {{"ACCEL_ZERO_STAGE", "7"}});
  CHECK_MESSAGE(
      m.find("ACCEL_ZERO_STAGE='7' is exported in accel-run's environment") != std::string::npos,
      m);
  CHECK_MESSAGE(m.find("expected 0..3") != std::string::npos, m);

  // Note [built-in strategies]: a strategy and a zero_stage that contradict each other.
  f = {};
  al::set_setting_flag(f, "--strategy", "zero1");
  m = launch_refusal(four, f, {{"ACCEL_ZERO_STAGE", "3"}});
  CHECK_MESSAGE(
      m.find("strategy 'zero1' and zero_stage 3 contradict each other") != std::string::npos, m);
  CHECK(launch_refusal(four, f, {{"ACCEL_ZERO_STAGE", "1"}}) == "(accepted)");

  // Note [options a stage does not use]: ZeRO-3 options with another stage, from anywhere.
  f = {};
  al::set_setting_flag(f, "--zero_stage", "2");
  m = launch_refusal(four, f, {{"ACCEL_FSDP_PREFETCH", "false"}});
  CHECK_MESSAGE(m.find("ACCEL_FSDP_PREFETCH=false: the ZeRO-3 options apply to zero_stage 3 only, "
                       "and this run has zero_stage 2") != std::string::npos,
                m);
  f = {};
  al::set_setting_flag(f, "--strategy", "zero2");
  al::set_setting_flag(f, "--fsdp_prefetch", "true");
  CHECK(launch_refusal(four, f).find("apply to zero_stage 3 only") != std::string::npos);
  f = {};
  al::set_setting_flag(f, "--strategy", "ddp");
  m = launch_refusal(four, f, {{"ACCEL_PARAM_DTYPE", "bf16"}});
  CHECK_MESSAGE(
      m.find("ACCEL_PARAM_DTYPE=bf16: ZeRO compute dtypes apply to zero_stage 1-3 only") !=
          std::string::npos,
      m);
  CHECK(launch_refusal(four, f, {{"ACCEL_PARAM_DTYPE", "fp32"}}) == "(accepted)");
}
