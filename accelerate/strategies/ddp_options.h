// The options of "ddp" (Note [typed strategy options] in accelerate/strategies/options.h):
// gradient buckets, unused parameters and buffer broadcast (AcceleratorConfig::ddp).
#pragma once

#include <memory>

#include "accelerate/strategies/options.h"
#include "parallel/ddp.h"

namespace accel::dist {

struct DdpStrategyOptions : StrategyOptions {
  DDPOptions ddp;

  static std::shared_ptr<const DdpStrategyOptions> from(const StrategyInputs& in) {
    auto o = std::make_shared<DdpStrategyOptions>();
    o->ddp = in.ddp;
    return o;
  }
};

}  // namespace accel::dist
