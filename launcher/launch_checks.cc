// Note [checks before any worker starts] in launcher/launch_checks.h.
#include "launcher/launch_checks.h"

#include <optional>
#include <string_view>

#include "core/env_contract.h"
#include "core/parallelism.h"
#include "core/settings.h"
#include "launcher/plan.h"
#include "launcher/settings_binding.h"

namespace accel::launcher {

namespace {

// Row `s`'s value in config `c`, as accel-run would export it.
std::optional<std::string> exported_from(const LaunchConfig& c, const settings::Setting& s) {
  LaunchPlan p;
  p.config = c;
  p.use_cpu = c.use_cpu;
  return exported_setting(p, s);
}

const SettingOrigin* find(const EffectiveSettings& s, std::string_view env) {
  auto it = s.find(env);
  return it == s.end() ? nullptr : &it->second;
}

// "tp_size 2 (from --tp_size)"
std::string origin(const std::string& what, const SettingOrigin& o) {
  return what + " " + o.value + " from " + o.from;
}

// What to do about the inherited values among `used`, or "".
std::string inherited_advice(const std::vector<const SettingOrigin*>& used) {
  std::string names, unset;
  for (const SettingOrigin* o : used)
    if (o && o->inherited) {
      names += (names.empty() ? "" : ", ") + o->var;
      unset += " -u " + o->var;
    }
  if (names.empty()) return "";
  return "; the workers would inherit " + names + " from accel-run's environment: unset it (env" +
         unset +
         " accel-run ...) or give the setting to accel-run (flag or config key), which "
         "overrides it";
}

std::string sources(const std::vector<std::pair<std::string, const SettingOrigin*>>& used) {
  std::string s;
  for (const auto& [what, o] : used)
    if (o) s += (s.empty() ? "" : "; ") + origin(what, *o);
  return s.empty() ? s : " (" + s + ")";
}

[[noreturn]] void refuse(const std::string& where, const std::string& why,
                         const std::vector<std::pair<std::string, const SettingOrigin*>>& used) {
  std::vector<const SettingOrigin*> origins;
  for (const auto& u : used) origins.push_back(u.second);
  ACCEL_THROW(launcher::ConfigError, "launch", where, ": ", why, sources(used),
              inherited_advice(origins));
}

}  // namespace

EffectiveSettings effective_settings(const LaunchConfig& merged, const LaunchConfig& flags_only,
                                     const EnvMap& env, const std::string& config_where) {
  EffectiveSettings out;
  for (const settings::Setting& s : settings::kSettings) {
    const std::string var(s.env);
    if (auto v = exported_from(merged, s)) {
      std::string from =
          exported_from(flags_only, s)
              ? std::string(s.flag)
              : "key " + std::string(s.yaml) + (config_where.empty() ? "" : " of " + config_where);
      out[var] = {*v, std::move(from), var, false};
    } else if (auto raw = env_get(env, var)) {
      // Note [checks before any worker starts]: the worker reads it through the row's parser.
      std::string why;
      const std::optional<std::string> v = settings::parse(s, *raw, &why);
      ACCEL_CHECK(v.has_value(), launcher::ConfigError, "launch", var, "='", *raw,
                  "' is exported in accel-run's environment and every worker would inherit it: ",
                  why, "; unset it (env -u ", var, " accel-run ...) or give ", s.flag, " (or key ",
                  s.yaml, "), which overrides it");
      out[var] = {*v, var + " inherited from accel-run's environment", var, true};
    }
  }
  return out;
}

void check_effective_settings(const EffectiveSettings& s, int world, const std::string& where) {
  // The mesh (Note [mesh sizes] in core/parallelism.h).
  ParallelismConfig p;
  std::vector<std::pair<std::string, const SettingOrigin*>> sizes;
  for (const ParallelDim& d : kParallelDims) {
    const SettingOrigin* o = find(s, d.env);
    if (o) p.*d.given = std::stoi(o->value);
    sizes.emplace_back(std::string(d.name) + "_size", o);
  }
  std::string why;
  const std::optional<MeshSizes> mesh = infer_mesh_sizes(p, world, &why);
  if (!mesh)
    refuse(where,
           "parallelism_config (--dp_replicate_size, --dp_shard_size, --tp_size) does not fit " +
               std::to_string(world) + " processes: " + why,
           sizes);

  // The strategy, resolved as AcceleratorConfig::with_env resolves it: a zero_stage given alone
  // names its built-in strategy; a strategy given alone runs at its own stage.
  const SettingOrigin* stage_o = find(s, env::kZeroStage);
  const SettingOrigin* name_o = find(s, env::kStrategy);
  const int stage = stage_o ? std::stoi(stage_o->value) : 0;
  if (name_o && stage_o)
    if (auto conflict = strategy_stage_conflict(name_o->value, stage))
      refuse(where, *conflict, {{"strategy", name_o}, {"zero_stage", stage_o}});
  std::optional<std::string> strategy;  // unknown: the program's AcceleratorConfig decides
  if (name_o) {
    strategy = name_o->value;
  } else if (stage_o) {
    if (const BuiltinStrategy* b = builtin_strategy_for_stage(stage))
      strategy = std::string(b->name);
  }
  std::optional<int> run_stage;
  if (strategy) run_stage = strategy_zero_stage(*strategy);

  // Note [strategies with tensor parallelism].
  if (strategy)
    if (auto conflict = tp_strategy_conflict(mesh->tp, *strategy))
      refuse(where, *conflict,
             {{"tp_size", find(s, env::kTpSize)},
              {"strategy", name_o},
              {"zero_stage", name_o ? nullptr : stage_o}});

  // Note [options a stage does not use].
  if (!run_stage) return;
  std::string zero3, dtypes;
  std::vector<std::pair<std::string, const SettingOrigin*>> used;
  for (const settings::Setting& row : settings::kSettings) {
    const SettingOrigin* o = find(s, row.env);
    if (!o) continue;
    const std::string given = std::string(row.env) + "=" + o->value;
    if (settings::is_zero3_option(row) && *run_stage != 3) {
      zero3 += (zero3.empty() ? "" : ", ") + given;
      used.emplace_back(std::string(row.env), o);
    }
    const bool dtype =
        row.env == env::kReduceDtype || (row.env == env::kParamDtype && o->value != "fp32");
    if (dtype && *run_stage == 0) {
      dtypes += (dtypes.empty() ? "" : ", ") + given;
      used.emplace_back(std::string(row.env), o);
    }
  }
  used.emplace_back("strategy", name_o);
  used.emplace_back("zero_stage", stage_o);
  if (!zero3.empty()) refuse(where, settings::zero3_options_refusal(zero3, *run_stage), used);
  if (!dtypes.empty()) refuse(where, settings::zero_dtype_refusal(dtypes), used);
}

}  // namespace accel::launcher
