// The parallelism a run asks for, in Accelerate's terms (its ParallelismConfig: dp_replicate_size,
// dp_shard_size, cp_size, tp_size; and pp_size), and how the sizes left unset are inferred from
// the world size.
// accel-run checks a launch with it before it starts a worker (launcher/plan.cc), the Accelerator
// builds its device mesh from it (AcceleratorConfig::parallelism, comm/device_mesh.h).
//
// Std-only: accel-run includes it without linking the tensor library (docs/layers.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/env_contract.h"

namespace accel {

struct ParallelismConfig {
  // Replicas of the model: HSDP shards inside a replica and all-reduces across replicas.
  std::optional<int> dp_replicate_size;
  // Ranks one ZeRO shard group spans. Unset: the rest of the world (Note [mesh sizes]).
  std::optional<int> dp_shard_size;
  // Ranks that split each layer (tensor parallelism).
  std::optional<int> tp_size;
  // Ranks that split each sequence (context parallelism: ring attention over zig-zag chunks;
  // parallel/context_parallel.h). Last, so that {2, 2, 2} still reads dp_replicate, dp_shard, tp.
  std::optional<int> cp_size;
  // Pipeline stages: ranks that each hold a run of the model's layers (parallel/pipeline.h). The
  // outermost mesh dimension; last here for the same reason as cp_size.
  std::optional<int> pp_size;

  bool any_set() const {
    return dp_replicate_size || dp_shard_size || cp_size || tp_size || pp_size;
  }
  bool operator==(const ParallelismConfig&) const = default;
};

// Every size known: the shape of the device mesh, outermost dimension first.
struct MeshSizes {
  // In the order the fields were added ({2, 2, 2} is dp_replicate, dp_shard, tp); the mesh's
  // order is kParallelDims': pp, dp_replicate, dp_shard, cp, tp.
  int dp_replicate = 1, dp_shard = 1, tp = 1, cp = 1, pp = 1;

