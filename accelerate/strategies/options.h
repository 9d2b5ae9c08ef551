// What a strategy's options are built from (Note [typed strategy options]): the Accelerator hands
// its registration's `options` function these, never the AcceleratorConfig, so no strategy
// includes accelerate/accelerator.h (scripts/check-layer-includes fails on one that does).
//
// Note [typed strategy options]
// Each built-in strategy has its own options type in this folder (ddp_options.h, zero_options.h,
// fsdp_options.h): `struct XStrategyOptions : StrategyOptions` with a `from(const
// StrategyInputs&)` that the strategy's registration (StrategySpec::options) calls; the strategy
// reads it back with StrategyContext::options_as<XStrategyOptions>(). A program's own strategy
// takes AcceleratorConfig::strategy_options as given (StrategyInputs::strategy_options). A new
// setting of a built-in strategy is a row of core/settings.h, its binding line in
// accelerate/config_settings.cc and the field here its strategy reads.
#pragma once

#include <memory>

namespace accel::dist {

struct DDPOptions;   // parallel/ddp.h
struct ZeroOptions;  // parallel/zero.h
struct FsdpOptions;  // parallel/fsdp.h

// A strategy's own options, one typed value per strategy (LocalSgdOptions in
// tests/accelerate/test_strategy_seam.cc, the built-ins' XStrategyOptions).
struct StrategyOptions {
  virtual ~StrategyOptions() = default;
};

// The AcceleratorConfig fields strategies read (AcceleratorConfig::ddp, zero, fsdp and
// strategy_options), by reference: valid during the `options` call only.
struct StrategyInputs {
  const DDPOptions& ddp;
  const ZeroOptions& zero;
  const FsdpOptions& fsdp;
  const std::shared_ptr<const StrategyOptions>& strategy_options;  // the program's; may be null
};

}  // namespace accel::dist
