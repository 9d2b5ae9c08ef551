// The training settings a user may give accel-run and the Accelerator reads, in one table: for
// each, its key in the config file (Accelerate's spelling where Accelerate has the setting), the
// accel-run flag, the environment variable accel-run exports, the values it takes, its default
// AcceleratorConfig field it sets, the values it takes, its default and its parser; and the rules
// between rows (check_rules). accel-run registers its flags, checks values and exports from it
// (launcher/settings_binding.cc); AcceleratorConfig::with_env parses what it reads with it, types
// it once and hands it to the row's binding (accelerate/config_settings.cc). A new setting is one
// row here plus one line in each binding (and its consumer's field);
// tests/launcher/test_settings.cc round-trips every row (flag -> env -> config, YAML -> env ->
// config), fails on a row either side does not know or whose binding names another field, and
// checks that check_rules gives the same verdict on both sides.
//
// Std-only: accel-run includes it without linking the tensor library (docs/layers.md).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/env_contract.h"
#include "core/parallelism.h"

namespace accel::settings {

enum class Kind : uint8_t {
  Choice,  // one of `allowed` ("a|b|c"), any case; '-' reads as '_'
  Int,     // an integer in [lo, hi]
  Bool,    // true/yes/on/1 or false/no/off/0, any case
  Name,    // a lower-case identifier: [a-z0-9_]+, at most 64 characters
  Names,   // comma-separated identifiers ("Block, Layer" -> "Block,Layer")
};

struct Setting {
  std::string_view yaml;  // config key; "zero_config.zero_stage": key zero_stage in zero_config
  std::string_view flag;  // accel-run flag (a Bool's flag may be a switch: `switch_flag`)
  std::string_view env;   // exported to the workers, read by AcceleratorConfig::with_env
  // The AcceleratorConfig field(s) it sets: the name its binding in accelerate/config_settings.cc
  // must carry (tests/launcher/test_settings.cc), and documentation.
  std::string_view field;
  Kind kind;
  std::string_view allowed;        // Choice: "no|fp16|bf16"; otherwise how the values read
  std::string_view default_value;  // what applies when neither the user nor the program sets it
  int64_t lo = 0, hi = 0;          // Int bounds
  bool switch_flag = false;        // the flag takes no value and means "true"
  std::string_view negation = {};  // a switch's off form ("--fsdp_no_activation_checkpointing")
};

// clang-format off
// Note [who wins: launcher or program] (launcher/config.h): a row is exported only when the
// config file or a flag sets it.
inline constexpr Setting kSettings[] = {
  {"mixed_precision", "--mixed_precision", env::kMixedPrecision,
   "AcceleratorConfig::mixed_precision", Kind::Choice, "no|fp16|bf16", "no"},
  {"use_cpu", "--cpu", env::kUseCpu, "AcceleratorConfig::cpu", Kind::Bool, "true|false", "false",
   0, 0, true},
  {"gradient_accumulation_steps", "--gradient_accumulation_steps",
   env::kGradientAccumulationSteps, "AcceleratorConfig::gradient_accumulation_steps", Kind::Int,
   ">= 1", "1", 1, int64_t(1) << 30},
  {"zero_config.zero_stage", "--zero_stage", env::kZeroStage, "AcceleratorConfig::zero_stage",
   Kind::Int, "0..3", "0", 0, 3},
  {"strategy", "--strategy", env::kStrategy, "AcceleratorConfig::strategy", Kind::Name,
   "a registered strategy: ddp, zero1, zero2, fsdp or the program's own",
   "the one zero_stage names"},
  {"zero_config.param_dtype", "--param_dtype", env::kParamDtype,
   "AcceleratorConfig::{zero,fsdp}.param_dtype", Kind::Choice, "bf16|fp16|fp32", "fp32"},
  {"zero_config.reduce_dtype", "--reduce_dtype", env::kReduceDtype,
   "AcceleratorConfig::{zero,fsdp}.reduce_in_fp32", Kind::Choice, "param|fp32", "param"},
  {"fsdp_config.fsdp_wrap", "--fsdp_wrap", env::kFsdpWrap, "AcceleratorConfig::fsdp.wrap",
   Kind::Choice, "entries|classes|min_params|none", "entries"},
  {"fsdp_config.fsdp_wrap_classes", "--fsdp_wrap_classes", env::kFsdpWrapClasses,
   "AcceleratorConfig::fsdp.classes", Kind::Names,
   "comma-separated module class names such as Block,Layer", "none"},
  {"fsdp_config.fsdp_min_params", "--fsdp_min_params", env::kFsdpMinParams,
   "AcceleratorConfig::fsdp.min_params", Kind::Int, "a parameter count >= 1", "1048576", 1,
   int64_t(1) << 62},
  {"fsdp_config.fsdp_reshard_after_forward", "--fsdp_reshard_after_forward",
   env::kFsdpReshardAfterForward, "AcceleratorConfig::fsdp.reshard_after_forward", Kind::Bool,
   "true|false", "true"},
  {"fsdp_config.fsdp_prefetch", "--fsdp_prefetch", env::kFsdpPrefetch,
   "AcceleratorConfig::fsdp.prefetch", Kind::Bool, "true|false", "true"},
  {"fsdp_config.fsdp_activation_checkpointing", "--fsdp_activation_checkpointing",
   env::kFsdpActivationCheckpointing, "AcceleratorConfig::fsdp.activation_checkpointing",
   Kind::Bool, "true|false", "false", 0, 0, true, "--fsdp_no_activation_checkpointing"},
  // The device mesh (core/parallelism.h, Note [mesh sizes]); bounded by accel-run's process count.
  {"parallelism_config.parallelism_config_dp_replicate_size", "--dp_replicate_size",
   env::kDpReplicateSize, "AcceleratorConfig::parallelism.dp_replicate_size", Kind::Int,
   "a size >= 1: replicas of the model", "1", 1, int64_t(1) << 20},
  {"parallelism_config.parallelism_config_dp_shard_size", "--dp_shard_size", env::kDpShardSize,
   "AcceleratorConfig::parallelism.dp_shard_size", Kind::Int,
   "a size >= 1: ranks one shard group spans",
   "the rest of the world: world / (dp_replicate_size x tp_size)", 1, int64_t(1) << 20},
  {"parallelism_config.parallelism_config_tp_size", "--tp_size", env::kTpSize,
   "AcceleratorConfig::parallelism.tp_size", Kind::Int, "a size >= 1: tensor-parallel ranks", "1",
   1, int64_t(1) << 20},
};
// clang-format on

constexpr const Setting* find_by_env(std::string_view env) {
  for (const Setting& s : kSettings)
    if (s.env == env) return &s;
  return nullptr;
}
constexpr const Setting* find_by_yaml(std::string_view yaml) {
  for (const Setting& s : kSettings)
    if (s.yaml == yaml) return &s;
  return nullptr;
}

// The parser: a value as the user wrote it -> the canonical spelling (what is exported and what
// with_env reads), or nullopt with `why` saying what is accepted.
inline std::optional<std::string> parse(const Setting& s, std::string_view raw, std::string* why) {
  auto lower = [](std::string_view v) {
    std::string out(v);
    for (char& ch : out)
      if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
    return out;
  };
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  auto fail = [&](std::string expected) -> std::optional<std::string> {
    if (why) *why = "expected " + expected + ", got '" + std::string(raw) + "'";
    return std::nullopt;
  };
  switch (s.kind) {
    case Kind::Choice: {
      std::string v = lower(trim(raw));
      for (char& ch : v)
        if (ch == '-') ch = '_';
      std::string_view rest = s.allowed;
      std::string list;
      while (!rest.empty()) {
        const size_t bar = rest.find('|');
        const std::string_view one = rest.substr(0, bar);
        if (one == v) return std::string(one);
        list += (list.empty() ? "" : ", ") + std::string(one);
        rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
      }
      return fail("one of " + list);
    }
    case Kind::Int: {
      const std::string v(trim(raw));
      errno = 0;
      char* end = nullptr;
      const long long n = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || errno != 0 || *end != '\0' || n < s.lo || n > s.hi)
        return fail(std::string(s.allowed) + " (an integer in [" + std::to_string(s.lo) + ", " +
                    std::to_string(s.hi) + "])");
      return std::to_string(n);
    }
    case Kind::Bool: {
      const std::string v = lower(trim(raw));
      if (v == "true" || v == "yes" || v == "on" || v == "1") return std::string("true");
      if (v == "false" || v == "no" || v == "off" || v == "0") return std::string("false");
      return fail("true or false");
    }
    case Kind::Name: {
      const std::string_view v = trim(raw);
      const bool ok =
          !v.empty() && v.size() <= 64 &&
          v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string_view::npos;
      if (!ok) return fail(std::string(s.allowed) + " (lower-case letters, digits and '_')");
      return std::string(v);
    }
    case Kind::Names: {
      std::string out;
      std::string_view rest = raw;
      while (true) {
        const size_t comma = rest.find(',');
        const std::string_view one = trim(rest.substr(0, comma));
        bool ok = !one.empty() && !(one[0] >= '0' && one[0] <= '9');
        for (char ch : one)
          ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_');
        if (!ok) return fail(std::string(s.allowed));
        out += (out.empty() ? "" : ",") + std::string(one);
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
      }
      return out;
    }
  }
  return fail(std::string(s.allowed));
}

