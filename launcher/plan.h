// From config file + flags + outer launcher (SLURM/OpenMPI) to the set of workers this accel-run
// starts and the environment each of them sees (the env contract in docs/launcher.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/cluster.h"
#include "launcher/config.h"
#include "core/settings.h"

namespace accel::launcher {

// Command-line overrides; unset means "take it from the config / cluster".
struct LaunchFlags {
  std::optional<int> num_processes, num_machines, machine_rank, main_process_port, max_restarts,
      num_cpu_threads_per_process;
  std::optional<std::string> main_process_ip, gpu_ids;
  std::optional<std::string> rendezvous_token;  // --rendezvous_token
  std::optional<double> monitor_interval;
  // The training settings given as flags (the rows of core/settings.h: --mixed_precision, --cpu,
  // --zero_stage, --fsdp_*, --tp_size, ...) by config key, in the row's canonical spelling:
  // set_setting_flag parses each once; resolve_plan applies them over the config file's.
  settings::Values training;
  bool ignore_cluster_env = false;
};

struct LaunchPlan {
  LaunchConfig config;           // config file with cluster values and flags applied
  std::string distributed_type;  // effective: NO | MULTI_CPU | MULTI_GPU
  bool use_cpu = false;
  int world_size = 1;
  int num_machines = 1;
  int machine_rank = 0;
  int local_world_size = 1;   // workers per machine (LOCAL_WORLD_SIZE)
  int num_local_workers = 1;  // workers this accel-run starts (1 in the per-task cluster mode)
  int first_rank = 0;
  int first_local_rank = 0;
  std::string master_addr;
  int master_port = 0;           // 0 while port_auto and not yet picked
  bool port_auto = false;        // single machine, no port given: a free one is picked per attempt
  int omp_threads = 0;           // OMP_NUM_THREADS to set; 0 leaves it alone
  std::string omp_wait_policy;   // OMP_WAIT_POLICY to set; empty leaves it alone
  std::string rendezvous_token;  // ACCEL_RENDEZVOUS_TOKEN to set; empty leaves it alone
  ClusterEnv cluster;
  std::vector<std::string> notes;  // decisions worth a line in the launch log
};

// `gpu_count`: GPUs visible on this machine (used only to pick MULTI_GPU vs MULTI_CPU when the
// config says NO but more than one process is asked for). `env` is accel-run's environment (the
// workers inherit it); `config_where` names the config file in messages (Note [checks before any
// worker starts] in launcher/launch_checks.h).
LaunchPlan resolve_plan(const LaunchConfig& file_config, const LaunchFlags& flags,
                        const EnvMap& env, int gpu_count, const std::string& config_where = "");

// Note [rendezvous token]: the store (comm/env.h ACCEL_RENDEZVOUS_TOKEN) admits only clients that
// present the job's token. The token is --rendezvous_token, else an exported
// ACCEL_RENDEZVOUS_TOKEN; without either, an accel-run that starts the whole world generates a
// fresh random one, and a job spanning several accel-runs (several machines, or one task per
// worker under SLURM/OpenMPI) is refused with a ConfigError saying how to get one (`accel-run
// token`): the accel-runs cannot agree on a random value, and a store without a token lets anyone
// who reaches MASTER_ADDR:MASTER_PORT join the job.
void resolve_rendezvous_token(LaunchPlan& plan, const LaunchFlags& flags, const EnvMap& env);

// Shortest token accepted (the generated ones have 32 hex digits = 128 bits).
constexpr size_t kMinTokenLength = 16;
constexpr size_t kTokenBytes = 16;
// A new token as `accel-run token` prints it.
std::string new_rendezvous_token();

// The flag of row `s` given `raw`: parsed by the row once, stored in f.training under its config
// key; ConfigError naming the flag and what it accepts (Note [settings are checked by their row]
// in launcher/config.h).
void set_setting_flag(LaunchFlags& f, const settings::Setting& s, const std::string& raw);
// The same for the row whose flag ("--zero_stage") or config key ("zero_config.zero_stage") is
// `key_or_flag`.
void set_setting_flag(LaunchFlags& f, std::string_view key_or_flag, const std::string& raw);

// Row `s`'s value in the plan, in the table's canonical spelling; nullopt when neither the
// config file nor a flag set it (Note [who wins: launcher or program] in launcher/config.h).
std::optional<std::string> exported_setting(const LaunchPlan& p, const settings::Setting& s);

// Variables set for local worker `local_index` (0-based) on attempt `restart_count`.
EnvMap worker_env(const LaunchPlan& plan, int local_index, int restart_count);

// Count of /dev/nvidiaN device nodes: cheap, needs no driver library.
int count_gpu_device_nodes();

}  // namespace accel::launcher
