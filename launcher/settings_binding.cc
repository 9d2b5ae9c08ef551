#include "launcher/settings_binding.h"

#include <string_view>

#include "core/env_contract.h"
#include "core/error.h"

namespace accel::launcher {

namespace {

using settings::Setting;
using Text = std::optional<std::string>;

template <typename T>
Text number(const std::optional<T>& v) {
  return v ? Text(std::to_string(*v)) : std::nullopt;
}
Text boolean(const std::optional<bool>& v) {
  return v ? Text(*v ? "true" : "false") : std::nullopt;
}

// Per row of core/settings.h: the LaunchConfig field a canonical value goes to and comes from.
struct Binding {
  std::string_view key;
  void (*set)(LaunchConfig&, const std::string&);
  Text (*get)(const LaunchConfig&);
};
// clang-format off
const Binding kBindings[] = {
  {"mixed_precision", [](LaunchConfig& c, const std::string& v) { c.mixed_precision = v; },
   [](const LaunchConfig& c) { return c.mixed_precision; }},
  {"use_cpu", [](LaunchConfig& c, const std::string& v) { c.use_cpu = v == "true"; },
   [](const LaunchConfig& c) { return boolean(c.use_cpu); }},
  {"gradient_accumulation_steps",
   [](LaunchConfig& c, const std::string& v) { c.gradient_accumulation_steps = std::stoi(v); },
   [](const LaunchConfig& c) { return number(c.gradient_accumulation_steps); }},
  {"zero_config.zero_stage", [](LaunchConfig& c, const std::string& v) { c.zero_stage = std::stoi(v); },
   [](const LaunchConfig& c) { return number(c.zero_stage); }},
  {"strategy", [](LaunchConfig& c, const std::string& v) { c.strategy = v; },
   [](const LaunchConfig& c) { return c.strategy; }},
  {"zero_config.param_dtype", [](LaunchConfig& c, const std::string& v) { c.param_dtype = v; },
   [](const LaunchConfig& c) { return c.param_dtype; }},
  {"zero_config.reduce_dtype", [](LaunchConfig& c, const std::string& v) { c.reduce_dtype = v; },
   [](const LaunchConfig& c) { return c.reduce_dtype; }},
  {"fsdp_config.fsdp_wrap", [](LaunchConfig& c, const std::string& v) { c.fsdp_wrap = v; },
   [](const LaunchConfig& c) { return c.fsdp_wrap; }},
  {"fsdp_config.fsdp_wrap_classes", [](LaunchConfig& c, const std::string& v) { c.fsdp_wrap_classes = v; },
   [](const LaunchConfig& c) { return c.fsdp_wrap_classes; }},
  {"fsdp_config.fsdp_min_params",
   [](LaunchConfig& c, const std::string& v) { c.fsdp_min_params = std::stoll(v); },
   [](const LaunchConfig& c) { return number(c.fsdp_min_params); }},
  {"fsdp_config.fsdp_reshard_after_forward",
   [](LaunchConfig& c, const std::string& v) { c.fsdp_reshard_after_forward = v == "true"; },
   [](const LaunchConfig& c) { return boolean(c.fsdp_reshard_after_forward); }},
  {"fsdp_config.fsdp_prefetch", [](LaunchConfig& c, const std::string& v) { c.fsdp_prefetch = v == "true"; },
   [](const LaunchConfig& c) { return boolean(c.fsdp_prefetch); }},
  {"fsdp_config.fsdp_activation_checkpointing",
   [](LaunchConfig& c, const std::string& v) { c.fsdp_activation_checkpointing = v == "true"; },
   [](const LaunchConfig& c) { return boolean(c.fsdp_activation_checkpointing); }},
  {"parallelism_config.parallelism_config_dp_replicate_size",
   [](LaunchConfig& c, const std::string& v) { c.dp_replicate_size = std::stoi(v); },
   [](const LaunchConfig& c) { return number(c.dp_replicate_size); }},
  {"parallelism_config.parallelism_config_dp_shard_size",
   [](LaunchConfig& c, const std::string& v) { c.dp_shard_size = std::stoi(v); },
   [](const LaunchConfig& c) { return number(c.dp_shard_size); }},
  {"parallelism_config.parallelism_config_tp_size",
   [](LaunchConfig& c, const std::string& v) { c.tp_size = std::stoi(v); },
   [](const LaunchConfig& c) { return number(c.tp_size); }},
};
// clang-format on

const Binding& binding(const Setting& s) {
  for (const Binding& b : kBindings)
    if (b.key == s.yaml) return b;
  ACCEL_THROW(launcher::ConfigError, "launch", "setting '", s.yaml,
              "' has no binding in launcher/settings_binding.cc");
}

}  // namespace

void set_setting_flag(LaunchFlags& f, const Setting& s, const std::string& raw) {
  std::string why;
  std::optional<std::string> v = settings::parse(s, raw, &why);
  ACCEL_CHECK(v.has_value(), launcher::ConfigError, "launch", s.flag, ": ", why);
  f.training[std::string(s.yaml)] = std::move(*v);
}

void set_setting_flag(LaunchFlags& f, std::string_view key_or_flag, const std::string& raw) {
  for (const Setting& s : settings::kSettings)
    if (s.flag == key_or_flag) return set_setting_flag(f, s, raw);
  set_setting_flag(f, setting_row(key_or_flag), raw);
}

void set_config_setting(LaunchConfig& c, const Setting& s, const std::string& canonical) {
  binding(s).set(c, canonical);
}

std::optional<std::string> config_setting(const LaunchConfig& c, const Setting& s) {
  return binding(s).get(c);
}

std::optional<std::string> exported_setting(const LaunchPlan& p, const Setting& s) {
  // Never exported as false: the program may still choose the CPU.
  if (s.env == env::kUseCpu) return p.use_cpu ? Text("true") : std::nullopt;
  return config_setting(p.config, s);
}

}  // namespace accel::launcher
