// The accel-run config file: what `accel-run config` writes and `launch` reads.
// Keys follow Accelerate's default_config.yaml where they mean the same thing; see
// docs/launcher.md.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/parallelism.h"
#include "core/settings.h"
#include "launcher/util.h"

namespace accel::launcher {

// Bounds of the config file's counts, and the port the questionnaire offers.
inline constexpr long long kMaxProcesses = 1 << 20;
inline constexpr long long kMaxMachines = 1 << 16;
inline constexpr int kDefaultMainProcessPort = 29500;

struct LaunchConfig {
  std::string compute_environment = "LOCAL_MACHINE";
  std::string distributed_type = "NO";  // NO | MULTI_CPU | MULTI_GPU
  int num_machines = 1;
  int num_processes = 1;  // total across all machines (Accelerate semantics)
  int machine_rank = 0;
  std::optional<std::string> main_process_ip;
  std::optional<int> main_process_port;
  // Note [who wins: launcher or program]: the settings accel-run exports to the program are
  // those the config file or a flag gives; unset (nullopt) ones are not exported, so the
  // program's AcceleratorConfig stands (Accelerate's precedence).
  std::optional<std::string> mixed_precision;  // no | fp16 | bf16
  bool use_cpu = false;
  std::string gpu_ids = "all";  // "all" or "0,1,3"
  std::string rdzv_backend = "static";
  bool same_network = true;
  std::string main_training_function = "main";     // kept for Accelerate compatibility; unused
  std::optional<int> gradient_accumulation_steps;  // >= 1
  std::optional<int> zero_stage;                   // zero_config.zero_stage, 0..3
  // A strategy registered in the program (accelerate/strategy_registry.h): ddp, zero1, zero2,
  // fsdp or the program's own (accel-run cannot list those: any lower-case identifier).
  std::optional<std::string> strategy;
  // ZeRO mixed precision (zero_config.param_dtype / reduce_dtype): bf16 | fp16 | fp32 compute
  // parameters over fp32 master shards; gradients reduced in the param dtype or fp32.
  std::optional<std::string> param_dtype, reduce_dtype;
  // ZeRO-3 (fsdp_config.fsdp_*, dist::FsdpOptions): unset ones are not exported, so the
  // program's AcceleratorConfig::fsdp stands. fsdp_wrap: entries | classes | min_params | none.
  std::optional<std::string> fsdp_wrap;
  std::optional<std::string> fsdp_wrap_classes;  // "Block,Layer"
  std::optional<long long> fsdp_min_params;
  std::optional<bool> fsdp_reshard_after_forward, fsdp_prefetch, fsdp_activation_checkpointing;
  // The device mesh (parallelism_config.parallelism_config_*_size, core/parallelism.h): unset
  // ones are inferred from the world size (Note [mesh sizes]); launch refuses sizes that do not
  // fit the world before it starts a worker.
  std::optional<int> dp_replicate_size, dp_shard_size, tp_size;
  // accel-run extensions (flags of the same name override them).
  int max_restarts = 0;
  double monitor_interval = 0.1;
  int num_cpu_threads_per_process = 0;  // 0: OMP_NUM_THREADS = cpus / local processes

  bool operator==(const LaunchConfig&) const = default;
};

// Note [settings are checked by their row]
// A training setting with a row in the settings table (core/settings.h: mixed_precision, use_cpu,
// zero_config.*, fsdp_config.*, strategy, ...) is checked and spelled by that row's parser alone,
// found by its config key: the config file reader, the flags (set_setting_flag, once per flag),
// the questionnaire (its bounds, choices and defaults) and validate() all go through
// parse_setting, so the values a setting takes live in one place and every path refuses the same
// values with the same explanation; the canonical value then reaches its LaunchConfig field
// through the row's one binding (set_config_setting), and validate() and config_to_yaml loop over
// the rows (config_setting). The config file translates Accelerate's other spellings of a
// setting (mixed_precision: false, fsdp_auto_wrap_policy: SIZE_BASED_WRAP, fsdp_sharding_strategy:
// SHARD_GRAD_OP, ...) into ours before the row reads them. tests/launcher/test_config.cc checks
// that the reader accepts exactly what each row accepts.
//
// The row whose config key is `key` ("zero_config.param_dtype"); ConfigError when there is none.
const settings::Setting& setting_row(std::string_view key);
// `raw` in the canonical spelling of row `key`, or nullopt with `why` (when given) saying what the
// row accepts ("expected one of bf16, fp16, fp32, got 'fp8'").
std::optional<std::string> parse_setting(std::string_view key, std::string_view raw,
                                         std::string* why);
// What row `key` refuses `raw` for, or nullopt when it accepts it.
std::optional<std::string> check_setting(std::string_view key, std::string_view raw);
// Row `s`'s field of `c`, in the row's canonical spelling (nullopt: not set; use_cpu is always
// set), and the field := `canonical` (launcher/settings_binding.cc: one binding line per row).
// validate(), config_to_yaml, the file reader and the flags go through these.
std::optional<std::string> config_setting(const LaunchConfig& c, const settings::Setting& s);
void set_config_setting(LaunchConfig& c, const settings::Setting& s, const std::string& canonical);

// The checks of the settings without a row. Each returns an explanation of what is accepted, or
// nullopt when the value is fine.
std::optional<std::string> check_distributed_type(const std::string& v);
std::optional<std::string> check_gpu_ids(const std::string& v);
// Canonical spelling ("0,1"); input must have passed the check.
std::string normalize_gpu_ids(const std::string& v);
// Completes a wrap policy given in parts: fsdp_wrap_classes alone means fsdp_wrap classes,
// fsdp_min_params alone min_params. Returns an explanation when the parts contradict each other.
std::optional<std::string> complete_fsdp_wrap(LaunchConfig& c);

// Cross-key consistency (num_processes divisible by num_machines, machine_rank < num_machines...).
// `where` prefixes the message, e.g. the file name.
void validate(const LaunchConfig& c, const std::string& where);

// The parallelism sizes of `c` (core/parallelism.h).
ParallelismConfig parallelism_of(const LaunchConfig& c);
// ConfigError naming every size and the world size when the sizes of `c` do not fit a world of
// `world` processes (Note [mesh sizes]); `where` prefixes the message.
void check_parallelism(const LaunchConfig& c, int world, const std::string& where);

// Default location: $ACCEL_CONFIG_FILE, else $XDG_CACHE_HOME/accel/default_config.yaml,
// else $HOME/.cache/accel/default_config.yaml.
std::string default_config_path(const EnvMap& env);

// Parses YAML text; `where` (usually the path) names the source in error messages.
// Throws ConfigError naming the key for bad values, unknown keys and YAML syntax errors.
LaunchConfig parse_config(const std::string& yaml_text, const std::string& where);
LaunchConfig load_config(const std::string& path);
std::string config_to_yaml(const LaunchConfig& c);
// Writes atomically (temp file + rename), creating the parent directories.
void save_config(const LaunchConfig& c, const std::string& path);

// The config `accel-run config default` writes: one process per GPU when GPUs are visible,
// otherwise a single CPU process.
LaunchConfig basic_config(int gpu_count, const std::string& mixed_precision);

// The interactive questionnaire. Reads answers line by line from `in`; an invalid answer is
// explained and asked again; end of input before the last question throws ConfigError.
LaunchConfig run_questionnaire(std::istream& in, std::ostream& out, int gpu_count);

}  // namespace accel::launcher
