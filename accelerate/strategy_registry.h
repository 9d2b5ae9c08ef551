// The strategies by name: the Accelerator builds the one AcceleratorConfig::strategy names (or
// the one zero_stage names when that is empty) through this registry, and never switches on a
// strategy itself.
//
// Note [strategy registry]
// Each strategy registers itself from its own file with a static StrategyRegistration:
//   none   accelerate/strategy.cc       one process, no communication
//   ddp    accelerate/strategy_ddp.cc   gradients all-reduced in buckets (zero_stage 0)
//   zero1  accelerate/strategy_zero.cc  1/N optimizer state (zero_stage 1)
//   zero2  accelerate/strategy_zero.cc  1/N gradients and optimizer state (zero_stage 2)
//   fsdp   accelerate/strategy_fsdp.cc  1/N of everything, per wrapping unit (zero_stage 3)
// A program or a test registers its own the same way (tests/accelerate/test_strategy_seam.cc
// registers local SGD) and selects it with AcceleratorConfig::strategy, `accel-run --strategy`
// or ACCEL_STRATEGY; its options travel as one typed value (AcceleratorConfig::strategy_options,
// read back with StrategyContext::options_as<T>(); the built-ins' types are in
// accelerate/strategies/).
// With one process, a strategy whose runs_alone() is false is replaced by "none": one process
// needs no communication (Note [one process under ZeRO] in accelerate/strategy.cc says when the
// built-in ones still run on a group of one).
// Registration runs during static initialisation of libaccel (or of the program): the registry
// is a function-local static, so the order between files does not matter.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "accelerate/strategies/options.h"
#include "accelerate/strategy.h"

namespace accel::dist {

struct StrategySpec {
  std::string name;  // what AcceleratorConfig::strategy and ACCEL_STRATEGY say
  std::function<std::unique_ptr<Strategy>(const StrategyContext&)> make;
  // Whether one process still runs this strategy (on a group of one) instead of "none";
  // null: never.
  std::function<bool(const StrategyContext&)> runs_alone;
  // The zero_stage that selects it when AcceleratorConfig::strategy is empty (and that
  // state.json records); -1: none.
  int zero_stage = -1;
  // Its typed options from the AcceleratorConfig's fields (Note [typed strategy options] in
  // accelerate/strategies/options.h: the built-ins' XStrategyOptions::from); null:
  // AcceleratorConfig::strategy_options as given.
  std::function<std::shared_ptr<const StrategyOptions>(const StrategyInputs&)> options;
};

// ValueError when the name is empty, already registered, or `make` is null.
void register_strategy(StrategySpec spec);
// nullptr when no strategy of that name is registered.
const StrategySpec* find_strategy(std::string_view name);
// The registered names, sorted (for messages and `accel-run env`).
std::vector<std::string> registered_strategies();
// The built-in strategy of a zero_stage (0 "ddp", 1 "zero1", 2 "zero2", 3 "fsdp"); ValueError
// outside 0..3.
std::string strategy_for_zero_stage(int zero_stage);

// The strategy `spec` builds for `ctx` (ctx.options already set): "none" with one process unless
// spec.runs_alone(ctx), which then runs on a group of one.
std::unique_ptr<Strategy> make_strategy(const StrategySpec& spec, StrategyContext ctx);

// Registers at static initialisation: `const StrategyRegistration r(spec);` at namespace scope.
struct StrategyRegistration {
  explicit StrategyRegistration(StrategySpec spec) { register_strategy(std::move(spec)); }
};

}  // namespace accel::dist
