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

// Whether a state.json object is a tensor-parallel checkpoint's (it has a "tp" record).
bool is_tp_checkpoint(const nlohmann::json& saved);

// Note [tp checkpoint conversion] in accelerate/strategy_tp.cc: what one rank needs of a
// checkpoint saved at another tp size, rewritten as a plain 1-process checkpoint in a private
// temporary folder (returned; the caller removes it once its strategy has read it).
struct TpConversion {
  std::string dir;                                     // the checkpoint
  nlohmann::json saved;                                // its state.json object
  int saved_world = 1;                                 // its world_size
  std::vector<std::shared_ptr<nn::Module>> models;     // this run's prepared models (local shapes)
  std::vector<const optim::Optimizer*> optimizers;     // the user optimizers, in prepare order
  std::vector<std::map<std::string, TpShard>> shards;  // per model: its tp-sharded parameters
  int rank = 0, size = 1;                              // this rank's tp index and the tp size
  int world_rank = 0;
};
std::string convert_tp_checkpoint(const TpConversion& c);

}  // namespace accel::dist
