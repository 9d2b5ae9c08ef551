// The settings table (core/settings.h) round-tripped row by row: a flag of accel-run and a key of
// its config file each become the exported variable, and AcceleratorConfig::with_env reads the
// variable back into the config field. A row that lacks a column, that accel-run (flags, config
// file reader, questionnaire) or with_env does not know, whose library
// binding (accelerate/config_settings.cc) is missing, doubled or names another field, or that has
// no probe below fails here; and so do cross-row rules (Note [cross-row rules]) on which accel-run
// and the Accelerator disagree.
#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <sstream>
#include <streambuf>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "accelerate/config_detail.h"
#include "core/env_contract.h"
#include "core/settings.h"
#include "launcher/config.h"
#include "launcher/launch_checks.h"
#include "launcher/plan.h"
#include "tests/common/scoped_env.h"

namespace al = accel::launcher;
namespace st = accel::settings;
using accel::AcceleratorConfig;

namespace {

// tests/common's ScopedEnv with every setting's variable unset first (restored at the end too).
struct SettingsEnv : accel::test::ScopedEnv {
  explicit SettingsEnv(const al::EnvMap& vars) {
    for (const st::Setting& s : st::kSettings) unset(std::string(s.env));
    for (const auto& [k, v] : vars) set(k, v);
  }
};

std::string flag(bool b) { return b ? "true" : "false"; }

// Per row: a value as a user would write it (not the default) and the config field it lands in,
// in the table's canonical spelling.
struct Probe {
  std::string example;
  std::function<std::string(const AcceleratorConfig&)> read;
};
const std::map<std::string, Probe>& probes() {
  using W = accel::dist::FsdpOptions::Wrap;
  auto size = [](const std::optional<int>& v) { return v ? std::to_string(*v) : "unset"; };
  auto dtype = [](const std::optional<accel::DType>& d) {
    return !d ? std::string("fp32") : *d == accel::kBFloat16 ? "bf16" : "fp16";
  };
  static const std::map<std::string, Probe> p = {
      {"mixed_precision",
       {"BF16",
        [](const AcceleratorConfig& c) {
          return std::string(c.mixed_precision == accel::MixedPrecision::BF16   ? "bf16"
                             : c.mixed_precision == accel::MixedPrecision::FP16 ? "fp16"
                                                                                : "no");
        }}},
      {"use_cpu", {"true", [](const AcceleratorConfig& c) { return flag(c.cpu); }}},
      {"gradient_accumulation_steps",
       {"4",
        [](const AcceleratorConfig& c) { return std::to_string(c.gradient_accumulation_steps); }}},
      {"zero_config.zero_stage",
       {"2", [](const AcceleratorConfig& c) { return std::to_string(c.zero_stage); }}},
      {"strategy", {"fsdp", [](const AcceleratorConfig& c) { return c.strategy; }}},
      {"zero_config.param_dtype",
       {"bf16",
        [=](const AcceleratorConfig& c) {
          return dtype(c.zero.param_dtype) == dtype(c.fsdp.param_dtype) ? dtype(c.zero.param_dtype)
                                                                        : "zero and fsdp differ";
        }}},
      {"zero_config.reduce_dtype",
       {"FP32",
        [](const AcceleratorConfig& c) {
          return c.zero.reduce_in_fp32 != c.fsdp.reduce_in_fp32 ? "zero and fsdp differ"
                 : c.zero.reduce_in_fp32                        ? "fp32"
                                                                : "param";
        }}},
      {"fsdp_config.fsdp_wrap",
       {"none",
        [](const AcceleratorConfig& c) {
          return std::string(c.fsdp.wrap == W::None        ? "none"
                             : c.fsdp.wrap == W::Classes   ? "classes"
                             : c.fsdp.wrap == W::MinParams ? "min_params"
                                                           : "entries");
        }}},
      {"fsdp_config.fsdp_wrap_classes",
       {"Block, Layer",
        [](const AcceleratorConfig& c) {
          std::string s;
          for (const auto& n : c.fsdp.classes) s += (s.empty() ? "" : ",") + n;
          return s;
        }}},
      {"fsdp_config.fsdp_min_params",
       {"5000", [](const AcceleratorConfig& c) { return std::to_string(c.fsdp.min_params); }}},
      {"fsdp_config.fsdp_reshard_after_forward",
       {"false", [](const AcceleratorConfig& c) { return flag(c.fsdp.reshard_after_forward); }}},
      {"fsdp_config.fsdp_prefetch",
       {"off", [](const AcceleratorConfig& c) { return flag(c.fsdp.prefetch); }}},
      {"fsdp_config.fsdp_activation_checkpointing",
       {"true", [](const AcceleratorConfig& c) { return flag(c.fsdp.activation_checkpointing); }}},
      // Sizes that fit the probes' world of 2 processes (accel-run checks them against it).
      {"parallelism_config.parallelism_config_dp_replicate_size",
       {" 2", [=](const AcceleratorConfig& c) { return size(c.parallelism.dp_replicate_size); }}},
      {"parallelism_config.parallelism_config_dp_shard_size",
       {"2", [=](const AcceleratorConfig& c) { return size(c.parallelism.dp_shard_size); }}},
      {"parallelism_config.parallelism_config_tp_size",
       {"2 ", [=](const AcceleratorConfig& c) { return size(c.parallelism.tp_size); }}},
      {"parallelism_config.parallelism_config_cp_size",
       {"2", [=](const AcceleratorConfig& c) { return size(c.parallelism.cp_size); }}},
      {"parallelism_config.parallelism_config_pp_size",
       {"2", [=](const AcceleratorConfig& c) { return size(c.parallelism.pp_size); }}},
#ifdef ACCEL_SETTINGS_PROBE  // Note [the settings probe row] in core/settings.h
      {"probe_config.probe_bucket_cap_mb",
       {"8",
        [](const AcceleratorConfig& c) { return std::to_string(c.ddp.bucket_cap_bytes >> 20); }}},
#endif
  };
  return p;
}

// The program's own config: zero_stage 3, where every ZeRO variable applies.
AcceleratorConfig program() {
  AcceleratorConfig c;
  c.zero_stage = 3;
  return c;
}

// worker 0's environment -> with_env of the program's config; checks row `s` end to end.
void check_round_trip(al::LaunchPlan plan, const st::Setting& s, const Probe& probe) {
  plan.master_port = 1234;  // what launch picks
  std::string why;
  const std::optional<std::string> want = st::parse(s, probe.example, &why);
  REQUIRE_MESSAGE(want.has_value(), why);
  const al::EnvMap e = al::worker_env(plan, 0, 0);
  const std::string env(s.env);
  REQUIRE_MESSAGE(e.count(env) == 1, env, " was not exported");
  CHECK(e.at(env) == *want);
  SettingsEnv scoped(e);
  const AcceleratorConfig base = program();
  const AcceleratorConfig c = base.with_env();
  CHECK(probe.read(c) == *want);
  CHECK(probe.read(base) != *want);  // the row changed something
}

}  // namespace

