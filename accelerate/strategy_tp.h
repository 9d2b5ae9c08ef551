// Tensor parallelism in the Accelerator: a dist::Strategy that splits each prepared model over the
// mesh's tp group (dist::parallelize, parallel/tensor_parallel.h) and hands it, now made of this
// rank's shards, to the data-parallel strategy it wraps (ddp over "dp", fsdp over dp_shard x
// dp_replicate). Internal to accelerate/. Note [tp strategy] in accelerate/strategy_tp.cc.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accelerate/strategy.h"
#include "parallel/tensor_parallel.h"

namespace accel::dist {

struct TpStrategyContext {
  ProcessGroupPtr tp;     // this rank's tp group
  ProcessGroupPtr world;  // the world group: gradient norms are reduced over it
  int world_rank = 0;
  int dp_size = 1;  // ranks of the mesh's "dp" dimension (dp_replicate x dp_shard)
  TpPlan plan;      // AcceleratorConfig::tp_plan
};

std::unique_ptr<Strategy> make_tp_strategy(std::unique_ptr<Strategy> inner, TpStrategyContext ctx);

}  // namespace accel::dist
