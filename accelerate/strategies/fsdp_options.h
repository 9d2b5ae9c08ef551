// The options of "fsdp" (Note [typed strategy options] in accelerate/strategies/options.h):
// AcceleratorConfig::fsdp (find_unused_parameters also from StrategyContext::ddp; the HSDP
// replicate group from the mesh).
#pragma once

#include <memory>

#include "accelerate/strategies/options.h"
#include "parallel/fsdp.h"

namespace accel::dist {

struct FsdpStrategyOptions : StrategyOptions {
  FsdpOptions fsdp;

  static std::shared_ptr<const FsdpStrategyOptions> from(const StrategyInputs& in) {
    auto o = std::make_shared<FsdpStrategyOptions>();
    o->fsdp = in.fsdp;
    return o;
  }
};

}  // namespace accel::dist
