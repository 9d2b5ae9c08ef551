// accel-run: config questionnaire, supervised launch, environment report and self test.
// Usage and semantics: docs/launcher.md.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "accel_run_version.h"
#include "core/env_contract.h"
#include "launcher/config.h"
#include "launcher/elastic_agent.h"
#include "launcher/env_report.h"
#include "launcher/output.h"
#include "launcher/plan.h"
#include "launcher/supervisor.h"
#include "launcher/util.h"

namespace al = accel::launcher;

namespace {

constexpr double kDefaultGracePeriod = 5.0;
constexpr double kDefaultStoppedTimeout = 30.0;
constexpr double kMaxStoppedTimeout = 86400.0;
constexpr double kMaxGracePeriod = 300.0;
constexpr double kMaxMonitorInterval = 60.0;
constexpr const char* kDefaultForwardSignals = "SIGUSR1,SIGUSR2";
constexpr int kSelftestDefaultProcesses = 2;

struct LaunchArgs {
  al::LaunchFlags flags;
  // The training settings' flags as given, applied to `flags` (al::set_setting_flag) after
  // parsing, so that a bad value is an accel-run error naming the flag (exit 1).
  std::vector<std::pair<const accel::settings::Setting*, std::string>> setting_flags;
  std::string config_file;
  double grace_period = kDefaultGracePeriod;
  double stopped_timeout = kDefaultStoppedTimeout;
  std::string forward_signals = kDefaultForwardSignals;
  std::string log_dir;
  std::optional<std::string> tee;
  bool no_rank_prefix = false;
  bool quiet = false;
  std::optional<std::string> num_machines;  // N or MIN:MAX (al::parse_num_machines)
  al::ElasticOptions elastic;
};

template <typename T>
CLI::Option* add_optional(CLI::App* app, const std::string& names, std::optional<T>& target,
                          const std::string& help) {
  return app->add_option_function<T>(
      names, [&target](const T& v) { target = v; }, help);
}

// Seconds in [lo, hi] ((lo, hi] when lo_open), finite: every floating flag goes through
// al::check_number (Note [floating options] in launcher/util.h); CLI::Range lets nan through.
CLI::Validator seconds_in(double lo, double hi, bool lo_open = false) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const auto v = al::parse_double(text);
        if (!v) return "expected a number of seconds, got '" + text + "'";
        const auto e = al::check_number(*v, lo, hi, lo_open);
        return e ? "seconds: " + *e : std::string();
      },
      "SECONDS");
}

