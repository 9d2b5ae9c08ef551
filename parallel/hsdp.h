// Hybrid sharded data parallelism (HSDP): what dist::FullyShardedModel (parallel/fsdp.h) and
// dist::ZeroOptimizer (parallel/zero.h) add when given a replicate group besides their shard group.
//
// Note [hsdp]
// On a mesh dp_replicate R x dp_shard S (docs/parallelism.md), a rank shards its state over its
// dp_shard group (S ranks, usually one machine) exactly as plain ZeRO / FSDP does, and the R ranks
// holding the same shard coordinate in different replicas (its dp_replicate group, usually one per
// machine) keep equal copies of that shard:
//  - initial values: the shard group broadcasts from its root as before, then the replicate group
//    broadcasts from its rank 0, so every rank of the world starts from one rank's values (the
//    root of replica 0); buffers alike.
//  - gradients: the shard group reduce-scatters (average over S) as before; then each rank
//    all-reduces its reduced shard across the replicate group (average over R): the shard holds
//    the average over all R x S ranks. Across replicas only one shard's bytes travel per bucket or
//    unit, never the model's (ProcessGroup::bytes_sent counts it; tests/accelerate/test_hsdp.cc
//    checks it). ZeRO-1 all-reduces its whole buckets in the shard group, then across the replicate
//    group: the same average as one all-reduce over all R x S ranks, every rank keeping the full
//    averaged gradient as ZeRO-1 does.
//  - fp16 reductions divide before summing (the range of a sum of R gradients), as the shard
//    reductions do; every other dtype averages (ReduceOp::Avg).
//  - everything else (spans, checkpoints, clipping norms, the optimizer) sees the shard group
//    only: replicas hold equal shards, so a norm over the shard group is the model's norm.
// The replicate all-reduce runs where the shard reduction is waited for (FSDP: as each unit's
// reduce-scatter is drained; ZeRO: after the buckets), blocking: it overlaps nothing yet.
#pragma once

#include "nn/module.h"
#include "comm/process_group.h"

namespace accel::dist::hsdp {

// Whether `replicate` makes this HSDP (a group of more than one rank).
inline bool active(const ProcessGroupPtr& replicate) {
  return replicate != nullptr && replicate->size() > 1;
}
// ValueError naming `op` and both groups unless `replicate` (when set) meets the shard group in
// this rank only, as a mesh's dp_replicate and dp_shard groups do.
void check_groups(const char* op, const ProcessGroup& shard, const ProcessGroupPtr& replicate);
// t := replicate rank 0's t (no-op unless active).
void broadcast_from_first_replica(const ProcessGroupPtr& replicate, const Tensor& t);
void broadcast_buffers(const ProcessGroupPtr& replicate, const nn::Module& module);
// t := the average of t over the replicate group (no-op unless active).
void average_across_replicas(const ProcessGroupPtr& replicate, const Tensor& t);

}  // namespace accel::dist::hsdp
