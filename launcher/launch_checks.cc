// Note [checks before any worker starts] in launcher/launch_checks.h.
#include "launcher/launch_checks.h"

#include <optional>
#include <string_view>

#include "core/env_contract.h"
#include "core/settings.h"
#include "launcher/plan.h"

namespace accel::launcher {

namespace {

// Row `s`'s value in config `c`, as accel-run would export it.
std::optional<std::string> exported_from(const LaunchConfig& c, const settings::Setting& s) {
  LaunchPlan p;
  p.config = c;
  p.use_cpu = c.use_cpu();
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
  // Note [cross-row rules] in core/settings.h: the rules the Accelerator runs too.
  settings::Values values;
  for (const auto& [var, o] : s) values.emplace(var, o.value);
  const std::optional<settings::Refusal> r = settings::check_rules(values, world);
  if (!r) return;
  std::vector<std::pair<std::string, const SettingOrigin*>> used;
  for (const auto& [what, var] : r->used) used.emplace_back(what, find(s, var));
  refuse(where, r->why, used);
}

}  // namespace accel::launcher
