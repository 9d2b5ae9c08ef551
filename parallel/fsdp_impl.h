// FullyShardedModel's unit record, shared by its source files (parallel/fsdp.cc: units, hooks,
// backward; parallel/fsdp_step.cc: between steps, full values). Not installed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/container.h"
#include "comm/process_group.h"
#include "parallel/fsdp.h"

namespace accel::dist {

struct FullyShardedModel::Unit {
  std::string name, type;
  bool root = false;
  nn::Module* module = nullptr;   // the unit's module: its call wrapper runs the unit
  nn::Sequential* seq = nullptr;  // the container entry direct forward() calls go through
  nn::ModuleList* list = nullptr;
  size_t entry = 0;
  std::vector<size_t> params;   // indices into params_, model order
  std::vector<int64_t> offset;  // element offset of each in the flat buffers
  int64_t used = 0, numel = 0, shard_numel = 0;
  DType master = kFloat32, compute = kFloat32;
  Device device = kCPU;
  Tensor full;        // numel elements, compute dtype; storage released while resharded
  Tensor shard;       // shard_numel, master dtype: this rank's slice, what the optimizer updates
  Tensor grad_shard;  // shard_numel, master dtype
  bool grad_valid = false;
  bool gathered = false;  // full holds current values (or a gather into it is in flight)
  WorkPtr gather_work;
  Tensor gather_src;
  size_t ready = 0;              // parameters whose gradient was accumulated in this backward
  std::vector<uint8_t> arrived;  // per parameter: counted in `ready` (a tied one may come twice)
  bool reduced = false;          // its reduce-scatter was issued in this backward
  WorkPtr reduce_work;
  Tensor staging, reduce_out;
  bool reduce_into_shard = false;  // reduce_out is grad_shard itself (nothing to add)
  size_t fwd_pos = 0;              // position in this iteration's forward order
  // Called twice in this forward under activation checkpointing: each call's recompute
  // accumulates its own gradient, so the reduce waits for the end of backward.
  bool reduce_at_end = false;
};

}  // namespace accel::dist