TEST_CASE("settings table: every row has every column, once") {
  std::set<std::string_view> yaml, flags, envs;
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.yaml);
    CHECK(!s.yaml.empty());
    CHECK(s.flag.substr(0, 2) == "--");
    CHECK(s.flag.size() > 2);
    CHECK(!s.allowed.empty());
    CHECK(!s.default_value.empty());
    // Every real row's variable is in the contract (the probe row's exists in a test build only).
    if (s.env != "ACCEL_PROBE_BUCKET_CAP_MB") {
      const accel::env::EnvVar* v = accel::env::find(s.env);
      REQUIRE_MESSAGE(v != nullptr, s.env, " is not in core/env_contract.h");
      CHECK(v->set_by == accel::env::SetBy::kLauncherMaybe);  // only when the user sets it
      CHECK(v->library_reads);
    }
    CHECK(yaml.insert(s.yaml).second);
    CHECK(flags.insert(s.flag).second);
    CHECK(envs.insert(s.env).second);
    CHECK_MESSAGE(probes().count(std::string(s.yaml)) == 1, "no probe for ", s.yaml);
    // The parser refuses garbage with what it accepts.
    std::string why;
    CHECK_FALSE(st::parse(s, "no such value ?!", &why).has_value());
    CHECK(!why.empty());
  }
  CHECK(probes().size() == std::size(st::kSettings));
}

