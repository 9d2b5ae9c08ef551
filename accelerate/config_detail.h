// What accelerate/accelerator_config.cc gives the Accelerator's constructor. Internal to
// accelerate/accelerator*.cc.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "accelerate/strategy.h"
#include "accelerate/strategy_registry.h"
#include "comm/device_mesh.h"
#include "comm/env.h"
#include "core/settings.h"

namespace accel {

struct AcceleratorConfig;

namespace config_detail {

// The layout of c.parallelism over the world of `env` (Note [mesh sizes] in core/parallelism.h);
// ValueError naming every size and the world size when they do not fit. Prints the mesh's
// placement warnings on rank 0 (accelerate/accelerator_mesh.cc).
dist::DeviceMesh build_mesh(const AcceleratorConfig& c, const dist::DistEnv& env);
// Note [mesh agreement] in parallel/parallel_dims.h: every rank was started with the same mesh
// sizes, strategy, ZeRO stage, mixed precision and tp plan (DistError on every rank naming what
// differs otherwise). Collective over `world` (null with one process).
void check_mesh_agreement(const AcceleratorConfig& c, const dist::ProcessGroupPtr& world);
// Note [process data shard] in data/process_shard.h: when the mesh's dp is not the world, records
// this process's dp shard (owned by `owner`) for loaders built from RANK / WORLD_SIZE to check.
void publish_data_shard(const dist::DeviceMesh& mesh, int world_size, const void* owner);
void withdraw_data_shard(const void* owner);
// The same mesh holding its process groups (Note [accelerator mesh groups] in
// accelerate/accelerator_mesh.cc): collective over `world` (null with one process).
dist::DeviceMesh mesh_with_groups(const dist::DeviceMesh& layout,
                                  const dist::ProcessGroupPtr& world);

// The Accelerator's strategy (Note [composed strategy] in accelerate/composition.cc): the engine
// `spec` names, built from `ctx` over the mesh's data-parallel group, as the last slot of the
// ParallelPlan of `mesh` with c's step options (the tp plan).
std::unique_ptr<dist::Strategy> compose_strategy(const AcceleratorConfig& c,
                                                 const dist::DeviceMesh& mesh,
                                                 const dist::ProcessGroupPtr& world,
                                                 dist::StrategyContext ctx,
                                                 const dist::StrategySpec& spec);

// Sets zero_stage from a built-in strategy's registration and, with `fill_name`, an empty
// AcceleratorConfig::strategy from zero_stage; ValueError for an unregistered name or a
// zero_stage that contradicts it.
void resolve_strategy(AcceleratorConfig& c, bool fill_name);
// ValueError for a field out of range or one the facade does not read.
void check_config(const AcceleratorConfig& c);
// The options `spec` runs with: what its registration builds from c's fields (Note [typed
// strategy options] in accelerate/strategies/options.h), else c.strategy_options.
std::shared_ptr<const dist::StrategyOptions> strategy_options(const AcceleratorConfig& c,
                                                              const dist::StrategySpec& spec);

// The binding of one row of core/settings.h (accelerate/config_settings.cc): `field` is the row's
// `field` (tests/launcher/test_settings.cc checks they agree, one binding per row).
// In the table's namespace (Note [the settings probe row] in core/settings.h).
inline namespace ACCEL_SETTINGS_ABI {
struct SettingBinding {
  std::string_view env;
  std::string_view field;
  void (*set)(AcceleratorConfig&, const settings::Value&);
};
std::span<const SettingBinding> setting_bindings();
}  // namespace ACCEL_SETTINGS_ABI

}  // namespace config_detail
}  // namespace accel
