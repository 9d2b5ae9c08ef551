#include "launcher/plan.h"

#include "launcher/launch_checks.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/env_contract.h"

namespace accel::launcher {
namespace {

// The training settings given as flags over the config's (flags win), each already in its row's
// spelling (set_setting_flag parsed it once). The wrap flags replace the config's wrap policy as a
// whole (--fsdp_wrap_classes alone means --fsdp_wrap classes), so a config that chose min_params
// does not contradict --fsdp_wrap classes. Options a stage does not use are refused by
// check_effective_settings (Note [cross-row rules] in core/settings.h), over every value a worker
// will read.
void apply_setting_flags(const LaunchFlags& f, LaunchConfig& c) {
  auto wrap_part = [](std::string_view key) {
    return key == "fsdp_config.fsdp_wrap" || key == "fsdp_config.fsdp_wrap_classes" ||
           key == "fsdp_config.fsdp_min_params";
  };
  LaunchConfig w;
  bool wrap = false;
  for (const auto& [key, v] : f.training) {
    (wrap_part(key) ? w : c).training[key] = v;
    wrap = wrap || wrap_part(key);
  }
  if (!wrap) return;
  if (auto why = complete_fsdp_wrap(w))
    ACCEL_THROW(launcher::ConfigError, "launch", "--fsdp_wrap_classes / --fsdp_min_params: ", *why);
  for (const char* key :
       {"fsdp_config.fsdp_wrap", "fsdp_config.fsdp_wrap_classes", "fsdp_config.fsdp_min_params"})
    c.set(key, w.get(key));
}

constexpr int kDefaultMultiMachinePort = 29500;
constexpr const char* kLoopback = "127.0.0.1";

}  // namespace

int count_gpu_device_nodes() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++n;
    }
  }
  return n;
}

namespace {

// The flags over the config file (and the outer launcher's values): flags win.
void apply_flags(const LaunchFlags& flags, LaunchConfig& c) {
  if (flags.num_processes) c.num_processes = *flags.num_processes;
  if (flags.num_machines) c.num_machines = *flags.num_machines;
  if (flags.machine_rank) c.machine_rank = *flags.machine_rank;
  if (flags.main_process_ip) c.main_process_ip = *flags.main_process_ip;
  if (flags.main_process_port) c.main_process_port = *flags.main_process_port;
  if (flags.gpu_ids) {
    if (auto e = check_gpu_ids(*flags.gpu_ids))
      ACCEL_THROW(launcher::ConfigError, "launch", "--gpu_ids: ", *e);
    c.gpu_ids = normalize_gpu_ids(*flags.gpu_ids);
  }
  if (flags.max_restarts) c.max_restarts = *flags.max_restarts;
  if (flags.monitor_interval) c.monitor_interval = *flags.monitor_interval;
  if (flags.num_cpu_threads_per_process)
    c.num_cpu_threads_per_process = *flags.num_cpu_threads_per_process;
  // The mesh sizes among them: resolve_plan checks them against the world.
  apply_setting_flags(flags, c);
}

// OMP_NUM_THREADS and OMP_WAIT_POLICY for the workers.
void plan_threads(LaunchPlan& p, const EnvMap& env) {
  if (p.config.num_cpu_threads_per_process > 0) {
    p.omp_threads = p.config.num_cpu_threads_per_process;
  } else if (!env.count(env::kOmpNumThreads) && p.local_world_size > 1) {
    // Note [threads per worker]: oneDNN/OpenMP default to one thread per core in every worker; with
    // several workers per machine that oversubscribes the cores and slows every collective.
    p.omp_threads = std::max(1, usable_cpu_count() / p.local_world_size);
  }
  // Note [OpenMP wait policy]: libgomp's default lets a thread that finished its share of a
  // parallel region spin (~300k iterations) before it sleeps. When the workers' OpenMP teams fill
  // or exceed the cores, that spinning holds the cores the peer rank's main thread and the
  // collectives' threads need, and every step waits on the slowest rank (docs/performance.md,
  // "OpenMP wait policy"). libgomp reads the policy once at start-up, so the launcher sets it in
  // the worker's environment; a value the user exported is kept.
  if (!env.count(env::kOmpWaitPolicy) && !env.count("GOMP_SPINCOUNT") && p.local_world_size > 1) {
    int threads = p.omp_threads;
    if (threads <= 0) {
      const auto given = env_get(env, env::kOmpNumThreads);
      threads = given ? std::atoi(given->c_str()) : 0;  // "4,2" (nested) counts its first level
    }
    if (threads <= 0) threads = usable_cpu_count();
    if (int64_t(threads) * p.local_world_size >= usable_cpu_count()) p.omp_wait_policy = "passive";
  }
}

}  // namespace

