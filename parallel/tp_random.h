// Internal to parallel/: the activation layouts the tensor-parallel styles record for random ops
// (Note [dropout under tensor parallelism] in parallel/tp_random.cc).
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "core/sharded_random.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace accel::dist::detail {

// The region after a colwise output `out` that stays sharded: its last dim (`chunks` packed
// blocks), heads split. Whole over a group of one rank.
// uneven: the ranks' pieces differ in size (Note [uneven tp shards]): random ops there raise.
ShardedRegion feature_region(const ProcessGroupPtr& g, const Tensor& out, int64_t chunks,
                             bool uneven, const std::shared_ptr<const std::string>& source);
// The region after a reduce-scatter along `dim` of the sequence: `out` is this rank's chunk.
ShardedRegion sequence_region(const ProcessGroupPtr& g, const Tensor& out, int64_t dim,
                              const std::shared_ptr<const std::string>& source);

// Forward hooks on the root of a parallelized model: every call starts and ends with whole
// activations (its input is replicated over tp), and the first call that draws random numbers
// checks that the tp ranks' default generators agree (ValueError on every rank otherwise).
void install_region_reset(nn::Module& root, const ProcessGroupPtr& g);

}  // namespace accel::dist::detail