// Note [options a stage does not use]
// The ZeRO-3 options (the fsdp_config rows) do nothing at another stage, and the ZeRO compute
// dtypes (param_dtype other than fp32, reduce_dtype) nothing without ZeRO: given anyway, they
// are refused, not ignored. `given` lists them as "ACCEL_FSDP_PREFETCH=true, ..." (or however
// the caller names them); the Accelerator (AcceleratorConfig::with_env) and accel-run (before a
// worker starts, Note [checks before any worker starts] in launcher/launch_checks.h) say the same.
inline std::string zero3_options_refusal(std::string_view given, int zero_stage) {
  return std::string(given) +
         ": the ZeRO-3 options apply to zero_stage 3 only, and this run has zero_stage " +
         std::to_string(zero_stage);
}
inline std::string zero_dtype_refusal(std::string_view given) {
  return std::string(given) +
         ": ZeRO compute dtypes apply to zero_stage 1-3 only, and this run has zero_stage 0 (use "
         "ACCEL_MIXED_PRECISION for autocast)";
}
// Whether row `s` is a ZeRO-3 option (fsdp_config.*).
constexpr bool is_zero3_option(const Setting& s) { return s.yaml.substr(0, 12) == "fsdp_config."; }

// A canonical value (what `parse` returned), typed: the one conversion after the one parse
// (AcceleratorConfig::with_env hands it to the row's binding, accelerate/config_settings.cc).
struct Value {
  Kind kind = Kind::Name;
  int64_t i = 0;                   // Int
  bool b = false;                  // Bool
  std::string s;                   // Choice, Name: the canonical spelling; Names: "A,B"
  std::vector<std::string> names;  // Names, split
};
// `canonical` must be `parse`'s output for `s` (no second check here).
inline Value typed(const Setting& s, std::string_view canonical) {
  Value v;
  v.kind = s.kind;
  v.s = std::string(canonical);
  switch (s.kind) {
    case Kind::Int: v.i = std::strtoll(v.s.c_str(), nullptr, 10); break;
    case Kind::Bool: v.b = canonical == "true"; break;
    case Kind::Names:
      for (size_t start = 0; start <= v.s.size();) {
        const size_t comma = std::min(v.s.find(',', start), v.s.size());
        v.names.push_back(v.s.substr(start, comma - start));
        start = comma + 1;
      }
      break;
    case Kind::Choice:
    case Kind::Name: break;
  }
  return v;
}

