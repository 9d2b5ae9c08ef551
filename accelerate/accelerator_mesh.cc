// The Accelerator's device mesh (AcceleratorConfig::parallelism, docs/parallelism.md) and its
// process control (barriers, main process first, seeding).
#include <iostream>

#include "accelerate/accelerator.h"
#include "accelerate/config_detail.h"
#include "comm/env.h"
#include "core/generator.h"

namespace accel {

namespace config_detail {

dist::DeviceMesh build_mesh(const AcceleratorConfig& c, const dist::DistEnv& env) {
  std::string why;  // Note [mesh sizes] in core/parallelism.h
  const std::optional<MeshSizes> sizes = infer_mesh_sizes(c.parallelism, env.world_size, &why);
  ACCEL_CHECK(sizes.has_value(), ValueError, "accelerator",
              "the parallelism sizes (AcceleratorConfig::parallelism, ACCEL_DP_REPLICATE_SIZE, "
              "ACCEL_DP_SHARD_SIZE, ACCEL_TP_SIZE) do not fit ",
              env.world_size, " processes (WORLD_SIZE): ", why);
  dist::DeviceMesh mesh = dist::parallelism_mesh(*sizes, env.rank, env.local_world_size);
  // Note [mesh placement] in comm/device_mesh.h: allowed, said once.
  if (env.rank == 0)
    for (const std::string& w : mesh.placement_warnings())
      std::cerr << "accel: warning: " << w << std::endl;
  return mesh;
}

}  // namespace config_detail

// Note [mesh support]
// The mesh is built and checked for every run, but the strategies still run over the whole world
// as one data-parallel dimension: DDP replicates over it, ZeRO 1-3 shard over it. So prepare()
// (of a model, an optimizer or a data loader) accepts a mesh only where that is what it asks for:
//   - dp_shard alone (dp_replicate 1, tp 1; the default): every strategy, over the world;
//   - dp_replicate alone (dp_shard 1, tp 1; Accelerate's pure data parallelism): DDP and the
//     program's own strategies, but not ZeRO, which would shard what the mesh replicates;
// and refuses with a ValueError what is not built yet: dp_replicate > 1 together with
// dp_shard > 1 (HSDP: shard inside a replica, all-reduce across replicas) and tp > 1 (tensor
// parallelism). The constructor does not refuse them, so a program can still read acc.mesh().
void Accelerator::check_mesh_supported(const char* what) const {
  const dist::DeviceMesh& m = *mesh_;
  const int replicate = m.size("dp_replicate"), shard = m.size("dp_shard"), tp = m.size("tp");
  ACCEL_CHECK(tp == 1, ValueError, "prepare", "cannot prepare ", what, " on the mesh ",
              m.describe(), ": tensor parallelism (tp_size ", tp,
              ") is not implemented yet; every strategy runs over the whole world as one "
              "data-parallel dimension. Leave tp_size unset (or 1)");
  ACCEL_CHECK(replicate == 1 || shard == 1, ValueError, "prepare", "cannot prepare ", what,
              " on the mesh ", m.describe(), ": hybrid sharding (dp_replicate_size ", replicate,
              " x dp_shard_size ", shard,
              ": ZeRO inside a replica, all-reduce across replicas) is not implemented yet. Give "
              "dp_shard_size ",
              replicate * shard, " alone (or no sizes) to run the strategy over the whole world");
  ACCEL_CHECK(replicate == 1 || config_.zero_stage == 0, ValueError, "prepare", "cannot prepare ",
              what, " on the mesh ", m.describe(), ": dp_replicate_size ", replicate,
              " alone replicates the model on every rank, but strategy '", config_.strategy,
              "' (zero_stage ", config_.zero_stage,
              ") shards it over the world. Give dp_shard_size ", replicate,
              " (or no sizes) for ZeRO, or use the ddp strategy");
}

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
  manual_seed(seed + (device_specific ? uint64_t(rank_) : 0));
}

}  // namespace accel