void add_launch_flags(CLI::App* app, LaunchArgs& a) {
  auto& f = a.flags;
  app->add_option(
      "--config_file,--config-file", a.config_file,
      "config file (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml)");
  add_optional(app, "--num_processes,--num-processes", f.num_processes,
               "total number of worker processes over all machines");
  add_optional(app, "--num_machines,--num-machines", a.num_machines,
               "number of machines: N, or MIN:MAX for elastic membership (rendezvous rounds)");
  app->add_option("--rdzv_last_call,--rdzv-last-call", a.elastic.last_call_s,
                  "elastic: seconds a round stays open for more machines once MIN have joined")
      ->check(seconds_in(0.0, 3600.0));
  app->add_option("--rdzv_keep_alive,--rdzv-keep-alive", a.elastic.keep_alive_s,
                  "elastic: a machine silent this long is lost and a new round forms")
      ->check(seconds_in(0.0, 3600.0, /*lo_open=*/true));
  add_optional(app, "--machine_rank,--machine-rank", f.machine_rank,
               "rank of this machine (0: hosts the main process)");
  add_optional(app, "--main_process_ip,--main-process-ip", f.main_process_ip,
               "address of machine 0");
  add_optional(
      app, "--main_process_port,--main-process-port", f.main_process_port,
      "port of the rendezvous store on machine 0 (single machine: a free port when unset)");
  add_optional(app, "--gpu_ids,--gpu-ids", f.gpu_ids,
               "GPUs of this machine to use: all or e.g. 0,1 (CUDA_VISIBLE_DEVICES)");
  add_optional(app, "--max_restarts,--max-restarts", f.max_restarts,
               "restart the whole group up to N times after a failure (ACCEL_RESTART_COUNT)");
  add_optional(app, "--monitor_interval,--monitor-interval", f.monitor_interval,
               "seconds between liveness checks (output and exits are handled as they happen)")
      ->check(seconds_in(0.0, kMaxMonitorInterval, /*lo_open=*/true));
  // The training settings: one flag per row of core/settings.h (and its dashed spelling).
  for (const accel::settings::Setting& s : accel::settings::kSettings) {
    auto dashed = [](std::string_view flag) {
      std::string d(flag);
      for (size_t i = 2; i < d.size(); ++i)
        if (d[i] == '_') d[i] = '-';
      return d;
    };
    std::string names = std::string(s.flag);
    if (dashed(s.flag) != names) names += "," + dashed(s.flag);
    const std::string help = std::string(s.allowed) + " (" + std::string(s.env) + "; key " +
                             std::string(s.yaml) + "; default " + std::string(s.default_value) +
                             ")";
    if (s.switch_flag) {
      // A switch (=false, or the negation, turns off what a config file turned on).
      if (!s.negation.empty()) names += ",!" + std::string(s.negation) + ",!" + dashed(s.negation);
      app->add_flag_function(
          names,
          [&a, &s](std::int64_t n) { a.setting_flags.emplace_back(&s, n > 0 ? "true" : "false"); },
          help);
    } else {
      app->add_option_function<std::string>(
          names, [&a, &s](const std::string& v) { a.setting_flags.emplace_back(&s, v); }, help);
    }
  }
  add_optional(app, "--num_cpu_threads_per_process,--num-cpu-threads-per-process",
               f.num_cpu_threads_per_process,
               "OMP_NUM_THREADS for every worker (default: CPUs / workers per machine)");
  app->add_option("--grace_period,--grace-period", a.grace_period,
                  "seconds between SIGTERM and SIGKILL when the group is stopped")
      ->check(seconds_in(0.0, kMaxGracePeriod));
  add_optional(app, "--rendezvous_token,--rendezvous-token", f.rendezvous_token,
               "secret shared by every machine of the job (default: $ACCEL_RENDEZVOUS_TOKEN; see "
               "`accel-run token`)");
  app->add_option(
         "--stopped_timeout,--stopped-timeout", a.stopped_timeout,
         "seconds a worker may stay stopped (SIGSTOP) before it counts as failed; 0: never")
      ->check(seconds_in(0.0, kMaxStoppedTimeout));
  app->add_option("--forward_signals,--forward-signals", a.forward_signals,
                  "signals passed on to every worker without stopping the job, e.g. "
                  "SIGUSR1,SIGUSR2 (default), or none");
  app->add_option("--log_dir,--log-dir", a.log_dir,
                  "write each worker's stdout/stderr to "
                  "DIR/attempt_<n>/rank_<r>/{stdout,stderr}.log (and its error.json)");
  add_optional(
      app, "--tee", a.tee,
      "with --log_dir: worker streams also printed: 0/none (default), 1/stdout, 2/stderr, 3/all");
  app->add_flag("--ignore_cluster_env,--ignore-cluster-env", f.ignore_cluster_env,
                "do not read SLURM_* / OMPI_COMM_WORLD_* variables");
  app->add_flag("--no_rank_prefix,--no-rank-prefix", a.no_rank_prefix,
                "do not prefix output lines with [rankN]: ");
  app->add_flag("-q,--quiet", a.quiet, "only print failure reports, not progress lines");
}

bool path_given(const std::string& p) { return !p.empty(); }

std::string config_path_for(const std::string& flag, const al::EnvMap& env) {
  return path_given(flag) ? flag : al::default_config_path(env);
}

