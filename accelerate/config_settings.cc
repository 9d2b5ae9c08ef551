// The library's side of the settings table (core/settings.h): one binding per row from its typed
// value to its AcceleratorConfig field, and AcceleratorConfig::with_env, which reads every row the
// environment sets through the one parser, types it once, binds it, and then runs the cross-row
// rules accel-run ran (Note [cross-row rules] in core/settings.h).
#include "accelerate/config_detail.h"

#include <cstdlib>
#include <string>

#include "accelerate/accelerator.h"
#include "core/env_contract.h"
#include "core/error.h"
#include "core/settings.h"

namespace accel {

namespace config_detail {

namespace {

using settings::Value;
using W = dist::FsdpOptions::Wrap;

std::optional<DType> compute_dtype(const Value& v) {  // fp32: no conversion
  if (v.s == "fp32") return std::nullopt;
  return v.s == "bf16" ? kBFloat16 : kFloat16;
}

// One line per row of core/settings.h: its env variable, the field it sets (the row's `field`,
// tests/launcher/test_settings.cc) and the setter. param and reduce dtype apply to stages 1-2
// (zero) and 3 (fsdp) alike.
// clang-format off
const SettingBinding kBindings[] = {
  {env::kMixedPrecision, "AcceleratorConfig::mixed_precision",
   [](AcceleratorConfig& c, const Value& v) {
     c.mixed_precision = dist::parse_mixed_precision(v.s, env::kMixedPrecision); }},
  {env::kUseCpu, "AcceleratorConfig::cpu", [](AcceleratorConfig& c, const Value& v) { c.cpu = v.b; }},
  {env::kGradientAccumulationSteps, "AcceleratorConfig::gradient_accumulation_steps",
   [](AcceleratorConfig& c, const Value& v) { c.gradient_accumulation_steps = int(v.i); }},
  {env::kZeroStage, "AcceleratorConfig::zero_stage",
   [](AcceleratorConfig& c, const Value& v) { c.zero_stage = int(v.i); }},
  {env::kStrategy, "AcceleratorConfig::strategy",
   [](AcceleratorConfig& c, const Value& v) { c.strategy = v.s; }},
  {env::kParamDtype, "AcceleratorConfig::{zero,fsdp}.param_dtype",
   [](AcceleratorConfig& c, const Value& v) { c.zero.param_dtype = c.fsdp.param_dtype = compute_dtype(v); }},
  {env::kReduceDtype, "AcceleratorConfig::{zero,fsdp}.reduce_in_fp32",
   [](AcceleratorConfig& c, const Value& v) { c.zero.reduce_in_fp32 = c.fsdp.reduce_in_fp32 = v.s == "fp32"; }},
  {env::kFsdpWrap, "AcceleratorConfig::fsdp.wrap",
   [](AcceleratorConfig& c, const Value& v) {
     c.fsdp.wrap = v.s == "entries" ? W::Entries : v.s == "classes" ? W::Classes
                   : v.s == "none" ? W::None : W::MinParams; }},
  {env::kFsdpWrapClasses, "AcceleratorConfig::fsdp.classes",
   [](AcceleratorConfig& c, const Value& v) { c.fsdp.classes = v.names; }},
  {env::kFsdpMinParams, "AcceleratorConfig::fsdp.min_params",
   [](AcceleratorConfig& c, const Value& v) { c.fsdp.min_params = v.i; }},
  {env::kFsdpReshardAfterForward, "AcceleratorConfig::fsdp.reshard_after_forward",
   [](AcceleratorConfig& c, const Value& v) { c.fsdp.reshard_after_forward = v.b; }},
  {env::kFsdpPrefetch, "AcceleratorConfig::fsdp.prefetch",
   [](AcceleratorConfig& c, const Value& v) { c.fsdp.prefetch = v.b; }},
  {env::kFsdpActivationCheckpointing, "AcceleratorConfig::fsdp.activation_checkpointing",
   [](AcceleratorConfig& c, const Value& v) { c.fsdp.activation_checkpointing = v.b; }},
  {env::kDpReplicateSize, "AcceleratorConfig::parallelism.dp_replicate_size",
   [](AcceleratorConfig& c, const Value& v) { c.parallelism.dp_replicate_size = int(v.i); }},
  {env::kDpShardSize, "AcceleratorConfig::parallelism.dp_shard_size",
   [](AcceleratorConfig& c, const Value& v) { c.parallelism.dp_shard_size = int(v.i); }},
  {env::kTpSize, "AcceleratorConfig::parallelism.tp_size",
   [](AcceleratorConfig& c, const Value& v) { c.parallelism.tp_size = int(v.i); }},
  {env::kCpSize, "AcceleratorConfig::parallelism.cp_size",
   [](AcceleratorConfig& c, const Value& v) { c.parallelism.cp_size = int(v.i); }},
  {env::kPpSize, "AcceleratorConfig::parallelism.pp_size",
   [](AcceleratorConfig& c, const Value& v) { c.parallelism.pp_size = int(v.i); }},
#ifdef ACCEL_SETTINGS_PROBE  // Note [the settings probe row] in core/settings.h
  {"ACCEL_PROBE_BUCKET_CAP_MB", "AcceleratorConfig::ddp.bucket_cap_bytes",
   [](AcceleratorConfig& c, const Value& v) { c.ddp.bucket_cap_bytes = size_t(v.i) << 20; }},
#endif
};
// clang-format on

const SettingBinding& binding_of(const settings::Setting& s) {
  for (const SettingBinding& b : kBindings)
    if (b.env == s.env) return b;
  ACCEL_THROW(ValueError, "accelerator", "setting ", s.env,
              " has no binding (kBindings in accelerate/config_settings.cc)");
}

const char* env_or_null(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return (v && *v) ? v : nullptr;
}

}  // namespace

inline namespace ACCEL_SETTINGS_ABI {
std::span<const SettingBinding> setting_bindings() { return kBindings; }
}  // namespace ACCEL_SETTINGS_ABI

}  // namespace config_detail

AcceleratorConfig AcceleratorConfig::with_env() const {
  AcceleratorConfig c = *this;
  // Every row the environment sets: the one parse, typed once, into its field.
  settings::Values given;
  for (const settings::Setting& s : settings::kSettings) {
    const std::string name(s.env);
    const char* raw = config_detail::env_or_null(name);
    if (!raw) continue;
    std::string why;
    std::optional<std::string> v = settings::parse(s, raw, &why);
    ACCEL_CHECK(v.has_value(), ValueError, "accelerator", name, "='", raw, "': ", why);
    config_detail::binding_of(s).set(c, settings::typed(s, *v));
    given.emplace(name, std::move(*v));
  }
  // A zero_stage from the launcher names the strategy, unless ACCEL_STRATEGY does (and a
  // strategy from it leaves zero_stage to its registration).
  const bool stage = given.count(env::kZeroStage) != 0;
  const bool named = given.count(env::kStrategy) != 0;
  if (stage && !named) c.strategy.clear();
  if (named && !stage) c.zero_stage = 0;
  config_detail::resolve_strategy(c, /*fill_name=*/false);
  // Note [cross-row rules] in core/settings.h: the environment's values with the stage and
  // strategy this run resolved (the program's when the environment names neither).
  settings::Values rules = given;
  rules[env::kZeroStage] = std::to_string(c.zero_stage);
  if (!c.strategy.empty()) rules[env::kStrategy] = c.strategy;
  if (std::optional<settings::Refusal> r = settings::check_rules(rules, std::nullopt))
    ACCEL_THROW(ValueError, "accelerator", r->why);
  return c;
}

}  // namespace accel
