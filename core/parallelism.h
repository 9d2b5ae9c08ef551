// The parallelism a run asks for, in Accelerate's terms (its ParallelismConfig: dp_replicate_size,
// dp_shard_size, tp_size), and how the sizes left unset are inferred from the world size.
// accel-run checks a launch with it before it starts a worker (launcher/plan.cc), the Accelerator
// builds its device mesh from it (AcceleratorConfig::parallelism, comm/device_mesh.h).
//
// Std-only: accel-run includes it without linking the tensor library (docs/layers.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace accel {

struct ParallelismConfig {
  // Replicas of the model: HSDP shards inside a replica and all-reduces across replicas.
  std::optional<int> dp_replicate_size;
  // Ranks one ZeRO shard group spans. Unset: the rest of the world (Note [mesh sizes]).
  std::optional<int> dp_shard_size;
  // Ranks that split each layer (tensor parallelism).
  std::optional<int> tp_size;

  bool any_set() const { return dp_replicate_size || dp_shard_size || tp_size; }
  bool operator==(const ParallelismConfig&) const = default;
};

// Every size known: the shape of the device mesh, outermost dimension first.
struct MeshSizes {
  int dp_replicate = 1, dp_shard = 1, tp = 1;

  int64_t product() const { return int64_t(dp_replicate) * dp_shard * tp; }
  bool operator==(const MeshSizes&) const = default;
};

// Note [mesh sizes]
// The sizes a user gives must multiply to the world size; those left unset are inferred:
//   - none given, or every given size 1 (what Accelerate writes into every config it makes):
//     no mesh was asked for, the whole world is data parallel: dp_shard = world. This is the flat
//     world every strategy (DDP, ZeRO 1-3) runs over today. Accelerate puts such a world into
//     dp_replicate, since its default strategy, DDP, replicates; accel calls it dp_shard because
//     its ZeRO strategies shard over it, and DDP over a world of one dimension is the same
//     whatever the dimension's name.
//   - otherwise dp_replicate and tp default to 1 (as in Accelerate), and dp_shard, when unset,
//     fills the rest of the world: world / (dp_replicate * tp), which must be a whole number
//     (torchtitan's dp_shard = -1).
// A size below 1, an unfillable rest, or given sizes whose product is not the world size are
// refused with every size and the world size named. accel-run refuses them before it starts a
// worker (ConfigError), the Accelerator's constructor with a ValueError.

// "dp_replicate_size 2, dp_shard_size unset, tp_size 2"
inline std::string describe_sizes(const ParallelismConfig& p) {
  auto one = [](const char* name, const std::optional<int>& v) {
    return std::string(name) + " " + (v ? std::to_string(*v) : std::string("unset"));
  };
  return one("dp_replicate_size", p.dp_replicate_size) + ", " +
         one("dp_shard_size", p.dp_shard_size) + ", " + one("tp_size", p.tp_size);
}

// The mesh of Note [mesh sizes] for `world` processes, or nullopt with `why` (when given) saying
// what is wrong, naming every size and the world size.
inline std::optional<MeshSizes> infer_mesh_sizes(const ParallelismConfig& p, int world,
                                                 std::string* why) {
  auto fail = [&](const std::string& what) -> std::optional<MeshSizes> {
    if (why) *why = what;
    return std::nullopt;
  };
  const std::string sizes = describe_sizes(p);
  for (const auto* v : {&p.dp_replicate_size, &p.dp_shard_size, &p.tp_size})
    if (*v && **v < 1) return fail("every parallelism size must be >= 1, got " + sizes);
  if (world < 1) return fail("the world size must be >= 1, got " + std::to_string(world));
  MeshSizes m;
  const bool all_ones = p.dp_replicate_size.value_or(1) == 1 && p.dp_shard_size.value_or(1) == 1 &&
                        p.tp_size.value_or(1) == 1;
  if (all_ones) {
    m.dp_shard = world;
    return m;
  }
  // Each size is at most the world, so the products below cannot overflow.
  for (const auto* v : {&p.dp_replicate_size, &p.dp_shard_size, &p.tp_size})
    if (*v && **v > world)
      return fail(sizes + ": dp_replicate_size x dp_shard_size x tp_size exceeds the world size " +
                  std::to_string(world));
  m.dp_replicate = p.dp_replicate_size.value_or(1);
  m.tp = p.tp_size.value_or(1);
  const int64_t fixed = int64_t(m.dp_replicate) * m.tp;
  if (!p.dp_shard_size) {
    if (world % fixed != 0)
      return fail(
          sizes + ": dp_shard_size fills the rest of the world size " + std::to_string(world) +
          ", but dp_replicate_size x tp_size = " + std::to_string(fixed) + " does not divide it");
    m.dp_shard = int(world / fixed);
    return m;
  }
  m.dp_shard = *p.dp_shard_size;
  if (m.product() != world)
    return fail(sizes + ": dp_replicate_size x dp_shard_size x tp_size = " +
                std::to_string(m.product()) + " is not the world size " + std::to_string(world) +
                " (unset sizes other than dp_shard_size count as 1)");
  return m;
}

}  // namespace accel