// The config in effect; `loaded` gets the path of the file read ("" when none was).
al::LaunchConfig load_effective_config(const std::string& flag, const al::EnvMap& env,
                                       std::string& loaded) {
  if (path_given(flag)) {
    ACCEL_CHECK(std::filesystem::exists(flag), IoError, "config", "config file '", flag,
                "' does not exist");
    loaded = flag;
    return al::load_config(flag);
  }
  std::string path;
  try {
    path = al::default_config_path(env);
  } catch (const al::ConfigError&) {
    return {};  // no HOME: defaults
  }
  if (!std::filesystem::exists(path)) return {};
  loaded = path;
  return al::load_config(path);
}

void apply_setting_flags(LaunchArgs& a) {
  for (const auto& [s, v] : a.setting_flags) al::set_setting_flag(a.flags, *s, v);
  a.setting_flags.clear();
}

al::SuperviseOptions supervise_options(const LaunchArgs& a, std::vector<std::string> argv) {
  al::SuperviseOptions opts;
  opts.forward_signals = al::parse_forward_signals(a.forward_signals);
  if (a.tee) {
    ACCEL_CHECK(!a.log_dir.empty(), launcher::ConfigError, "launch",
                "--tee chooses which streams are also printed besides the --log_dir files; pass "
                "--log_dir too");
    opts.tee = al::parse_tee(*a.tee);
  }
  // Absolute: the error file paths in the workers' environment must not depend on their cwd.
  if (!a.log_dir.empty()) {
    opts.log_dir = std::filesystem::absolute(a.log_dir).lexically_normal().string();
    while (opts.log_dir.size() > 1 && opts.log_dir.back() == '/') opts.log_dir.pop_back();
  }
  opts.stopped_timeout_s = a.stopped_timeout;
  opts.argv = std::move(argv);
  opts.grace_period_s = a.grace_period;
  opts.rank_prefix = !a.no_rank_prefix;
  opts.quiet = a.quiet;
  return opts;
}

void print_notes(const LaunchArgs& a, const al::LaunchPlan& plan) {
  for (const auto& n : plan.notes) {
    if (!a.quiet || n.rfind("warning", 0) == 0) std::cerr << "accel-run: " << n << "\n";
  }
}

// `--num_machines MIN:MAX` (Note [elastic rendezvous] in launcher/rendezvous.cc): the plan is
// resolved for MIN machines (num_processes is the total at MIN, so num_processes / MIN workers run
// on every machine); machine ranks, world size and MASTER_ADDR/PORT come from each round.
// `spec` is the flag's MIN:MAX, or the config file's `num_machines: MIN:MAX`.
int run_elastic_launch(const LaunchArgs& a, const std::string& spec, al::LaunchFlags flags,
                       const al::LaunchConfig& cfg, const std::string& config_path,
                       const al::EnvMap& env, std::vector<std::string> argv) {
  al::ElasticOptions eo = a.elastic;
  eo.machines = al::parse_num_machines(spec);
  flags.num_machines = eo.machines.min;
  ACCEL_CHECK(!flags.machine_rank, launcher::ConfigError, "launch",
              "--machine_rank with --num_machines ", spec,
              ": elastic machine ranks are assigned by each rendezvous round");
  ACCEL_CHECK(flags.main_process_ip || cfg.main_process_ip, launcher::ConfigError, "launch",
              "--num_machines ", spec,
              " needs --main_process_ip: the address of the machine that serves the rendezvous");
  ACCEL_CHECK(flags.rendezvous_token || al::env_get(env, accel::env::kRendezvousToken),
              launcher::ConfigError, "launch", "--num_machines ", spec,
              " needs a rendezvous token shared by every machine: run `accel-run token` once and "
              "export it as ACCEL_RENDEZVOUS_TOKEN on every machine, or pass --rendezvous_token");
  flags.machine_rank = 0;
  al::LaunchConfig c = cfg;
  c.machine_rank = 0;
  if (!flags.main_process_port && !c.main_process_port)
    flags.main_process_port = al::kDefaultMainProcessPort;
  al::LaunchPlan plan = al::resolve_plan(c, flags, env, al::count_gpu_device_nodes(), config_path);
  al::resolve_rendezvous_token(plan, flags, env);
  plan.port_auto = false;
  print_notes(a, plan);
  return al::run_elastic(plan, env, supervise_options(a, std::move(argv)), eo);
}

