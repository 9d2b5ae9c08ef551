// Starts the local workers of a LaunchPlan and watches them until they all succeed, one fails,
// or accel-run is signalled. See docs/launcher.md "Supervision" for the exact semantics.
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <vector>

#include "launcher/output.h"
#include "launcher/plan.h"

namespace accel::launcher {

struct SuperviseOptions {
  std::vector<std::string> argv;  // program and its arguments; argv[0] is looked up in PATH
  double grace_period_s = 5.0;    // SIGTERM -> SIGKILL delay during teardown
  bool rank_prefix = true;        // "[rank3]: " before every output line
  bool quiet = false;             // no informational lines (failure reports are always printed)
  size_t tail_lines = 10;         // stderr lines kept per worker for the failure report
  std::string log_prefix = "accel-run";
  // A worker stopped (SIGSTOP, SIGTSTP, ...) for this long counts as failed; 0: never.
  double stopped_timeout_s = 30.0;
  // Forwarded to every running worker without stopping the job (SIGINT/SIGTERM/SIGHUP/SIGQUIT are
  // always forwarded and stop it). Must not hold SIGKILL, SIGSTOP, SIGCHLD or a fault signal.
  std::vector<int> forward_signals = {SIGUSR1, SIGUSR2};
  // DIR/attempt_<n>/rank_<r>/{stdout.log,stderr.log,error.json}; empty: no log files and the error
  // files go to a temporary directory (kept only when a failure summary names them).
  std::string log_dir;
  // With log_dir: which worker streams are also printed on the console (kTee* bits).
  int tee = 0;
  size_t console_capacity =
      ConsoleSink::kDefaultCapacity;  // bytes queued per console stream before output is dropped
  // The elastic agent's hooks (launcher/elastic_agent.cc). should_stop is asked once per loop
  // (at least every monitor_interval); when it says true the workers are stopped (SIGTERM, SIGKILL
  // after the grace period), nothing counts as failed, and supervise returns kSuperviseStopped.
  std::function<bool()> should_stop;
  int restart_offset = 0;       // ACCEL_RESTART_COUNT and attempt_<n> of the first attempt
  bool local_restarts = true;   // false: no restart here (the elastic rounds restart instead)
  bool* interrupted = nullptr;  // set when accel-run itself was signalled (SIGINT, ...)
};

// supervise's result when should_stop asked it to stop the workers.
constexpr int kSuperviseStopped = -1;

constexpr int kTeeStdout = 1;
constexpr int kTeeStderr = 2;

// Parses --tee: 0-3 (torchrun's numbers) or none, stdout/out, stderr/err, all/both.
// Throws ConfigError otherwise.
int parse_tee(const std::string& v);

// Parses --forward_signals: comma-separated names or numbers (SIGUSR1, usr1, 10), or "none".
// Throws ConfigError for unknown signals and for those that cannot be forwarded.
std::vector<int> parse_forward_signals(const std::string& v);

// Runs the group (restarting it up to plan.config.max_restarts times after a failure) and returns
// the exit code for accel-run: 0 when every worker exited 0; the first failing worker's exit code
// (128 + signal number when it was killed by a signal, 128 + stop signal when it stayed stopped
// past stopped_timeout_s); 128 + signal when accel-run itself was interrupted; 127 when the
// program could not be executed.
//
// Uses process-wide state while it runs: blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP/SIGQUIT and the
// forwarded signals and reads them from a signalfd, ignores SIGPIPE, makes this process a child
// subreaper so that processes the workers leave behind are reparented here and killed, and forks
// a watchdog (launcher/watchdog.h) that cleans up if this process is killed.
int supervise(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts);

}  // namespace accel::launcher