// Note [questions from the table]: the questions are asked in table order, so a condition can only
// read a row asked before it (a later one would always read as its default).
TEST_CASE("settings table: a question's condition names a row above it") {
  for (size_t i = 0; i < std::size(st::kSettings); ++i) {
    const st::Setting& s = st::kSettings[i];
    CAPTURE(s.yaml);
    std::string_view rest = s.question.when;
    while (!rest.empty()) {
      const size_t amp = rest.find(" & ");
      const std::string_view one = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 3);
      if (one == "distributed") continue;
      const st::Setting* row = st::find_by_yaml(one.substr(0, one.find_first_of("!>=")));
      REQUIRE_MESSAGE(row != nullptr, "'", one, "' names no row");
      CHECK(row < &s);
      CHECK(!row->question.prompt.empty());  // it is asked
    }
  }
}

TEST_CASE("settings table: flag -> env -> config, every row") {
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.flag);
    const Probe& probe = probes().at(std::string(s.yaml));
    al::LaunchConfig file;
    file.num_processes = 2;
    al::LaunchFlags f;
    al::set_setting_flag(f, s, probe.example);
    check_round_trip(al::resolve_plan(file, f, {}, 0), s, probe);
  }
}

TEST_CASE("settings table: YAML -> env -> config, every row") {
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.yaml);
    const Probe& probe = probes().at(std::string(s.yaml));
    const std::string key(s.yaml);
    const size_t dot = key.find('.');
    const std::string yaml =
        "num_processes: 2\n" +
        (dot == std::string::npos
             ? key + ": " + probe.example + "\n"
             : key.substr(0, dot) + ":\n  " + key.substr(dot + 1) + ": " + probe.example + "\n");
    CAPTURE(yaml);
    const al::LaunchConfig file = al::parse_config(yaml, "settings.yaml");
    check_round_trip(al::resolve_plan(file, {}, {}, 0), s, probe);
  }
}

TEST_CASE("settings table: a bad flag value names the flag and what it accepts") {
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.flag);
    al::LaunchFlags f;
    std::string msg;
    try {
      al::set_setting_flag(f, s, "no such value ?!");
    } catch (const al::ConfigError& e) {
      msg = e.what();
    }
    CHECK(msg.find(std::string(s.flag)) != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  }
}

TEST_CASE("settings table: every row has exactly one library binding, named by the row's field") {
  const auto bindings = accel::config_detail::setting_bindings();
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.env);
    CHECK(s.field.substr(0, 19) == "AcceleratorConfig::");
    int n = 0;
    for (const auto& b : bindings)
      if (b.env == s.env) {
        ++n;
        CHECK(b.field == s.field);
        CHECK(static_cast<bool>(b.set));
      }
    CHECK_MESSAGE(n == 1, s.env, " has ", n, " bindings in accelerate/config_settings.cc");
  }
  CHECK(bindings.size() == std::size(st::kSettings));  // none for a row that is not there
}