int run_launch(const LaunchArgs& a, std::vector<std::string> argv, bool selftest) {
  const al::EnvMap env = al::current_environment();
  std::string config_path;
  al::LaunchConfig cfg = load_effective_config(a.config_file, env, config_path);
  al::LaunchFlags flags = a.flags;
  if (a.num_machines) {
    const al::MachineCount m = al::parse_num_machines(*a.num_machines);
    flags.num_machines = m.min;
    if (m.elastic)
      return run_elastic_launch(a, *a.num_machines, flags, cfg, config_path, env, std::move(argv));
  } else if (cfg.max_machines > 0) {
    // The config file's `num_machines: MIN:MAX` (a flag N wins over it, as for every key).
    const std::string spec =
        std::to_string(cfg.num_machines) + ":" + std::to_string(cfg.max_machines);
    return run_elastic_launch(a, spec, flags, cfg, config_path, env, std::move(argv));
  }
  if (selftest && !flags.num_processes && cfg.num_processes == 1 && cfg.num_machines == 1) {
    // One process exercises no collective; the self test always runs a real group.
    flags.num_processes = kSelftestDefaultProcesses;
  }
  al::SuperviseOptions opts = supervise_options(a, std::move(argv));
  al::LaunchPlan plan =
      al::resolve_plan(cfg, flags, env, al::count_gpu_device_nodes(), config_path);
  al::resolve_rendezvous_token(plan, flags, env);
  print_notes(a, plan);
  return al::supervise(plan, env, opts);
}

// Note [selftest lookup]: accel-selftest is built by comm/tools into build/comm/tools and installed
// next to accel-run; look beside ourselves, then in the build tree, then in the configured bindir.
// accel-estimate-memory and accel-merge-weights (accelerate/tools) are looked up the same way.
// `override_env` names the variable that replaces the search; `build_dir` is the program's folder
// in the build tree.
std::vector<std::string> helper_candidates(const char* override_env, const std::string& name,
                                           const std::string& build_dir) {
  std::vector<std::string> out;
  if (const char* o = std::getenv(override_env); o && *o) {
    out.emplace_back(o);
    return out;
  }
  const std::string dir = al::self_exe_dir();
  if (!dir.empty()) {
    out.push_back(dir + "/" + name);
    out.push_back(dir + "/../" + build_dir + "/" + name);  // the build tree
  }
  out.push_back(std::string(ACCEL_BINDIR) + "/" + name);
  return out;
}

std::vector<std::string> selftest_candidates() {
  return helper_candidates(accel::env::kSelftest, "accel-selftest", "comm/tools");
}

// `accel-run WORD ARGS...` is PROGRAM ARGS... for the subcommands that are programs of
// accelerate/tools: estimate-memory (accel-estimate-memory) and merge-weights
// (accel-merge-weights) read and write safetensors through io/, which accel-run does not link
// (docs/layers.md). `override_env` names the variable that replaces the search. Returns only when
// the program cannot be run.
int run_tool(int argc, char** argv, const std::string& word, const char* override_env,
             const std::string& program) {
  const auto cands = helper_candidates(override_env, program, "accelerate/tools");
  const std::string self = "accel-run " + word;
  for (const auto& c : cands) {
    if (access(c.c_str(), X_OK) != 0) continue;
    std::vector<char*> args;
    std::string arg0 = self;
    args.push_back(arg0.data());
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv(c.c_str(), args.data());
    std::cerr << self << ": cannot run " << c << ": " << std::strerror(errno) << "\n";
    return 127;
  }
  std::cerr << self << ": the program " << program << " was not found; looked in:\n";
  for (const auto& c : cands) std::cerr << "  " << c << "\n";
  std::cerr << "build it (ninja -C build accelerate/tools/" << program << ") or set "
            << override_env << " to its path\n";
  return 2;
}

