// The training settings a user may give accel-run and the Accelerator reads, in one table: for
// each, its key in the config file (Accelerate's spelling where Accelerate has the setting), the
// accel-run flag, the environment variable accel-run exports, the AcceleratorConfig field it sets,
// the values it takes, its default, its aliases (Accelerate's other spellings, Note [aliases of a
// setting]) and its question for `accel-run config` (Note [questions from the table]); the one
// parser; and the rules between rows (check_rules). accel-run registers its flags, reads the config
// file, asks, checks and exports by the rows, keeping values by config key
// (LaunchConfig::training); AcceleratorConfig::with_env parses what it reads with it, types it once
// and hands it to the row's binding (accelerate/config_settings.cc). A new setting is one row here
// (its variable in core/env_contract.h) plus one binding line and its consumer's field;
// tests/launcher/test_settings.cc round-trips every row (flag -> env -> config, YAML -> env ->
// config, questionnaire -> YAML -> env -> config), fails on a row either side does not know or
// whose binding names another field, checks that check_rules gives the same verdict on both sides,
// and runs again over a test-only row (Note [the settings probe row]).
//
// Std-only: accel-run includes it without linking the tensor library (docs/layers.md).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/env_contract.h"
#include "core/parallelism.h"

// Note [the settings probe row]
// Issue 37's promise, "a new setting is one row plus its binding", is tested by a row that exists
// only in a test build: test_settings.cc is compiled a second time (test `launcher_settings_probe`,
// tests/launcher/meson.build) with ACCEL_SETTINGS_PROBE over its own copies of accel-run's config
// code and of accelerate/config_settings.cc, where the row below and its one binding line are the
// only additions; every generic test (flag, config key and alias, questionnaire, exported variable,
// AcceleratorConfig field, refusals) then covers it without a line written for it. The probe binds
// a field no real row sets (AcceleratorConfig::ddp.bucket_cap_bytes), and its variable is not in
// core/env_contract.h, which only the real rows must be in. The table's types live in an inline
// namespace named by the build, so the probe build's table never meets libaccel's.
#ifdef ACCEL_SETTINGS_PROBE
#define ACCEL_SETTINGS_ABI settings_probe
#else
#define ACCEL_SETTINGS_ABI table
#endif