// Note [cross-row rules] in core/settings.h: accel-run (before any worker starts, over the values
// the workers inherit) and AcceleratorConfig::with_env (over the same environment, the program's
// config being the default one) refuse the same combinations, with the same words. Every case
// names a strategy or a zero_stage: without one accel-run leaves the stage to the program.
TEST_CASE("settings table: cross-row rules give the same verdict in accel-run and the library") {
  namespace env = accel::env;
  struct Case {
    al::EnvMap vars;
    bool refused;
  };
  const std::vector<Case> cases = {
      {{{env::kZeroStage, "2"}, {env::kFsdpPrefetch, "false"}}, true},
      {{{env::kZeroStage, "3"}, {env::kFsdpPrefetch, "false"}}, false},
      {{{env::kStrategy, "zero2"}, {env::kFsdpWrap, "none"}}, true},
      {{{env::kStrategy, "fsdp"}, {env::kFsdpWrap, "none"}}, false},
      {{{env::kZeroStage, "0"}, {env::kParamDtype, "bf16"}}, true},
      {{{env::kZeroStage, "0"}, {env::kParamDtype, "fp32"}}, false},
      {{{env::kZeroStage, "1"}, {env::kReduceDtype, "fp32"}}, false},
      {{{env::kStrategy, "ddp"}, {env::kReduceDtype, "fp32"}}, true},
      {{{env::kStrategy, "zero1"}, {env::kZeroStage, "3"}}, true},
      {{{env::kStrategy, "zero1"}, {env::kZeroStage, "1"}}, false},
      // Every strategy composes with tp (Note [apply order] in parallel/parallelize.h).
      {{{env::kTpSize, "2"}, {env::kZeroStage, "1"}}, false},
      {{{env::kTpSize, "2"}, {env::kStrategy, "zero2"}}, false},
      {{{env::kTpSize, "2"}, {env::kStrategy, "fsdp"}}, false},
      {{{env::kTpSize, "2"}, {env::kZeroStage, "0"}}, false},
  };
  for (const Case& k : cases) {
    std::string what;
    st::Values values;
    for (const auto& [var, v] : k.vars) {
      what += var + "=" + v + " ";
      values.emplace(var, v);
    }
    CAPTURE(what);
    const std::optional<st::Refusal> rule = st::check_rules(values, 4);
    REQUIRE(rule.has_value() == k.refused);
    std::string launcher = "(accepted)", library = "(accepted)";
    try {
      al::check_effective_settings(al::effective_settings({}, {}, k.vars, ""), 4, "launch");
    } catch (const al::ConfigError& e) {
      launcher = e.what();
    }
    {
      SettingsEnv scoped(k.vars);
      try {
        (void)AcceleratorConfig().with_env();
      } catch (const accel::ValueError& e) {
        library = e.what();
      }
    }
    CHECK_MESSAGE((launcher != "(accepted)") == k.refused, launcher);
    CHECK_MESSAGE((library != "(accepted)") == k.refused, library);
    if (rule) {
      CHECK_MESSAGE(launcher.find(rule->why) != std::string::npos, launcher);
      CHECK_MESSAGE(library.find(rule->why) != std::string::npos, library);
    }
  }
}

TEST_CASE("settings table: every row survives config_to_yaml and the file reader") {
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.yaml);
    std::string why;
    const std::optional<std::string> v =
        st::parse(s, probes().at(std::string(s.yaml)).example, &why);
    REQUIRE_MESSAGE(v.has_value(), why);
    al::LaunchConfig c;
    c.num_processes = 2;
    c.set(s.yaml, *v);
    REQUIRE(!al::complete_fsdp_wrap(c));  // the wrap policy's parts name their policy
    const std::string yaml = al::config_to_yaml(c);
    CAPTURE(yaml);
    const al::LaunchConfig back = al::parse_config(yaml, "rt.yaml");
    CHECK(back.get(s.yaml) == v);
    CHECK(back == c);
  }
}

namespace {

// Answers the questionnaire as it asks (Note [questions from the table] in core/settings.h): each
// prompt written to `out` gets the answer `answer` gives for it.
class Answers : public std::streambuf {
 public:
  Answers(const std::ostringstream& out, std::function<std::string(const std::string&)> answer)
      : out_(out), answer_(std::move(answer)) {}

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const std::string all = out_.str();
    const std::string prompt = all.substr(seen_);
    seen_ = all.size();
    if (++asked_ > 200) return traits_type::eof();  // a question asked forever
    line_ = answer_(prompt) + "\n";
    setg(line_.data(), line_.data(), line_.data() + line_.size());
    return traits_type::to_int_type(*gptr());
  }

 private:
  const std::ostringstream& out_;
  std::function<std::string(const std::string&)> answer_;
  std::string line_;
  size_t seen_ = 0;
  int asked_ = 0;
};