int run_selftest(const LaunchArgs& a) {
  auto cands = selftest_candidates();
  for (const auto& c : cands) {
    if (access(c.c_str(), X_OK) == 0) {
      std::error_code ec;
      std::string path = std::filesystem::weakly_canonical(c, ec).string();
      if (ec) path = c;
      if (!a.quiet) std::cerr << "accel-run test: running " << path << "\n";
      int rc = run_launch(a, {path}, /*selftest=*/true);
      // Through a non-blocking sink: stdout may be a pipe nobody reads (Note [non-blocking
      // console]).
      al::write_console(1, rc == 0
                               ? std::string("accel-run test: PASS\n")
                               : "accel-run test: FAIL (exit code " + std::to_string(rc) + ")\n");
      return rc;
    }
  }
  std::cerr << "accel-run test: the self-test program accel-selftest was not found; looked in:\n";
  for (const auto& c : cands) std::cerr << "  " << c << "\n";
  std::cerr
      << "build it (ninja -C build comm/tools/accel-selftest) or set ACCEL_SELFTEST to its path\n";
  return 2;
}

int run_config(const std::string& config_file) {
  const al::EnvMap env = al::current_environment();
  const std::string path = config_path_for(config_file, env);
  int gpus = al::detect_gpu_count();
  al::LaunchConfig c = al::run_questionnaire(std::cin, std::cout, gpus);
  al::save_config(c, path);
  std::cout << "accel-run config written to " << path << "\n";
  return 0;
}

int run_config_default(const std::string& config_file, const std::string& mixed_precision,
                       bool force) {
  const al::EnvMap env = al::current_environment();
  const std::string path = config_path_for(config_file, env);
  if (std::filesystem::exists(path) && !force) {
    std::cerr << "accel-run config default: " << path
              << " already exists; not overwriting it (run `accel-run config`, pass --force or "
                 "another --config_file)\n";
    return 1;
  }
  al::LaunchConfig c = al::basic_config(al::detect_gpu_count(), mixed_precision);
  al::save_config(c, path);
  std::cout << "accel-run config written to " << path << "\n";
  return 0;
}

// Walks accel-run's own launch flags (argv[2..]) up to PROGRAM. Returns the index of a "--" that
// ends them, or -1 when PROGRAM comes first (a "--" after PROGRAM belongs to PROGRAM). An unknown
// flag before PROGRAM is reported here: CLI11's prefix mode would take it for the program name.
int launch_separator(CLI::App* launch, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    const std::string t = argv[i];
    if (t == "--") return i;
    if (t.size() < 2 || t[0] != '-') return -1;  // PROGRAM
    const std::string name = t.substr(0, t.find('='));
    const CLI::Option* opt = launch->get_option_no_throw(name);
    if (opt == nullptr) {
      throw CLI::ExtrasError(
          "unknown flag '" + t + "' before PROGRAM (put -- before a PROGRAM that starts with -)",
          CLI::ExitCodes::ExtrasError);
    }
    if (t.find('=') == std::string::npos && opt->get_expected_min() > 0) ++i;  // skip the value
  }
  return -1;
}