namespace accel::settings {
inline namespace ACCEL_SETTINGS_ABI {

enum class Kind : uint8_t {
  Choice,  // one of `allowed` ("a|b|c"), any case; '-' reads as '_'
  Int,     // an integer in [lo, hi]
  Bool,    // true/yes/on/1 or false/no/off/0, any case
  Name,    // a lower-case identifier: [a-z0-9_]+, at most 64 characters
  Names,   // comma-separated identifiers ("Block, Layer" -> "Block,Layer")
};

// Note [aliases of a setting]
// Accelerate spells some settings differently (fsdp_config.fsdp_min_num_params for our
// fsdp_min_params) or with other values (fsdp_auto_wrap_policy: SIZE_BASED_WRAP for min_params);
// the config file reader accepts each alias of a row as the row itself: `value` translates what
// was written into text the row's parser reads (null: the row's values as they are), or refuses it
// with `why` (a value accel cannot honour, such as HYBRID_SHARD). An alias may name the row's own
// key to accept other values there (mixed_precision: false, YAML 1.1's unquoted `no`). A row given
// under two of its spellings is refused ("given already"), unless the row says its spellings may
// all be given when they agree (Accelerate writes both of its prefetch keys).
struct Alias {
  std::string_view key;  // dotted config key, as `Setting::yaml`
  std::optional<std::string> (*value)(std::string_view raw, std::string* why) = nullptr;
};

// Note [questions from the table]
// `accel-run config` asks the rows with a prompt, in table order, each answer checked by the row's
// parser and by check_rules over the answers so far (a tp_size that does not fit the processes,
// a zero_stage that does not run with it). A Choice row is offered as a menu (its default first),
// a Bool row as yes/no, the others as text with the row's default. `when` says when it is asked:
// "" always; "distributed" when more than one process is configured; "KEY=V", "KEY!=V" or
// "KEY>=N" on an earlier answer (an unanswered row reads as its default); conditions joined by
// " & " must all hold. Only answers other than the row's default are written, so that accepting a
// default leaves the program's AcceleratorConfig in charge (Note [who wins: launcher or program]).
struct Question {
  std::string_view prompt;  // empty: not asked
  std::string_view when;
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
  std::span<const Alias> aliases = {};  // Note [aliases of a setting]
  bool aliases_agree = false;           // its spellings may all be given when they agree
  Question question = {};               // Note [questions from the table]
};

// Accelerate's values (Note [aliases of a setting]): what was written -> what the row reads.
namespace detail {
inline std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}
inline std::string upper(std::string_view v) {
  std::string out(trim(v));
  for (char& ch : out)
    if (ch >= 'a' && ch <= 'z') ch = char(ch - 'a' + 'A');
  return out;
}
}  // namespace detail
// mixed_precision: false is YAML 1.1's unquoted `no`.
inline std::optional<std::string> yaml11_no(std::string_view raw, std::string*) {
  return detail::upper(raw) == "FALSE" ? std::string("no") : std::string(raw);
}
inline std::optional<std::string> accelerate_wrap_policy(std::string_view raw, std::string* why) {
  const std::string u = detail::upper(raw);
  if (u == "TRANSFORMER_BASED_WRAP") return "classes";
  if (u == "SIZE_BASED_WRAP") return "min_params";
  if (u == "NO_WRAP") return "none";
  if (why)
    *why = "expected TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP, got '" + std::string(raw) +
           "'";
  return std::nullopt;
}
// Accelerate's FSDP1 sharding strategies (by name or number) as reshard_after_forward; the
// unsharded and hybrid ones are refused (hybrid sharding is the mesh's); otherwise the row's bool.
inline std::optional<std::string> accelerate_sharding(std::string_view raw, std::string* why) {
  const std::string u = detail::upper(raw);
  if (u == "FULL_SHARD" || u == "1") return "true";
  if (u == "SHARD_GRAD_OP" || u == "2") return "false";
  if (u == "NO_SHARD" || u == "3") {
    if (why)
      *why =
          "NO_SHARD is not ZeRO-3: use zero_config.zero_stage 0 (DDP) or 1-2 for unsharded "
          "parameters; supported: FULL_SHARD, SHARD_GRAD_OP (or true / false)";
    return std::nullopt;
  }
  if (u == "HYBRID_SHARD" || u == "_HYBRID_SHARD_ZERO2" || u == "4" || u == "5") {
    if (why)
      *why = std::string(1, '\'').append(detail::trim(raw)) +
             "': accel sets hybrid sharding (shard within a machine, replicate across machines) "
             "by the device mesh: give FULL_SHARD with parallelism_config_dp_replicate_size "
             "(--dp_replicate_size N); supported: FULL_SHARD, SHARD_GRAD_OP (or true / false)";
    return std::nullopt;
  }
  return std::string(raw);
}
inline std::optional<std::string> accelerate_backward_prefetch(std::string_view raw,
                                                               std::string* why) {
  const std::string u = detail::upper(raw);
  if (u == "BACKWARD_PRE") return "true";
  if (u == "NO_PREFETCH") return "false";
  if (why)
    *why = std::string(1, '\'').append(detail::trim(raw)) +
           "': accel gathers the next unit when a unit's backward starts (BACKWARD_PRE) or not at "
           "all (NO_PREFETCH); supported: BACKWARD_PRE, NO_PREFETCH";
  return std::nullopt;
}
inline constexpr Alias kMixedPrecisionAliases[] = {{"mixed_precision", yaml11_no}};
inline constexpr Alias kFsdpWrapAliases[] = {
    {"fsdp_config.fsdp_auto_wrap_policy", accelerate_wrap_policy}};
inline constexpr Alias kFsdpWrapClassesAliases[] = {
    {"fsdp_config.fsdp_transformer_layer_cls_to_wrap"}};
inline constexpr Alias kFsdpMinParamsAliases[] = {{"fsdp_config.fsdp_min_num_params"}};
inline constexpr Alias kFsdpReshardAliases[] = {
    {"fsdp_config.fsdp_reshard_after_forward", accelerate_sharding},
    {"fsdp_config.fsdp_sharding_strategy", accelerate_sharding}};
#ifdef ACCEL_SETTINGS_PROBE
inline constexpr Alias kProbeAliases[] = {{"probe_config.probe_bucket_mb"}};
#endif
inline constexpr Alias kFsdpPrefetchAliases[] = {
    {"fsdp_config.fsdp_backward_prefetch", accelerate_backward_prefetch},
    {"fsdp_config.fsdp_forward_prefetch"}};

// clang-format off
// Note [who wins: launcher or program] (launcher/config.h): a row is exported only when the
// config file or a flag sets it. The rows are in the order the questionnaire asks them (the device
// mesh first: the ZeRO stage is checked against it).
inline constexpr Setting kSettings[] = {
  // The device mesh (core/parallelism.h, Note [mesh sizes]); bounded by accel-run's process count.
  {.yaml = "parallelism_config.parallelism_config_dp_replicate_size", .flag = "--dp_replicate_size",
   .env = env::kDpReplicateSize, .field = "AcceleratorConfig::parallelism.dp_replicate_size",
   .kind = Kind::Int, .allowed = "a size >= 1: replicas of the model", .default_value = "1",
   .lo = 1, .hi = int64_t(1) << 20,
   .question = {"How many replicas of the model (dp_replicate_size: with ZeRO, hybrid sharding: "
                "ZeRO inside a replica, all-reduce across replicas)?", "distributed"}},
  {.yaml = "parallelism_config.parallelism_config_dp_shard_size", .flag = "--dp_shard_size",
   .env = env::kDpShardSize, .field = "AcceleratorConfig::parallelism.dp_shard_size",
   .kind = Kind::Int, .allowed = "a size >= 1: ranks one shard group spans",
   .default_value = "the rest of the world: world / (pp_size x dp_replicate_size x cp_size x tp_size)",
   .lo = 1, .hi = int64_t(1) << 20},  // not asked: the rest of the processes
  {.yaml = "parallelism_config.parallelism_config_cp_size", .flag = "--cp_size",
   .env = env::kCpSize, .field = "AcceleratorConfig::parallelism.cp_size", .kind = Kind::Int,
   .allowed = "a size >= 1: context-parallel ranks", .default_value = "1",
   .lo = 1, .hi = int64_t(1) << 20,
   .question = {"Over how many processes should each sequence be split (cp_size: context "
                "parallelism, ring attention over the program's AcceleratorConfig::cp_plan)?",
                "distributed"}},
  {.yaml = "parallelism_config.parallelism_config_tp_size", .flag = "--tp_size",
   .env = env::kTpSize, .field = "AcceleratorConfig::parallelism.tp_size", .kind = Kind::Int,
   .allowed = "a size >= 1: tensor-parallel ranks", .default_value = "1",
   .lo = 1, .hi = int64_t(1) << 20,
   .question = {"Over how many processes should each layer be split (tp_size: tensor "
                "parallelism over the program's AcceleratorConfig::tp_plan)?", "distributed"}},
  {.yaml = "parallelism_config.parallelism_config_pp_size", .flag = "--pp_size",
   .env = env::kPpSize, .field = "AcceleratorConfig::parallelism.pp_size", .kind = Kind::Int,
   .allowed = "a size >= 1: pipeline stages", .default_value = "1",
   .lo = 1, .hi = int64_t(1) << 20,
   .question = {"Over how many processes should the model's layers be split into pipeline "
                "stages (pp_size: pipeline parallelism over the program's "
                "AcceleratorConfig::pipeline)?", "distributed"}},
  {.yaml = "zero_config.zero_stage", .flag = "--zero_stage", .env = env::kZeroStage,
   .field = "AcceleratorConfig::zero_stage", .kind = Kind::Int, .allowed = "0..3",
   .default_value = "0", .lo = 0, .hi = 3,
   .question = {"Which ZeRO stage do you want (0: off, 1: shard optimizer state, 2: + "
                "gradients, 3: + parameters)?", "distributed"}},
  {.yaml = "strategy", .flag = "--strategy", .env = env::kStrategy,
   .field = "AcceleratorConfig::strategy", .kind = Kind::Name,
   .allowed = "a registered strategy: ddp, zero1, zero2, fsdp or the program's own",
   .default_value = "the one zero_stage names"},
  {.yaml = "zero_config.param_dtype", .flag = "--param_dtype", .env = env::kParamDtype,
   .field = "AcceleratorConfig::{zero,fsdp}.param_dtype", .kind = Kind::Choice,
   .allowed = "bf16|fp16|fp32", .default_value = "fp32",
   .question = {"In which dtype should ZeRO compute with the parameters (fp32: no conversion; "
                "the optimizer keeps fp32 master shards)?", "zero_config.zero_stage>=1"}},
  {.yaml = "zero_config.reduce_dtype", .flag = "--reduce_dtype", .env = env::kReduceDtype,
   .field = "AcceleratorConfig::{zero,fsdp}.reduce_in_fp32", .kind = Kind::Choice,
   .allowed = "param|fp32", .default_value = "param",
   .question = {"In which dtype should gradients be reduced (param: the parameters' dtype)?",
                "zero_config.zero_stage>=1 & zero_config.param_dtype!=fp32"}},
  {.yaml = "fsdp_config.fsdp_wrap", .flag = "--fsdp_wrap", .env = env::kFsdpWrap,
   .field = "AcceleratorConfig::fsdp.wrap", .kind = Kind::Choice,
   .allowed = "entries|classes|min_params|none", .default_value = "entries",
   .aliases = kFsdpWrapAliases,
   .question = {"Which modules should ZeRO-3 shard as units (entries: every ModuleList/Sequential "
                "entry; classes: entries of the classes you name; min_params: entries with at "
                "least N parameters; none: the whole model is one unit)?",
                "zero_config.zero_stage=3"}},
  {.yaml = "fsdp_config.fsdp_wrap_classes", .flag = "--fsdp_wrap_classes",
   .env = env::kFsdpWrapClasses, .field = "AcceleratorConfig::fsdp.classes", .kind = Kind::Names,
   .allowed = "comma-separated module class names such as Block,Layer", .default_value = "none",
   .aliases = kFsdpWrapClassesAliases,
   .question = {"Which module classes are units (comma-separated, e.g. Block,Layer)?",
                "fsdp_config.fsdp_wrap=classes"}},
  {.yaml = "fsdp_config.fsdp_min_params", .flag = "--fsdp_min_params", .env = env::kFsdpMinParams,
   .field = "AcceleratorConfig::fsdp.min_params", .kind = Kind::Int,
   .allowed = "a parameter count >= 1", .default_value = "1048576", .lo = 1,
   .hi = int64_t(1) << 62, .aliases = kFsdpMinParamsAliases,
   .question = {"At least how many parameters make an entry a unit?",
                "fsdp_config.fsdp_wrap=min_params"}},
  {.yaml = "fsdp_config.fsdp_reshard_after_forward", .flag = "--fsdp_reshard_after_forward",
   .env = env::kFsdpReshardAfterForward, .field = "AcceleratorConfig::fsdp.reshard_after_forward",
   .kind = Kind::Bool, .allowed = "true|false", .default_value = "true",
   .aliases = kFsdpReshardAliases},
  {.yaml = "fsdp_config.fsdp_prefetch", .flag = "--fsdp_prefetch", .env = env::kFsdpPrefetch,
   .field = "AcceleratorConfig::fsdp.prefetch", .kind = Kind::Bool, .allowed = "true|false",
   .default_value = "true", .aliases = kFsdpPrefetchAliases, .aliases_agree = true},
  {.yaml = "fsdp_config.fsdp_activation_checkpointing", .flag = "--fsdp_activation_checkpointing",
   .env = env::kFsdpActivationCheckpointing,
   .field = "AcceleratorConfig::fsdp.activation_checkpointing", .kind = Kind::Bool,
   .allowed = "true|false", .default_value = "false", .switch_flag = true,
   .negation = "--fsdp_no_activation_checkpointing",
   .question = {"Recompute each unit's forward in its backward (activation checkpointing: less "
                "memory, more compute)?", "zero_config.zero_stage=3"}},
  {.yaml = "gradient_accumulation_steps", .flag = "--gradient_accumulation_steps",
   .env = env::kGradientAccumulationSteps,
   .field = "AcceleratorConfig::gradient_accumulation_steps", .kind = Kind::Int,
   .allowed = ">= 1", .default_value = "1", .lo = 1, .hi = int64_t(1) << 30,
   .question = {"How many gradient accumulation steps do you want?", ""}},
  {.yaml = "mixed_precision", .flag = "--mixed_precision", .env = env::kMixedPrecision,
   .field = "AcceleratorConfig::mixed_precision", .kind = Kind::Choice,
   .allowed = "no|fp16|bf16", .default_value = "no", .aliases = kMixedPrecisionAliases,
   .question = {"Do you wish to use mixed precision?", ""}},
  // Asked with the type of machine (launcher/questionnaire.cc), not from here.
  {.yaml = "use_cpu", .flag = "--cpu", .env = env::kUseCpu, .field = "AcceleratorConfig::cpu",
   .kind = Kind::Bool, .allowed = "true|false", .default_value = "false", .switch_flag = true},
#ifdef ACCEL_SETTINGS_PROBE
  // Note [the settings probe row]: a test build's row, with its one binding.
  {.yaml = "probe_config.probe_bucket_cap_mb", .flag = "--probe_bucket_cap_mb",
   .env = "ACCEL_PROBE_BUCKET_CAP_MB", .field = "AcceleratorConfig::ddp.bucket_cap_bytes",
   .kind = Kind::Int, .allowed = "MiB per DDP bucket", .default_value = "25", .lo = 1,
   .hi = 1024, .aliases = kProbeAliases,
   .question = {"How many MiB per DDP gradient bucket (test build only)?", "distributed"}},
#endif
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
constexpr const Setting* find_by_flag(std::string_view flag) {
  for (const Setting& s : kSettings)
    if (s.flag == flag) return &s;
  return nullptr;
}
// The row that config key `key` spells (its own key or an alias), and the alias (null: the key is
// the row's own and has no alias entry).
struct Spelling {
  const Setting* row = nullptr;
  const Alias* alias = nullptr;
};
constexpr Spelling find_by_key(std::string_view key) {
  for (const Setting& s : kSettings)
    for (const Alias& a : s.aliases)
      if (a.key == key) return {&s, &a};
  return {find_by_yaml(key), nullptr};
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
        if (!out.empty()) out += ',';
        out += one;
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

// Canonical values of rows, keyed by a column: by environment variable (the env column) for
// check_rules; by config key in accel-run's LaunchConfig::training and LaunchFlags::training.
// Rows nobody set are absent.
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
//   3. ZeRO-3 options need zero_stage 3, ZeRO compute dtypes a ZeRO stage (Note [options a stage
//      does not use]).
// Every strategy composes with tp_size > 1 (Note [apply order] in parallel/parallelize.h).
// Without a strategy or zero_stage in `v` the program decides the stage: rule 3 is skipped.
inline std::optional<Refusal> check_rules(const Values& v, std::optional<int> world) {
  auto get = [&](std::string_view env) -> const std::string* {
    auto it = v.find(env);
    return it == v.end() ? nullptr : &it->second;
  };
  auto number = [&](std::string_view env, int fallback) {
    const std::string* s = get(env);
    return s ? int(std::strtol(s->c_str(), nullptr, 10)) : fallback;
  };
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

// Note [questions from the table]: whether row `s` is asked, given the answers so far (by config
// key, canonical; a row not answered reads as its default) and whether the config is distributed.
inline bool question_applies(const Setting& s, const Values& answers, bool distributed) {
  if (s.question.prompt.empty()) return false;
  std::string_view rest = s.question.when;
  while (!rest.empty()) {
    const size_t amp = rest.find(" & ");
    const std::string_view one = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 3);
    if (one == "distributed") {
      if (!distributed) return false;
      continue;
    }
    const size_t op = one.find_first_of("!>=");
    const std::string_view key = one.substr(0, op);
    const bool ge = one[op] == '>', ne = one[op] == '!';
    const std::string_view want = one.substr(op + (ge || ne ? 2 : 1));
    const Setting* row = find_by_yaml(key);
    if (!row) return false;  // tests/launcher/test_settings.cc: every condition names a row
    const auto it = answers.find(key);
    const std::string have = it != answers.end() ? it->second : std::string(row->default_value);
    const bool holds = ge ? std::strtoll(have.c_str(), nullptr, 10) >=
                                std::strtoll(std::string(want).c_str(), nullptr, 10)
                          : (have == want) != ne;
    if (!holds) return false;
  }
  return true;
}

}  // namespace ACCEL_SETTINGS_ABI
}  // namespace accel::settings
