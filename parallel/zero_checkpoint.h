// ZeRO optimizer state in checkpoints: the per-rank shard files and their re-sharding to another
// world size, into one process, and from a plain (unsharded) optimizer. Used by the strategies
// (accelerate/strategy_base.h); the checkpoint protocol itself is the facade's (Note [checkpoint
// loading] in accelerate/accelerator.cc).
//
// Note [zero checkpoints]
// Under ZeRO each rank writes its shard optimizer's state keyed by bucket
// (zero_optimizer_rank<r>: per bucket b "state.<b>.step" and "state.<b>.<slot>", the slot being
// rank r's slice of the bucket's flat buffer, Note [zero layout] in parallel/zero.cc; see
// ZeroOptimizer::shard_state_dict) and, inside an accumulation window, its accumulated gradient
// shards (zero_grads_rank<r>: "bucket.<b>"); state.json records, under "zero", each bucket's
// (used, numel) per optimizer. Which parameter sits where in a bucket depends only on the
// parameters, their param groups (a bucket never mixes groups) and bucket_cap_bytes, not on the
// world size (dist::assign_buckets), so another world size only changes the padding and the
// slice boundaries: a rank of the new run reads, from the old ranks' files, just the slices that
// overlap its new slice. A single process (or DDP) cuts the flat buffers into the per-parameter
// state of the plain optimizer, and a plain checkpoint is sharded the same way into a ZeRO run.
// Every number of the layout is checked before it is used (Note [checkpoint record validation] in
// parallel/checkpoint_records.h), every slice read is checked against it, and only the byte ranges
// a rank needs are read (Note [reading parts of a safetensors file] in io/safetensors.h):
// the state is built in the dtype and on the device of the parameters it belongs to.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/module.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "parallel/checkpoint_records.h"
#include "parallel/zero.h"

namespace accel::dist::zero_ckpt {

// zero_optimizer[_<i>]_rank<r>.safetensors, zero_grads[_<i>]_rank<r>.safetensors.
std::string shard_file(size_t optimizer, int rank);
std::string accum_file(size_t optimizer, int rank);

// What state.json records for one ZeRO optimizer: {"stage", "buckets": [[used, numel], ...]}.
nlohmann::json layout(const ZeroOptimizer& zero);
// The checked "zero" entry of a state.json object (empty when absent; per optimizer the layout
// or nullopt). IoError naming `file` and the field otherwise.
using Layouts = std::vector<std::optional<ckpt_records::ZeroLayoutRecord>>;
Layouts read_layouts(const nlohmann::json& state, size_t num_optimizers, int saved_world,
                     const std::string& file);

// The number of ranks whose shard files a ZeRO checkpoint holds: state.json's "zero_world" (an
// HSDP run writes its shards once, from replica 0: its shard group's size; Note [hsdp
// checkpoints] in accelerate/strategy_fsdp.cc), else `saved_world`. IoError naming `file` when
// "zero_world" does not divide the world size. Pass it where the functions below take
// `saved_world`.
int shard_world(const nlohmann::json& state, int saved_world, const std::string& file);

// The "param_groups.*" entries of an optimizer state dict, and of an optimizer file (only those
// tensors are read).
io::TensorDict param_groups_of(const io::TensorDict& d);
io::TensorDict param_groups_of(const io::SafetensorsFile& f);

// Shard state (keyed by bucket, for ZeroOptimizer::load_shard_state_dict) of `zero` on `rank`
// from checkpoint `dir`: from the shard files of `saved_world` ranks when `saved_layout` is set,
// else from the plain optimizer file `plain`. ValueError when the layouts do not match; IoError
// naming a missing, short or malformed file.
io::TensorDict read_shard_state(const std::string& dir, size_t optimizer,
                                const ckpt_records::ZeroLayoutRecord* saved_layout, int saved_world,
                                const io::SafetensorsFile& plain, const ZeroOptimizer& zero,
                                int rank);

// The same from a plain per-parameter optimizer state in memory (a ZeRO-3 checkpoint read whole).
io::TensorDict read_shard_state(const io::TensorDict& plain, const ZeroOptimizer& zero, int rank);

// A plain optimizer's state for `user` (its param groups laid out in buckets of `cap_bytes`)
// cut from the shard files of a ZeRO checkpoint, with the param groups `param_groups`. With
// `ranges` (one [lo, hi) per parameter of `user`), each slot holds only those elements of the
// flattened parameter, as a 1-D tensor (a ZeRO-3 rank's spans); else the whole parameter.
io::TensorDict read_unsharded_state(
    const std::string& dir, size_t optimizer, const ckpt_records::ZeroLayoutRecord& saved_layout,
    int saved_world, const optim::Optimizer& user, const io::TensorDict& param_groups,
    size_t cap_bytes, const std::vector<std::pair<int64_t, int64_t>>* ranges = nullptr);

// Accumulated gradient shards of a checkpoint saved inside a window (same world size; empty
// when the rank saved none).
std::vector<Tensor> read_accum(const std::string& dir, size_t optimizer, int rank,
                               const ZeroOptimizer& zero);
void write_accum(const std::string& dir, size_t optimizer, int rank,
                 const std::vector<Tensor>& accum);

}  // namespace accel::dist::zero_ckpt
