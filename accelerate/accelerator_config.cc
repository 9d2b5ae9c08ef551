// AcceleratorConfig: what with_env reads (the settings table, core/settings.h), the strategy a
// config names, and the checks the Accelerator's constructor runs on it.
#include "accelerate/config_detail.h"

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "accelerate/accelerator.h"
#include "accelerate/strategy_registry.h"
#include "comm/env.h"
#include "core/env_contract.h"
#include "core/error.h"
#include "core/parallelism.h"
#include "core/settings.h"

namespace accel {

std::string_view distributed_type_name(DistributedType t) {
  switch (t) {
    case DistributedType::No: return "NO";
    case DistributedType::MultiCPU: return "MULTI_CPU";
    case DistributedType::MultiGPU: return "MULTI_GPU";
  }
  return "?";
}

namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// One row of the settings table (core/settings.h), its value already parsed by the table, into
// its AcceleratorConfig field. param and reduce dtype apply to stages 1-2 (zero) and 3 (fsdp)
// alike.
void apply_setting(AcceleratorConfig& c, const settings::Setting& s, const std::string& v) {
  using W = dist::FsdpOptions::Wrap;
  const std::string_view k = s.env;
  if (k == env::kMixedPrecision) {
    c.mixed_precision = dist::parse_mixed_precision(v, env::kMixedPrecision);
  } else if (k == env::kUseCpu) {
    c.cpu = v == "true";
  } else if (k == env::kGradientAccumulationSteps) {
    c.gradient_accumulation_steps = std::stoi(v);
  } else if (k == env::kZeroStage) {
    c.zero_stage = std::stoi(v);
  } else if (k == env::kStrategy) {
    c.strategy = v;
  } else if (k == env::kParamDtype) {
    // fp32: no conversion (compute in the parameters' own dtype).
    std::optional<DType> d;
    if (v != "fp32") d = v == "bf16" ? kBFloat16 : kFloat16;
    c.zero.param_dtype = c.fsdp.param_dtype = d;
  } else if (k == env::kReduceDtype) {
    c.zero.reduce_in_fp32 = c.fsdp.reduce_in_fp32 = v == "fp32";
  } else if (k == env::kFsdpWrap) {
    c.fsdp.wrap = v == "entries"   ? W::Entries
                  : v == "classes" ? W::Classes
                  : v == "none"    ? W::None
                                   : W::MinParams;
  } else if (k == env::kFsdpWrapClasses) {
    std::vector<std::string> names;
    std::stringstream in(v);
    for (std::string name; std::getline(in, name, ',');) names.push_back(name);
    c.fsdp.classes = names;
  } else if (k == env::kFsdpMinParams) {
    c.fsdp.min_params = std::stoll(v);
  } else if (k == env::kFsdpReshardAfterForward) {
    c.fsdp.reshard_after_forward = v == "true";
  } else if (k == env::kFsdpPrefetch) {
    c.fsdp.prefetch = v == "true";
  } else if (k == env::kFsdpActivationCheckpointing) {
    c.fsdp.activation_checkpointing = v == "true";
  } else if (k == env::kDpReplicateSize) {
    c.parallelism.dp_replicate_size = std::stoi(v);
  } else if (k == env::kDpShardSize) {
    c.parallelism.dp_shard_size = std::stoi(v);
  } else if (k == env::kTpSize) {
    c.parallelism.tp_size = std::stoi(v);
  } else {
    ACCEL_THROW(ValueError, "accelerator", "setting ", s.env,
                " has no AcceleratorConfig field (apply_setting in accelerate/accelerator.cc)");
  }
}

// Options the environment sets that this run would not use are refused, not ignored (as
// accel-run refuses them: Note [accelerate keys accel does not implement] in launcher/config.cc).
void check_env_applies(const AcceleratorConfig& c) {
  std::string fsdp;
  for (const char* name :
       {env::kFsdpWrap, env::kFsdpWrapClasses, env::kFsdpMinParams, env::kFsdpReshardAfterForward,
        env::kFsdpPrefetch, env::kFsdpActivationCheckpointing})
    if (const char* v = env_or_null(name))
      fsdp += (fsdp.empty() ? "" : ", ") + std::string(name) + "=" + v;
  // Note [options a stage does not use] in core/settings.h (accel-run checks the same).
  ACCEL_CHECK(fsdp.empty() || c.zero_stage == 3, ValueError, "accelerator",
              settings::zero3_options_refusal(fsdp, c.zero_stage));
  const char* param = env_or_null(env::kParamDtype);
  const char* reduce = env_or_null(env::kReduceDtype);
  const bool converts = (param && lower(param) != "fp32") || reduce;
  ACCEL_CHECK(!converts || c.zero_stage != 0, ValueError, "accelerator",
              settings::zero_dtype_refusal(
                  (param ? std::string(env::kParamDtype) + "=" + param : std::string("")) +
                  (param && reduce ? ", " : "") +
                  (reduce ? std::string(env::kReduceDtype) + "=" + reduce : std::string(""))));
}

}  // namespace