LaunchPlan resolve_plan(const LaunchConfig& file_config, const LaunchFlags& flags,
                        const EnvMap& env, int gpu_count, const std::string& config_where) {
  LaunchPlan p;
  LaunchConfig& c = p.config;
  c = file_config;
  p.cluster = flags.ignore_cluster_env ? ClusterEnv{} : detect_cluster(env);
  const ClusterEnv& cl = p.cluster;
  const bool per_task = cl.kind != ClusterEnv::Kind::kNone && cl.mode == ClusterEnv::Mode::kPerTask;

  // Precedence: flags > outer launcher > config file (docs/launcher.md "Precedence").
  if (cl.kind != ClusterEnv::Kind::kNone) {
    p.notes.push_back(std::string(cluster_kind_name(cl.kind)) + ": " + cl.description);
    if (!per_task) {
      c.num_machines = cl.num_machines;
      c.machine_rank = cl.machine_rank;
    }
    if (cl.main_process_ip) c.main_process_ip = cl.main_process_ip;
    if (!c.main_process_port && cl.main_process_port) c.main_process_port = cl.main_process_port;
  }

  apply_flags(flags, c);

  if (per_task) {
    // The outer launcher fixed the world; the config's process counts do not apply.
    ACCEL_CHECK(!flags.num_processes || *flags.num_processes == cl.world_size,
                launcher::ConfigError, "launch", "--num_processes ",
                flags.num_processes.value_or(0), " conflicts with the ", cluster_kind_name(cl.kind),
                " world of ", cl.world_size, " tasks (each task is one worker); drop the flag");
    LaunchConfig check = c;
    check.num_machines = 1;
    check.machine_rank = 0;
    check.num_processes = 1;
    validate(check, "launch settings");
    p.world_size = cl.world_size;
    p.num_machines = cl.num_machines;
    p.machine_rank = cl.machine_rank;
    p.local_world_size = cl.local_world_size;
    p.num_local_workers = 1;
    p.first_rank = cl.rank;
    p.first_local_rank = cl.local_rank;
  } else {
    validate(c, "launch settings (config file + flags)");
    p.world_size = c.num_processes;
    p.num_machines = c.num_machines;
    p.machine_rank = c.machine_rank;
    p.local_world_size = c.num_processes / c.num_machines;
    p.num_local_workers = p.local_world_size;
    p.first_rank = c.machine_rank * p.local_world_size;
    p.first_local_rank = 0;
  }

  // Note [checks before any worker starts]: sizes that do not fit the world, strategies that do
  // not compose, ... stop the launch here, whether a flag, the config file or an inherited
  // ACCEL_* variable asked for them.
  LaunchConfig flags_only;
  apply_flags(flags, flags_only);
  check_effective_settings(effective_settings(c, flags_only, env, config_where), p.world_size,
                           "launch settings (config file + flags + environment)");

  if (c.main_process_ip) {
    p.master_addr = *c.main_process_ip;
  } else {
    ACCEL_CHECK(p.num_machines == 1, launcher::ConfigError, "launch",
                "main_process_ip is required with ", p.num_machines,
                " machines: pass --main_process_ip (the address of machine 0) or set it in the "
                "config file");
    p.master_addr = kLoopback;
  }
  if (c.main_process_port) {
    p.master_port = *c.main_process_port;
  } else if (p.num_machines == 1 && !per_task) {
    p.port_auto = true;
  } else {
    p.master_port = kDefaultMultiMachinePort;
    p.notes.push_back("main_process_port not given; using " +
                      std::to_string(kDefaultMultiMachinePort) +
                      " (every machine must agree on it)");
  }

  // A config that declares MULTI_CPU means CPU workers even when launched with one process.
  p.use_cpu = c.use_cpu() || c.distributed_type == "MULTI_CPU";
  if (p.world_size == 1) {
    p.distributed_type = "NO";
  } else if (c.distributed_type == "NO") {
    // More than one process makes it distributed whatever the config says (as in Accelerate).
    p.distributed_type = (!p.use_cpu && gpu_count > 0) ? "MULTI_GPU" : "MULTI_CPU";
  } else if (c.distributed_type == "MULTI_GPU" && p.use_cpu) {
    p.distributed_type = "MULTI_CPU";
    p.notes.push_back("use_cpu is set; using MULTI_CPU instead of MULTI_GPU");
  } else {
    p.distributed_type = c.distributed_type;
  }
  if (p.distributed_type == "MULTI_CPU") p.use_cpu = true;
  if (p.distributed_type == "MULTI_GPU" && c.gpu_ids != "all") {
    const int listed = static_cast<int>(split(c.gpu_ids, ',').size());
    if (listed < p.local_world_size) {
      p.notes.push_back("warning: gpu_ids lists " + std::to_string(listed) + " GPU(s) for " +
                        std::to_string(p.local_world_size) +
                        " processes per machine; some will share a GPU");
    }
  }

  plan_threads(p, env);
  return p;
}

