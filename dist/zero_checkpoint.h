// ZeRO optimizer state in checkpoints: the per-rank shard files and their re-sharding to another
// world size, into one process, and from a plain (unsharded) optimizer. Used by the strategies
// (dist/strategy_base.h); the checkpoint protocol itself is the facade's (Note [checkpoint
// loading] in dist/accelerator.cc).
//
// Note [zero checkpoints]
// Under ZeRO each rank writes its shard optimizer's state keyed by bucket
// (zero_optimizer_rank<r>: per bucket b "state.<b>.step" and "state.<b>.<slot>", the slot being
// rank r's slice of the bucket's flat buffer, Note [zero layout] in dist/zero.cc; see
// ZeroOptimizer::shard_state_dict) and, inside an accumulation window, its accumulated gradient
// shards (zero_grads_rank<r>: "bucket.<b>"); state.json records, under "zero", each bucket's
// (used, numel) per optimizer. Which parameter sits where in a bucket depends only on the
// parameters, their param groups (a bucket never mixes groups) and bucket_cap_bytes, not on the
// world size (dist::assign_buckets), so another world size only changes the padding and the
// slice boundaries: a rank of the new run reads, from the old ranks' files, just the slices that
// overlap its new slice. A single process (or DDP) cuts the flat buffers into the per-parameter
// state of the plain optimizer, and a plain checkpoint is sharded the same way into a ZeRO run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/nn/module.h"
#include "autograd/optim/optimizer.h"
#include "dist/zero.h"

namespace accel::dist::zero_ckpt {

// zero_optimizer[_<i>]_rank<r>.safetensors, zero_grads[_<i>]_rank<r>.safetensors.
std::string shard_file(size_t optimizer, int rank);
std::string accum_file(size_t optimizer, int rank);

// What state.json records for one ZeRO optimizer: {"stage", "buckets": [[used, numel], ...]}.
nlohmann::json layout(const ZeroOptimizer& zero);
// Checks the "zero" entry of a state.json object (absent is fine): an array with one entry per
// optimizer, each null or a layout. IoError naming `file` otherwise.
void check_record(const nlohmann::json& state, size_t num_optimizers, const std::string& file);
// The layout of optimizer i in a checked state.json, or null.
const nlohmann::json* layout_of(const nlohmann::json& state, size_t optimizer);

// The "param_groups.*" entries of an optimizer state dict.
nn::TensorDict param_groups_of(const nn::TensorDict& d);

// Shard state (keyed by bucket, for ZeroOptimizer::load_shard_state_dict) of `zero` on `rank`
// from checkpoint `dir`: from the shard files of `saved_world` ranks when `saved_layout` is set,
// else from the plain optimizer state `plain` (the optimizer file). ValueError when the layouts
// do not match; IoError naming a missing or short file.
nn::TensorDict read_shard_state(const std::string& dir, size_t optimizer,
                                const nlohmann::json* saved_layout, int saved_world,
                                const nn::TensorDict& plain, const ZeroOptimizer& zero, int rank);

// A plain optimizer's state for `user` (its param groups laid out in buckets of `cap_bytes`)
// cut from the shard files of a ZeRO checkpoint; `saved` is the optimizer file (its param
// groups are kept).
nn::TensorDict read_unsharded_state(const std::string& dir, size_t optimizer,
                                    const nlohmann::json& saved_layout, int saved_world,
                                    const optim::Optimizer& user, const nn::TensorDict& saved,
                                    size_t cap_bytes);

// Accumulated gradient shards of a checkpoint saved inside a window (same world size; empty
// when the rank saved none).
std::vector<Tensor> read_accum(const std::string& dir, size_t optimizer, int rank,
                               const ZeroOptimizer& zero);
void write_accum(const std::string& dir, size_t optimizer, int rank,
                 const std::vector<Tensor>& accum);

}  // namespace accel::dist::zero_ckpt
