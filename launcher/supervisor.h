// Starts the local workers of a LaunchPlan and watches them until they all succeed, one fails,
// or accel-run is signalled. See docs/launcher.md "Supervision" for the exact semantics.
#pragma once

#include <string>
#include <vector>

#include "launcher/plan.h"

namespace accel::launcher {

struct SuperviseOptions {
  std::vector<std::string> argv;  // program and its arguments; argv[0] is looked up in PATH
  double grace_period_s = 5.0;    // SIGTERM -> SIGKILL delay during teardown
  bool rank_prefix = true;        // "[rank3]: " before every output line
  bool quiet = false;             // no informational lines (failure reports are always printed)
  size_t tail_lines = 10;         // stderr lines kept per worker for the failure report
  std::string log_prefix = "accel-run";
};

// Runs the group (restarting it up to plan.config.max_restarts times after a failure) and returns
// the exit code for accel-run: 0 when every worker exited 0; the first failing worker's exit code
// (128 + signal number when it was killed by a signal); 128 + signal when accel-run itself was
// interrupted; 127 when the program could not be executed.
//
// Uses process-wide state while it runs: blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP/SIGQUIT and reads
// them from a signalfd, ignores SIGPIPE, and makes this process a child subreaper so that
// processes the workers leave behind are reparented here and killed.
int supervise(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts);

}  // namespace accel::launcher
