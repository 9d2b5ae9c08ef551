// AcceleratorConfig: the strategy a config names and the checks the Accelerator's constructor runs
// on it (with_env, the settings table's bindings: accelerate/config_settings.cc).
#include "accelerate/config_detail.h"

#include "accelerate/accelerator.h"
#include "accelerate/strategy_registry.h"
#include "core/error.h"
#include "core/parallelism.h"

namespace accel {

std::string_view distributed_type_name(DistributedType t) {
  switch (t) {
    case DistributedType::No: return "NO";
    case DistributedType::MultiCPU: return "MULTI_CPU";
    case DistributedType::MultiGPU: return "MULTI_GPU";
  }
  return "?";
}

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

std::shared_ptr<const dist::StrategyOptions> strategy_options(const AcceleratorConfig& c,
                                                              const dist::StrategySpec& spec) {
  if (!spec.options) return c.strategy_options;
  return spec.options(dist::StrategyInputs{c.ddp, c.zero, c.fsdp, c.strategy_options});
}

}  // namespace config_detail

}  // namespace accel
