// What accelerate/accelerator_config.cc gives the Accelerator's constructor. Internal to
// accelerate/accelerator*.cc.
#pragma once

namespace accel {

struct AcceleratorConfig;

namespace config_detail {

// Sets zero_stage from a built-in strategy's registration and, with `fill_name`, an empty
// AcceleratorConfig::strategy from zero_stage; ValueError for an unregistered name or a
// zero_stage that contradicts it.
void resolve_strategy(AcceleratorConfig& c, bool fill_name);
// ValueError for a field out of range or one the facade does not read.
void check_config(const AcceleratorConfig& c);

}  // namespace config_detail
}  // namespace accel