  int64_t product() const;  // of the kParallelDims sizes
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
//   - otherwise pp, dp_replicate, cp and tp default to 1 (as in Accelerate), and dp_shard, when
//     unset, fills the rest of the world: world / (pp * dp_replicate * cp * tp), a whole number
//     (torchtitan's dp_shard = -1).
// A size below 1, an unfillable rest, or given sizes whose product is not the world size are
// refused with every size and the world size named. accel-run refuses them before it starts a
// worker (ConfigError), the Accelerator's constructor with a ValueError.

// Note [parallel dimensions]
// One row per mesh dimension, outermost first (Note [mesh layout] in comm/device_mesh.h): its name,
// the ParallelismConfig field that sets it, the MeshSizes field that holds it, the environment
// variable of its setting (core/settings.h names the flag and config key), and whether an unset
// size fills the rest of the world. Size inference, messages, the mesh's dimensions and the
// agreement check across ranks (parallel/parallel_dims.h) all loop over this table, so a new
// dimension is a row (and its setting's row), not an edit of each.
struct ParallelDim {
  std::string_view name;
  std::optional<int> ParallelismConfig::*given;
  int MeshSizes::*size;
  std::string_view env;
  bool fills_rest;
};
inline constexpr ParallelDim kParallelDims[] = {
    {"pp", &ParallelismConfig::pp_size, &MeshSizes::pp, env::kPpSize, false},
    {"dp_replicate", &ParallelismConfig::dp_replicate_size, &MeshSizes::dp_replicate,
     env::kDpReplicateSize, false},
    {"dp_shard", &ParallelismConfig::dp_shard_size, &MeshSizes::dp_shard, env::kDpShardSize, true},
    {"cp", &ParallelismConfig::cp_size, &MeshSizes::cp, env::kCpSize, false},
    {"tp", &ParallelismConfig::tp_size, &MeshSizes::tp, env::kTpSize, false},
};

inline int64_t MeshSizes::product() const {
  int64_t n = 1;
  for (const ParallelDim& d : kParallelDims) n *= this->*d.size;
  return n;
}

// "dp_replicate_size 2, dp_shard_size unset, tp_size 2"
inline std::string describe_sizes(const ParallelismConfig& p) {
  std::string s;
  for (const ParallelDim& d : kParallelDims) {
    const std::optional<int>& v = p.*d.given;
    s += (s.empty() ? "" : ", ") + std::string(d.name) + "_size " +
         (v ? std::to_string(*v) : std::string("unset"));
  }
  return s;
}

// The mesh of Note [mesh sizes] for `world` processes, or nullopt with `why` (when given) saying
// what is wrong, naming every size and the world size.
inline std::optional<MeshSizes> infer_mesh_sizes(const ParallelismConfig& p, int world,
                                                 std::string* why) {
  auto fail = [&](const std::string& what) -> std::optional<MeshSizes> {
    if (why) *why = what;
    return std::nullopt;
  };
  // "dp_replicate_size x dp_shard_size x tp_size" over the rows `pick` selects.
  auto product_names = [](auto pick) {
    std::string s;
    for (const ParallelDim& d : kParallelDims)
      if (pick(d)) s += (s.empty() ? "" : " x ") + std::string(d.name) + "_size";
    return s;
  };
  const auto all = [](const ParallelDim&) { return true; };
  const auto fixed_rows = [](const ParallelDim& d) { return !d.fills_rest; };
  const std::string sizes = describe_sizes(p);
  bool all_ones = true;
  for (const ParallelDim& d : kParallelDims) {
    const std::optional<int>& v = p.*d.given;
    if (v && *v < 1) return fail("every parallelism size must be >= 1, got " + sizes);
    all_ones = all_ones && v.value_or(1) == 1;
  }
  if (world < 1) return fail("the world size must be >= 1, got " + std::to_string(world));
  MeshSizes m;
  const ParallelDim* rest = nullptr;  // the row that fills the rest of the world
  for (const ParallelDim& d : kParallelDims)
    if (d.fills_rest) rest = &d;
  if (all_ones) {
    m.*rest->size = world;
    return m;
  }
  // Each size is at most the world, so the products below cannot overflow.
  for (const ParallelDim& d : kParallelDims) {
    const std::optional<int>& v = p.*d.given;
    if (v && *v > world)
      return fail(sizes + ": " + product_names(all) + " exceeds the world size " +
                  std::to_string(world));
  }
  int64_t fixed = 1;
  for (const ParallelDim& d : kParallelDims) {
    if (d.fills_rest) continue;
    m.*d.size = (p.*d.given).value_or(1);
    fixed *= m.*d.size;
  }
  if (!(p.*rest->given)) {
    if (world % fixed != 0)
      return fail(sizes + ": " + std::string(rest->name) +
                  "_size fills the rest of the world size " + std::to_string(world) + ", but " +
                  product_names(fixed_rows) + " = " + std::to_string(fixed) +
                  " does not divide it");
    m.*rest->size = int(world / fixed);
    return m;
  }
  m.*rest->size = *(p.*rest->given);
  if (m.product() != world)
    return fail(sizes + ": " + product_names(all) + " = " + std::to_string(m.product()) +
                " is not the world size " + std::to_string(world) + " (unset sizes other than " +
                std::string(rest->name) + "_size count as 1)");
  return m;
}

// Note [built-in strategies]
// The strategies libaccel registers (accelerate/strategy_*.cc) and the ZeRO stage each one is:
// zero_stage names one of them when no strategy is named, and a named strategy must not
// contradict a zero_stage given with it. A program's own strategies claim no stage (the four
// stages are taken), so they run at stage 0. Here, std-only, so that accel-run refuses a
// contradiction before any worker starts with the library's words (tests/accelerate checks the
// registry against this table).
struct BuiltinStrategy {
  std::string_view name;
  int zero_stage;
};
inline constexpr BuiltinStrategy kBuiltinStrategies[] = {
    {"ddp", 0}, {"zero1", 1}, {"zero2", 2}, {"fsdp", 3}};

inline const BuiltinStrategy* find_builtin_strategy(std::string_view name) {
  for (const BuiltinStrategy& s : kBuiltinStrategies)
    if (s.name == name) return &s;
  return nullptr;
}
inline const BuiltinStrategy* builtin_strategy_for_stage(int zero_stage) {
  for (const BuiltinStrategy& s : kBuiltinStrategies)
    if (s.zero_stage == zero_stage) return &s;
  return nullptr;
}

// The stage strategy `name` runs at: its built-in stage, 0 for any other (a program's own).
inline int strategy_zero_stage(std::string_view name) {
  const BuiltinStrategy* b = find_builtin_strategy(name);
  return b ? b->zero_stage : 0;
}

// Why strategy `name` and `zero_stage` cannot be given together, or nullopt when they agree
// (zero_stage 0 means "not chosen" next to a name).
inline std::optional<std::string> strategy_stage_conflict(std::string_view name, int zero_stage) {
  if (zero_stage == 0 || zero_stage == strategy_zero_stage(name)) return std::nullopt;
  return "strategy '" + std::string(name) + "' and zero_stage " + std::to_string(zero_stage) +
         " contradict each other: set one of them";
}

}  // namespace accel