// The answers that make row `s`'s question asked: its `when` conditions, and theirs.
void prerequisites(const st::Setting& s, std::map<const st::Setting*, std::string>& answers) {
  std::string_view rest = s.question.when;
  while (!rest.empty()) {
    const size_t amp = rest.find(" & ");
    const std::string_view one = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 3);
    if (one == "distributed") continue;  // multi-CPU with 2 processes: always
    const size_t op = one.find_first_of("!>=");
    const st::Setting* row = st::find_by_yaml(one.substr(0, op));
    REQUIRE_MESSAGE(row != nullptr, s.yaml, "'s question depends on '", one, "', which is no row");
    std::string value(one.substr(op + (one[op] == '=' ? 1 : 2)));
    if (one[op] == '!') {  // another value of the row
      const std::vector<std::string> values = al::split(std::string(row->allowed), '|');
      value = values[0] != value ? values[0] : values.at(1);
    }
    answers[row] = value;
    prerequisites(*row, answers);
  }
}

}  // namespace

// Note [questions from the table]: every row with a question, answered with its probe's example
// (and what makes it asked), goes answers -> config file -> accel-run's plan -> exported variable
// -> AcceleratorConfig field. The rows without a question are listed: a new row either asks or is
// added here with its reason.
TEST_CASE("settings table: questionnaire -> YAML -> env -> config, every row with a question") {
  const std::set<std::string> unasked = {
      "strategy",                                             // a name only the program knows
      "parallelism_config.parallelism_config_dp_shard_size",  // the rest of the processes
      "fsdp_config.fsdp_reshard_after_forward",               // tuning: flag or config key
      "fsdp_config.fsdp_prefetch",                            // tuning: flag or config key
      "use_cpu",  // asked with the type of machine, before the table
  };
  for (const st::Setting& s : st::kSettings) {
    CAPTURE(s.yaml);
    CHECK((s.question.prompt.empty() == (unasked.count(std::string(s.yaml)) == 1)));
    if (s.question.prompt.empty()) continue;
    const Probe& probe = probes().at(std::string(s.yaml));
    std::map<const st::Setting*, std::string> answers = {{&s, probe.example}};
    prerequisites(s, answers);
    std::ostringstream out;
    bool asked = false;
    Answers in_buf(out, [&](const std::string& prompt) -> std::string {
      if (prompt.find("Which type of machine") != std::string::npos) return "MULTI_CPU";
      for (const auto& [row, answer] : answers)
        if (prompt.find(std::string(row->question.prompt)) != std::string::npos) {
          asked = asked || row == &s;
          return answer;
        }
      return "";  // the default
    });
    std::istream in(&in_buf);
    const al::LaunchConfig c = al::run_questionnaire(in, out, 0);
    CHECK_MESSAGE(asked, "not asked: ", out.str());
    const std::string yaml = al::config_to_yaml(c);
    CAPTURE(yaml);
    const al::LaunchConfig file = al::parse_config(yaml, "questionnaire.yaml");
    CHECK(file == c);
    check_round_trip(al::resolve_plan(file, {}, {}, 0), s, probe);
  }
}

// Note [aliases of a setting]: an alias that takes the row's values reads as the row itself.
TEST_CASE("settings table: every alias with the row's values reads as the row") {
  int aliases = 0;
  for (const st::Setting& s : st::kSettings)
    for (const st::Alias& a : s.aliases) {
      CAPTURE(a.key);
      CHECK(st::find_by_key(a.key).row == &s);
      CHECK(st::find_by_key(a.key).alias == &a);
      if (a.value) continue;  // Accelerate's own values: tests/launcher/test_launcher.cc
      ++aliases;
      const std::string key(a.key);
      const size_t dot = key.find('.');
      const std::string yaml =
          "num_processes: 2\n" + (dot == std::string::npos
                                      ? key + ": " + probes().at(std::string(s.yaml)).example + "\n"
                                      : key.substr(0, dot) + ":\n  " + key.substr(dot + 1) + ": " +
                                            probes().at(std::string(s.yaml)).example + "\n");
      CAPTURE(yaml);
      al::LaunchConfig file = al::parse_config(yaml, "alias.yaml");
      check_round_trip(al::resolve_plan(file, {}, {}, 0), s, probes().at(std::string(s.yaml)));
    }
  CHECK(aliases >= 3);
}