int run_main(int argc, char** argv) {
  CLI::App app{"accel-run: configure, launch and check accel distributed training"};
  app.set_version_flag("--version", std::string("accel-run ") + ACCEL_VERSION);
  app.require_subcommand(1);

  std::string config_file;
  auto* config =
      app.add_subcommand("config", "interactive questionnaire that writes the config file");
  config->add_option("--config_file,--config-file", config_file,
                     "where to write (default: ~/.cache/accel/default_config.yaml)");
  std::string default_file, default_precision = "no";
  bool force = false;
  auto* config_default =
      config->add_subcommand("default", "write a default config without questions");
  config_default->add_option("--config_file,--config-file", default_file, "where to write");
  config_default->add_option("--mixed_precision,--mixed-precision", default_precision,
                             "no, fp16 or bf16");
  config_default->add_flag("--force", force, "overwrite an existing file");

  LaunchArgs launch_args;
  auto* launch = app.add_subcommand(
      "launch", "start the workers of PROGRAM on this machine and supervise them");
  add_launch_flags(launch, launch_args);
  // Everything from the first unknown word on (PROGRAM and its own flags) is left for the worker.
  launch->prefix_command();
  launch->footer(
      "Usage: accel-run launch [flags] PROGRAM [ARGS...]   (use -- before PROGRAM if it starts "
      "with -)");

  LaunchArgs test_args;
  auto* test = app.add_subcommand(
      "test", "run the distributed self test (accel-selftest) through the launch path");
  add_launch_flags(test, test_args);

  auto* token = app.add_subcommand("token",
                                   "print a fresh random rendezvous token; export it as "
                                   "ACCEL_RENDEZVOUS_TOKEN on every machine of a job");

  std::string env_file;
  auto* env =
      app.add_subcommand("env", "print versions, devices, libraries and the config in effect");
  env->add_option("--config_file,--config-file", env_file, "config file to show");

  // Everything after the word is accel-estimate-memory's (its own --help included).
  app.add_subcommand("estimate-memory",
                     "memory per rank of training a model (a safetensors file or index, or a "
                     "built-in config) for each dtype and strategy; see estimate-memory --help")
      ->allow_extras()
      ->prefix_command();
  app.add_subcommand("merge-weights",
                     "an accel checkpoint (any mesh) as one safetensors file or a sharded set "
                     "with an index; --split: one file as shards; see merge-weights --help")
      ->allow_extras()
      ->prefix_command();
  if (argc > 1 && std::string(argv[1]) == "estimate-memory")
    return run_tool(argc, argv, "estimate-memory", accel::env::kEstimateMemory,
                    "accel-estimate-memory");
  if (argc > 1 && std::string(argv[1]) == "merge-weights")
    return run_tool(argc, argv, "merge-weights", accel::env::kMergeWeights, "accel-merge-weights");

  std::vector<std::string> after_separator;
  try {
    if (argc > 1 && std::string(argv[1]) == "launch") {
      if (int sep = launch_separator(launch, argc, argv); sep > 0) {
        after_separator.assign(argv + sep + 1, argv + argc);
        argc = sep;
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*config_default)
      return run_config_default(default_file.empty() ? config_file : default_file,
                                default_precision, force);
    if (*config) return run_config(config_file);
    if (*launch) {
      std::vector<std::string> prog = launch->remaining();
      prog.insert(prog.end(), after_separator.begin(), after_separator.end());
      if (prog.empty()) {
        std::cerr << "accel-run launch: missing PROGRAM\n" << launch->help();
        return 2;
      }
      apply_setting_flags(launch_args);
      return run_launch(launch_args, prog, /*selftest=*/false);
    }
    if (*test) {
      apply_setting_flags(test_args);
      return run_selftest(test_args);
    }
    if (*token) {
      std::cout << al::new_rendezvous_token() << "\n";
      return 0;
    }
    if (*env) {
      const al::EnvMap e = al::current_environment();
      std::string path;
      try {
        path = config_path_for(env_file, e);
      } catch (const accel::Error& err) {
        path = std::string("(none: ") + err.what() + ")";
      }
      al::print_env_report(std::cout, path, !env_file.empty(), e);
      return 0;
    }
  } catch (const accel::Error& e) {
    std::cerr << "accel-run: error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}

}  // namespace

// Note [no abort]: every failure leaves accel-run with a message and exit code 1, never an
// uncaught exception (std::terminate, exit 134 and a core file). accel::Error is handled in
// run_main; this catches the rest (std::filesystem_error from a path the kernel rejects,
// std::bad_alloc, YAML or JSON exceptions that slipped through).
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "accel-run: error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "accel-run: error: unknown exception\n";
  }
  return 1;
}