// Canonical values by environment variable (the env column); rows nobody set are absent.
using Values = std::map<std::string, std::string, std::less<>>;

// Why check_rules refused, and the settings the verdict depends on as (what, env variable):
// accel-run says where each came from ("tp_size 2 from --tp_size"), skipping the absent ones.
struct Refusal {
  std::string why;
  std::vector<std::pair<std::string, std::string>> used;
};

// Note [cross-row rules]
// The rules between rows, in one place: accel-run runs them over what every worker will read
// (Note [checks before any worker starts] in launcher/launch_checks.h, with the world it starts),
// and AcceleratorConfig::with_env over what the environment gave plus the strategy and ZeRO stage
// it resolved (accelerate/config_settings.cc; no world: the mesh is checked where it is built).
// tests/launcher/test_settings.cc checks that both give the same verdict.
//   1. with `world`: the mesh sizes fit it (Note [mesh sizes] in core/parallelism.h);
//   2. a strategy and a zero_stage do not contradict each other (Note [built-in strategies]);
//   3. tp_size > 1 runs with ddp or fsdp only (Note [strategies with tensor parallelism]);
//   4. ZeRO-3 options need zero_stage 3, ZeRO compute dtypes a ZeRO stage (Note [options a stage
//      does not use]).
// Without a strategy or zero_stage in `v` the program decides the stage: rules 3-4 are skipped.
inline std::optional<Refusal> check_rules(const Values& v, std::optional<int> world) {
  auto get = [&](std::string_view env) -> const std::string* {
    auto it = v.find(env);
    return it == v.end() ? nullptr : &it->second;
  };
  auto number = [&](std::string_view env, int fallback) {
    const std::string* s = get(env);
    return s ? int(std::strtol(s->c_str(), nullptr, 10)) : fallback;
  };
  int tp = number(env::kTpSize, 1);
  if (world) {
    ParallelismConfig p;
    Refusal r;
    for (const ParallelDim& d : kParallelDims) {
      if (get(d.env)) p.*d.given = number(d.env, 1);
      r.used.emplace_back(std::string(d.name) + "_size", std::string(d.env));
    }
    std::string why;
    const std::optional<MeshSizes> mesh = infer_mesh_sizes(p, *world, &why);
    if (!mesh) {
      std::string flags;
      for (const ParallelDim& d : kParallelDims)
        if (const Setting* row = find_by_env(d.env))
          flags += (flags.empty() ? "" : ", ") + std::string(row->flag);
      r.why = "parallelism_config (" + flags + ") does not fit " + std::to_string(*world) +
              " processes: " + why;
      return r;
    }
    tp = mesh->tp;
  }
  // The strategy, resolved as AcceleratorConfig::with_env resolves it: a zero_stage given alone
  // names its built-in strategy; a strategy given alone runs at its own stage.
  const std::string* name = get(env::kStrategy);
  const bool staged = get(env::kZeroStage) != nullptr;
  const int stage = number(env::kZeroStage, 0);
  if (name && staged)
    if (auto conflict = strategy_stage_conflict(*name, stage))
      return Refusal{*conflict, {{"strategy", env::kStrategy}, {"zero_stage", env::kZeroStage}}};
  std::optional<std::string> strategy;
  if (name) {
    strategy = *name;
  } else if (staged) {
    if (const BuiltinStrategy* b = builtin_strategy_for_stage(stage)) strategy = b->name;
  }
  if (!strategy) return std::nullopt;
  if (auto conflict = tp_strategy_conflict(tp, *strategy)) {
    Refusal r{*conflict, {{"tp_size", env::kTpSize}, {"strategy", env::kStrategy}}};
    if (!name) r.used.emplace_back("zero_stage", env::kZeroStage);
    return r;
  }
  const int run_stage = strategy_zero_stage(*strategy);
  std::string zero3, dtypes;
  Refusal r;
  for (const Setting& row : kSettings) {
    const std::string* value = get(row.env);
    if (!value) continue;
    const std::string given = std::string(row.env) + "=" + *value;
    if (is_zero3_option(row) && run_stage != 3) {
      zero3 += (zero3.empty() ? "" : ", ") + given;
      r.used.emplace_back(std::string(row.env), std::string(row.env));
    }
    const bool dtype =
        row.env == env::kReduceDtype || (row.env == env::kParamDtype && *value != "fp32");
    if (dtype && run_stage == 0) {
      dtypes += (dtypes.empty() ? "" : ", ") + given;
      r.used.emplace_back(std::string(row.env), std::string(row.env));
    }
  }
  r.used.emplace_back("strategy", env::kStrategy);
  r.used.emplace_back("zero_stage", env::kZeroStage);
  if (!zero3.empty())
    r.why = zero3_options_refusal(zero3, run_stage);
  else if (!dtypes.empty())
    r.why = zero_dtype_refusal(dtypes);
  else
    return std::nullopt;
  return r;
}

}  // namespace accel::settings