void set_setting_flag(LaunchFlags& f, const settings::Setting& s, const std::string& raw) {
  std::string why;
  std::optional<std::string> v = settings::parse(s, raw, &why);
  ACCEL_CHECK(v.has_value(), launcher::ConfigError, "launch", s.flag, ": ", why);
  f.training[std::string(s.yaml)] = std::move(*v);
}

void set_setting_flag(LaunchFlags& f, std::string_view key_or_flag, const std::string& raw) {
  set_setting_flag(f, setting_row(key_or_flag), raw);
}

std::optional<std::string> exported_setting(const LaunchPlan& p, const settings::Setting& s) {
  // Never exported as false: the program may still choose the CPU.
  if (s.env == env::kUseCpu) return p.use_cpu ? std::optional<std::string>("true") : std::nullopt;
  return p.config.get(s.yaml);
}

std::string new_rendezvous_token() { return random_hex(kTokenBytes); }

void resolve_rendezvous_token(LaunchPlan& p, const LaunchFlags& flags, const EnvMap& env) {
  std::optional<std::string> given = flags.rendezvous_token;
  std::string source = "--rendezvous_token";
  if (!given) {
    given = env_get(env, env::kRendezvousToken);
    source = env::kRendezvousToken;
  }
  if (given) {
    ACCEL_CHECK(given->size() >= kMinTokenLength, launcher::ConfigError, "launch", source, " is ",
                given->size(), " characters long; use at least ", kMinTokenLength,
                " (`accel-run token` prints a 128-bit one)");
    for (char c : *given) {
      ACCEL_CHECK(c > ' ' && c < 127, launcher::ConfigError, "launch", source,
                  " may only hold printable ASCII without spaces (`accel-run token` prints a "
                  "suitable one)");
    }
    p.rendezvous_token = *given;
    return;
  }
  if (p.num_local_workers == p.world_size) {
    p.rendezvous_token = new_rendezvous_token();
    return;
  }
  const std::string span = p.num_machines > 1
                               ? std::to_string(p.num_machines) + " machines"
                               : std::to_string(p.world_size) + " separately launched tasks";
  ACCEL_THROW(launcher::ConfigError, "launch", "this job spans ", span,
              " and needs a rendezvous token shared by all of them, or anyone who can reach ",
              p.master_addr, ":", p.master_port,
              " could join it. Run `accel-run token` once and export the value as "
              "ACCEL_RENDEZVOUS_TOKEN on every machine (under SLURM or OpenMPI, export it in the "
              "batch script "
              "before srun/mpirun), or pass the same --rendezvous_token to every accel-run");
}

EnvMap worker_env(const LaunchPlan& p, int local_index, int restart_count) {
  ACCEL_INTERNAL_ASSERT(p.master_port > 0 && local_index >= 0 && local_index < p.num_local_workers);
  EnvMap v;
  v[env::kRank] = std::to_string(p.first_rank + local_index);
  v[env::kWorldSize] = std::to_string(p.world_size);
  v[env::kLocalRank] = std::to_string(p.first_local_rank + local_index);
  v[env::kLocalWorldSize] = std::to_string(p.local_world_size);
  v[env::kGroupRank] = std::to_string(p.machine_rank);
  v[env::kNodeRank] = std::to_string(p.machine_rank);
  v[env::kGroupWorldSize] = std::to_string(p.num_machines);
  v[env::kMasterAddr] = p.master_addr;
  v[env::kMasterPort] = std::to_string(p.master_port);
  v[env::kDistributedType] = p.distributed_type;
  v[env::kRestartCount] = std::to_string(restart_count);
  v[env::kMaxRestarts] = std::to_string(p.config.max_restarts);
  if (!p.rendezvous_token.empty()) v[env::kRendezvousToken] = p.rendezvous_token;
  if (p.omp_threads > 0) v[env::kOmpNumThreads] = std::to_string(p.omp_threads);
  if (!p.omp_wait_policy.empty()) v[env::kOmpWaitPolicy] = p.omp_wait_policy;
  if (!p.use_cpu && p.config.gpu_ids != "all") v[env::kCudaVisibleDevices] = p.config.gpu_ids;
  // The training settings (core/settings.h): only what the config or the flags chose, each
  // overriding AcceleratorConfig in the worker (Note [who wins: launcher or program] in
  // launcher/config.h).
  for (const settings::Setting& s : settings::kSettings)
    if (auto value = exported_setting(p, s)) v[std::string(s.env)] = *value;
  return v;
}

}  // namespace accel::launcher