namespace config_detail {

// Sets zero_stage from a built-in strategy's registration (Note [strategy registry]) and, with
// `fill_name`, an empty AcceleratorConfig::strategy from zero_stage; ValueError for a name
// nothing registered, or a zero_stage that contradicts the name.
void resolve_strategy(AcceleratorConfig& c, bool fill_name) {
  if (c.strategy.empty()) {
    const std::string name = dist::strategy_for_zero_stage(c.zero_stage);
    if (fill_name) c.strategy = name;
    return;
  }
  const dist::StrategySpec* spec = dist::find_strategy(c.strategy);
  if (!spec) {
    std::string names;
    for (const std::string& n : dist::registered_strategies())
      names += (names.empty() ? "" : ", ") + n;
    ACCEL_THROW(ValueError, "accelerator", "strategy '", c.strategy,
                "' is not registered (registered: ", names, ")");
  }
  const int stage = spec->zero_stage < 0 ? 0 : spec->zero_stage;
  // Note [built-in strategies] in core/parallelism.h: accel-run refuses the same pairs.
  const std::optional<std::string> conflict = strategy_stage_conflict(c.strategy, c.zero_stage);
  ACCEL_CHECK(!conflict, ValueError, "accelerator", *conflict);
  ACCEL_INTERNAL_ASSERT(stage == strategy_zero_stage(c.strategy));
  c.zero_stage = stage;
}

void check_config(const AcceleratorConfig& c) {
  const dist::StrategySpec* spec = dist::find_strategy(c.strategy);
  ACCEL_CHECK(!spec || !spec->options || !c.strategy_options, ValueError, "accelerator",
              "strategy '", c.strategy,
              "' reads its options from AcceleratorConfig::ddp / zero / fsdp; strategy_options is "
              "for strategies without fields there");
  ACCEL_CHECK(c.gradient_accumulation_steps >= 1, ValueError, "accelerator",
              "gradient_accumulation_steps must be >= 1, got ", c.gradient_accumulation_steps);
  ACCEL_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3, ValueError, "accelerator",
              "zero_stage must be in 0..3, got ", c.zero_stage);
  ACCEL_CHECK(c.total_limit >= 0, ValueError, "accelerator", "total_limit must be >= 0, got ",
              c.total_limit);
  // Fields the facade does not read are refused when set, not ignored.
  ACCEL_CHECK(c.ddp.root == 0, ValueError, "accelerator", "ddp.root is ", c.ddp.root,
              ": the Accelerator always starts every rank from rank 0's parameters (ddp.root "
              "is not read; leave it 0)");
  const dist::ZeroOptions z;
  ACCEL_CHECK(c.zero.stage == z.stage && c.zero.bucket_cap_bytes == z.bucket_cap_bytes &&
                  c.zero.find_unused_parameters == z.find_unused_parameters &&
                  c.zero.root == z.root,
              ValueError, "accelerator",
              "zero.stage, zero.bucket_cap_bytes, zero.find_unused_parameters and zero.root are "
              "not read: set zero_stage, ddp.bucket_cap_bytes and ddp.find_unused_parameters "
              "(zero.param_dtype and zero.reduce_in_fp32 are the zero fields the Accelerator "
              "reads)");
}

}  // namespace config_detail

using config_detail::resolve_strategy;

AcceleratorConfig AcceleratorConfig::with_env() const {
  AcceleratorConfig c = *this;
  // Every setting of core/settings.h the environment holds, parsed by the table.
  for (const settings::Setting& s : settings::kSettings) {
    const std::string name(s.env);
    const char* raw = env_or_null(name.c_str());
    if (!raw) continue;
    std::string why;
    const std::optional<std::string> v = settings::parse(s, raw, &why);
    ACCEL_CHECK(v.has_value(), ValueError, "accelerator", name, "='", raw, "': ", why);
    apply_setting(c, s, *v);
  }
  // A zero_stage from the launcher names the strategy, unless ACCEL_STRATEGY does (and a
  // strategy from it leaves zero_stage to its registration).
  const bool stage = env_or_null(env::kZeroStage) != nullptr;
  const bool named = env_or_null(env::kStrategy) != nullptr;
  if (stage && !named) c.strategy.clear();
  if (named && !stage) c.zero_stage = 0;
  resolve_strategy(c, /*fill_name=*/false);
  check_env_applies(c);
  return c;
}

}  // namespace accel
