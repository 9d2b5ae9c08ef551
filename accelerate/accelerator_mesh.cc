// The Accelerator's device mesh (AcceleratorConfig::parallelism, docs/parallelism.md) and its
// process control (barriers, main process first, seeding).
#include <iostream>

#include "accelerate/accelerator.h"
#include "accelerate/config_detail.h"
#include "accelerate/strategy_registry.h"
#include "accelerate/composition.h"
#include "comm/env.h"
#include "parallel/parallel_dims.h"
#include "core/generator.h"
#include "data/process_shard.h"

namespace accel {

namespace config_detail {

dist::DeviceMesh build_mesh(const AcceleratorConfig& c, const dist::DistEnv& env) {
  std::string why;  // Note [mesh sizes] in core/parallelism.h
  const std::optional<MeshSizes> sizes = infer_mesh_sizes(c.parallelism, env.world_size, &why);
  ACCEL_CHECK(sizes.has_value(), ValueError, "accelerator",
              "the parallelism sizes (AcceleratorConfig::parallelism, ACCEL_DP_REPLICATE_SIZE, "
              "ACCEL_DP_SHARD_SIZE, ACCEL_CP_SIZE, ACCEL_TP_SIZE) do not fit ",
              env.world_size, " processes (WORLD_SIZE): ", why);
  dist::DeviceMesh mesh = dist::parallelism_mesh(*sizes, env.rank, env.local_world_size);
  // Note [mesh placement] in comm/device_mesh.h: allowed, said once.
  if (env.rank == 0)
    for (const std::string& w : mesh.placement_warnings())
      std::cerr << "accel: warning: " << w << std::endl;
  return mesh;
}

void check_mesh_agreement(const AcceleratorConfig& c, const dist::ProcessGroupPtr& world) {
  std::vector<dist::AgreedValue> v = dist::mesh_size_values(c.parallelism);
  v.push_back(
      {"strategy (ACCEL_STRATEGY, --strategy)", int64_t(dist::fingerprint(c.strategy)), false});
  v.push_back({"zero_stage (ACCEL_ZERO_STAGE, --zero_stage)", c.zero_stage, true});
  v.push_back({"mixed_precision (ACCEL_MIXED_PRECISION, --mixed_precision)",
               int64_t(c.mixed_precision), false});
  v.push_back({"the tp plan (AcceleratorConfig::tp_plan)",
               int64_t(dist::plan_fingerprint(c.tp_plan)), false});
  v.push_back({"the cp plan (AcceleratorConfig::cp_plan)",
               int64_t(dist::plan_fingerprint(c.cp_plan)), false});
  dist::check_agreement(world, "accelerator", v);
}

void publish_data_shard(const dist::DeviceMesh& mesh, int world_size, const void* owner) {
  if (mesh.size("dp") == world_size) return;
  std::string others;
  for (const auto& d : mesh.dims())
    if (d.name != "dp_replicate" && d.name != "dp_shard" && d.size > 1)
      others += (others.empty() ? "" : ", ") + d.name + " " + std::to_string(d.size);
  data::set_process_data_shard(data::ProcessDataShard{
      mesh.coordinate("dp"), mesh.size("dp"),
      "the Accelerator's mesh has dp size " + std::to_string(mesh.size("dp")) + " of world " +
          std::to_string(world_size) + " (" + others + ")",
      owner});
}

void withdraw_data_shard(const void* owner) { data::clear_process_data_shard(owner); }

// Note [accelerator mesh groups]
// After the world group exists the Accelerator rebuilds its mesh with a GroupFactory, so that
// acc.mesh().group(dim) works for every dimension (and "dp"). The factory is called on every rank
// for every group in the mesh's order (Note [mesh groups] in comm/device_mesh.h), so it may use
// collectives over the world, and must not call any for some groups on some ranks only:
//  - a group of the whole world is the world group itself (no new group: the default flat mesh
//    dp_shard = world costs nothing);
//  - a group of one rank is a local group of one (a Gloo group over a MemoryStore: no peer, no
//    store traffic), made by its member only; every rank skips it alike;
//  - every other group comes from dist::new_group (collective over the world, every rank calls it
//    for every such group, in mesh order: the order new_group requires).
// With one process every group is a group of one. Gloo groups of one are made on the CPU; a CUDA
// run of one process gets them too (they are only used when a group has more than one rank).
dist::DeviceMesh mesh_with_groups(const dist::DeviceMesh& layout,
                                  const dist::ProcessGroupPtr& world) {
  const int n = layout.world_size(), me = layout.rank();
  // By value: the mesh keeps the factory for later flatten() calls.
  dist::GroupFactory factory = [world, n,
                                me](const std::vector<int>& ranks) -> dist::ProcessGroupPtr {
    if (int(ranks.size()) == n && n > 1) return world;
    if (ranks.size() == 1) {
      if (ranks[0] != me) return nullptr;
      dist::ProcessGroupOptions o;
      o.label = (world ? world->group_name() : std::string("world")) + "/self[" +
                std::to_string(me) + "]";
      o.world_ranks = {me};
      return dist::new_gloo_group(std::make_shared<dist::MemoryStore>(), 0, 1, o);
    }
    return dist::new_group(ranks);
  };
  MeshSizes sizes;  // the layout's, dimension by dimension of the table
  for (const ParallelDim& d : kParallelDims) sizes.*d.size = layout.size(d.name);
  return dist::parallelism_mesh(sizes, me, layout.local_world_size(), factory);
}

std::unique_ptr<dist::Strategy> compose_strategy(const AcceleratorConfig& c,
                                                 const dist::DeviceMesh& mesh,
                                                 const dist::ProcessGroupPtr& world,
                                                 dist::StrategyContext ctx,
                                                 const dist::StrategySpec& spec) {
  // The engine's world: the ranks holding the same pieces of every model (the world itself when
  // that is every rank: no model step cuts).
  const std::string_view dp = dist::ParallelPlan::data_parallel_dim();
  if (mesh.size(dp) != mesh.world_size()) {
    ctx.group = mesh.group(dp);
    ctx.rank = ctx.group->rank();
    ctx.world_size = ctx.group->size();
  }
  dist::ParallelOptions options;
  options.tp_plan = c.tp_plan;
  options.cp_plan = c.cp_plan;
  options.pipeline = c.pipeline;
  const int rank = ctx.rank, size = ctx.world_size;
  return dist::compose(mesh, std::move(options), dist::make_strategy(spec, std::move(ctx)), world,
                       rank, size);
}

}  // namespace config_detail

// Note [mesh support]
// The strategies take their groups from the mesh (StrategyContext::dp, dp_shard, dp_replicate):
//   - ddp (and the program's own replicating strategies, over ctx.group = the world) replicates
//     over "dp" = dp_replicate x dp_shard: every rank when tp is 1, whatever the split;
//   - zero1 / zero2 / fsdp shard over dp_shard and, when dp_replicate > 1, replicate each shard
//     across dp_replicate (HSDP, Note [hsdp] in parallel/hsdp.h): dp_shard alone (the default)
//     is plain ZeRO over the world, dp_replicate alone is ZeRO over groups of one replicated
//     across the world (every rank holds everything: DDP's memory, ZeRO's code path).
// Gradient-norm clipping reduces over the shard group (StepGrads::shard_group): replicas hold
// equal parts. Prepared data loaders shard over "dp" (num_replicas = mesh.size("dp"), rank =
// mesh.coordinate("dp")), so the tp ranks of one dp index will read the same batches.
// gather() / reduce() / loss averaging and every facade collective stay over the world, as in
// Accelerate. Checkpoints of an HSDP run are written once per shard (Note [hsdp checkpoints] in
// accelerate/strategy_fsdp.cc).
// The strategy is always the composition (Note [composed strategy] in accelerate/composition.cc):
// the model steps of the mesh (tp splits each model over its tp group with
// AcceleratorConfig::tp_plan), then the engine over the dp groups as above, its world being this
// rank's dp group (the ranks of one tp index).
// ---------------------------------------------------------------------------------------------
// process control

void Accelerator::wait_for_everyone() {
  if (world_size_ > 1) group_->barrier();
}

void Accelerator::main_process_first(const std::function<void()>& fn) {
  if (is_main_process()) fn();
  wait_for_everyone();
  if (!is_main_process()) fn();
}

void Accelerator::local_main_process_first(const std::function<void()>& fn) {
  if (is_local_main_process()) fn();
  wait_for_everyone();
  if (!is_local_main_process()) fn();
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  // device_specific: the data-parallel index, not the rank, so that the ranks of a tp group (one
  // dp index) draw alike (Note [dropout under tensor parallelism] in parallel/tp_random.cc).
  const uint64_t dp_index = uint64_t(mesh_ ? mesh_->coordinate("dp") : rank_);
  manual_seed(seed + (device_specific ? dp_index : 0));
}

}  // namespace accel
