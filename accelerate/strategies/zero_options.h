// The options of "zero1" / "zero2" (Note [typed strategy options] in
// accelerate/strategies/options.h): bf16/fp16 compute parameters over fp32 master shards
// (param_dtype, reduce_in_fp32; AcceleratorConfig::zero). Stage, bucket size, unused parameters
// and root come from the registration and StrategyContext::ddp.
#pragma once

#include <memory>

#include "accelerate/strategies/options.h"
#include "parallel/zero.h"

namespace accel::dist {

struct ZeroStrategyOptions : StrategyOptions {
  ZeroOptions zero;

  static std::shared_ptr<const ZeroStrategyOptions> from(const StrategyInputs& in) {
    auto o = std::make_shared<ZeroStrategyOptions>();
    o->zero = in.zero;
    return o;
  }
};

}  // namespace accel::dist
