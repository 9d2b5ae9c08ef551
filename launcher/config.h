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

// `num_machines` (flag or config key): "N" (a fixed number of machines) or "MIN:MAX" (elastic
// membership, 1 <= MIN <= MAX: Note [elastic rendezvous] in launcher/rendezvous.cc).
struct MachineCount {
  int min = 1;
  int max = 1;
  bool elastic = false;  // given as MIN:MAX
};
// Throws ConfigError naming the setting (`what`: the flag or the config key) and what is accepted.
MachineCount parse_num_machines(const std::string& v, const char* what = "--num_machines");

struct LaunchConfig {
  std::string compute_environment = "LOCAL_MACHINE";
  std::string distributed_type = "NO";  // NO | MULTI_CPU | MULTI_GPU
  int num_machines = 1;                 // MIN when elastic
  int max_machines = 0;   // num_machines: MIN:MAX in the file: MAX (0: a fixed number)
  int num_processes = 1;  // total across all machines (Accelerate semantics)
  int machine_rank = 0;
  std::optional<std::string> main_process_ip;
  std::optional<int> main_process_port;
  // Note [who wins: launcher or program]: the settings accel-run exports to the program are
  // those the config file or a flag gives; unset ones are not exported, so the program's
  // AcceleratorConfig stands (Accelerate's precedence). The training settings (the rows of
  // core/settings.h: mixed_precision, use_cpu, zero_config.*, fsdp_config.*, the mesh sizes, ...)
  // by config key, in the row's canonical spelling; read and written through the row
  // (Note [settings are checked by their row]), never by a field of their own.
  settings::Values training;
  std::string gpu_ids = "all";  // "all" or "0,1,3"
  std::string rdzv_backend = "static";
  bool same_network = true;
  std::string main_training_function = "main";  // kept for Accelerate compatibility; unused
  // accel-run extensions (flags of the same name override them).
  int max_restarts = 0;
  double monitor_interval = 0.1;
  int num_cpu_threads_per_process = 0;  // 0: OMP_NUM_THREADS = cpus / local processes

  // Row `key`'s value (its config key or its flag: "zero_config.zero_stage", "--zero_stage"), or
  // nullopt when not set; typed by the row's kind. ConfigError for a key without a row.
  std::optional<std::string> get(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  bool has(std::string_view key) const { return get(key).has_value(); }
  // Row `key` := `raw`, parsed by the row once (ConfigError naming the key and what the row
  // accepts); nullopt unsets it.
  LaunchConfig& set(std::string_view key, const std::optional<std::string>& raw);
  bool use_cpu() const { return get_bool("use_cpu").value_or(false); }

  bool operator==(const LaunchConfig&) const = default;
};

// Note [settings are checked by their row]
// A training setting with a row in the settings table (core/settings.h) is checked and spelled by
// that row's parser alone: the config file reader (by the row's key or one of its aliases, Note
// [aliases of a setting]), the flags (set_setting_flag, once per flag), the questionnaire (asked
// from the row's Question, Note [questions from the table]) and validate() all go through
// settings::parse, so the values a setting takes live in one place and every path refuses the
// same values with the same explanation; the canonical value is kept in LaunchConfig::training
// under the row's config key, written by config_to_yaml and exported by worker_env in loops over
// the rows. tests/launcher/test_config.cc checks that the reader accepts exactly what each row
// accepts; tests/launcher/test_settings.cc round-trips every row.
//
// The row whose config key (or flag) is `key`; ConfigError when there is none.
const settings::Setting& setting_row(std::string_view key);
// `raw` in the canonical spelling of row `key`, or nullopt with `why` (when given) saying what the
// row accepts ("expected one of bf16, fp16, fp32, got 'fp8'").
std::optional<std::string> parse_setting(std::string_view key, std::string_view raw,
                                         std::string* why);
// What row `key` refuses `raw` for, or nullopt when it accepts it.
std::optional<std::string> check_setting(std::string_view key, std::string_view raw);

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
