#include "launcher/settings_binding.h"

#include <string_view>

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

// Per row of core/settings.h: where the flag's parsed value goes, and what the plan exports.
struct Binding {
  std::string_view key;
  void (*set)(LaunchFlags&, const std::string&);
  Text (*get)(const LaunchPlan&);
};
// clang-format off
const Binding kBindings[] = {
  {"mixed_precision", [](LaunchFlags& f, const std::string& v) { f.mixed_precision = v; },
   [](const LaunchPlan& p) { return p.config.mixed_precision; }},
  // Never exported as false: the program may still choose the CPU.
  {"use_cpu", [](LaunchFlags& f, const std::string& v) { f.cpu = v == "true"; },
   [](const LaunchPlan& p) { return p.use_cpu ? Text("true") : std::nullopt; }},
  {"gradient_accumulation_steps",
   [](LaunchFlags& f, const std::string& v) { f.gradient_accumulation_steps = std::stoi(v); },
   [](const LaunchPlan& p) { return number(p.config.gradient_accumulation_steps); }},
  {"zero_config.zero_stage", [](LaunchFlags& f, const std::string& v) { f.zero_stage = std::stoi(v); },
   [](const LaunchPlan& p) { return number(p.config.zero_stage); }},
  {"strategy", [](LaunchFlags& f, const std::string& v) { f.strategy = v; },
   [](const LaunchPlan& p) { return p.config.strategy; }},
  {"zero_config.param_dtype", [](LaunchFlags& f, const std::string& v) { f.param_dtype = v; },
   [](const LaunchPlan& p) { return p.config.param_dtype; }},
  {"zero_config.reduce_dtype", [](LaunchFlags& f, const std::string& v) { f.reduce_dtype = v; },
   [](const LaunchPlan& p) { return p.config.reduce_dtype; }},
  {"fsdp_config.fsdp_wrap", [](LaunchFlags& f, const std::string& v) { f.fsdp_wrap = v; },
   [](const LaunchPlan& p) { return p.config.fsdp_wrap; }},
  {"fsdp_config.fsdp_wrap_classes", [](LaunchFlags& f, const std::string& v) { f.fsdp_wrap_classes = v; },
   [](const LaunchPlan& p) { return p.config.fsdp_wrap_classes; }},
  {"fsdp_config.fsdp_min_params",
   [](LaunchFlags& f, const std::string& v) { f.fsdp_min_params = std::stoll(v); },
   [](const LaunchPlan& p) { return number(p.config.fsdp_min_params); }},
  {"fsdp_config.fsdp_reshard_after_forward",
   [](LaunchFlags& f, const std::string& v) { f.fsdp_reshard_after_forward = v; },
   [](const LaunchPlan& p) { return boolean(p.config.fsdp_reshard_after_forward); }},
  {"fsdp_config.fsdp_prefetch", [](LaunchFlags& f, const std::string& v) { f.fsdp_prefetch = v; },
   [](const LaunchPlan& p) { return boolean(p.config.fsdp_prefetch); }},
  {"fsdp_config.fsdp_activation_checkpointing",
   [](LaunchFlags& f, const std::string& v) { f.fsdp_activation_checkpointing = v; },
   [](const LaunchPlan& p) { return boolean(p.config.fsdp_activation_checkpointing); }},
  {"parallelism_config.parallelism_config_dp_replicate_size",
   [](LaunchFlags& f, const std::string& v) { f.dp_replicate_size = std::stoi(v); },
   [](const LaunchPlan& p) { return number(p.config.dp_replicate_size); }},
  {"parallelism_config.parallelism_config_dp_shard_size",
   [](LaunchFlags& f, const std::string& v) { f.dp_shard_size = std::stoi(v); },
   [](const LaunchPlan& p) { return number(p.config.dp_shard_size); }},
  {"parallelism_config.parallelism_config_tp_size",
   [](LaunchFlags& f, const std::string& v) { f.tp_size = std::stoi(v); },
   [](const LaunchPlan& p) { return number(p.config.tp_size); }},
};
// clang-format on

const Binding& binding(const Setting& s) {
  for (const Binding& b : kBindings)
    if (b.key == s.yaml) return b;
  ACCEL_THROW(launcher::ConfigError, "launch", "setting '", s.yaml,
              "' has no binding in launcher/settings_binding.cc");
}

}  // namespace

std::string parse_setting_flag(std::string_view key, const std::string& raw) {
  const Setting& s = setting_row(key);
  std::string why;
  std::optional<std::string> v = settings::parse(s, raw, &why);
  ACCEL_CHECK(v.has_value(), launcher::ConfigError, "launch", s.flag, ": ", why);
  return *v;
}

void set_setting_flag(LaunchFlags& f, const Setting& s, const std::string& raw) {
  binding(s).set(f, parse_setting_flag(s.yaml, raw));
}

std::optional<std::string> exported_setting(const LaunchPlan& p, const Setting& s) {
  return binding(s).get(p);
}

}  // namespace accel::launcher
