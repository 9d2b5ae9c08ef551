// The launch watchdog: a small process that outlives a SIGKILLed accel-run long enough to kill
// everything the launch started. See Note [watchdog].
#pragma once

#include <sys/types.h>

#include <set>
#include <string>

namespace accel::launcher {

// Note [watchdog]: PR_SET_PDEATHSIG kills the workers when accel-run dies, but not their children:
// those are reparented to init (accel-run, their subreaper, is gone) and would run on. So accel-run
// forks a watchdog before the first worker. It sits in its own process group, ignores every
// catchable signal and blocks reading a pipe whose only write end accel-run holds; accel-run sends
// it the process group of every worker it starts. When the pipe reaches end of file (accel-run
// exited, normally or by SIGKILL), the watchdog sweeps: SIGKILL to every worker process group, and
// to every process whose environment holds the launch marker ACCEL_LAUNCH_ID=<random id> (set in
// every worker's environment and inherited by what it starts, so it also finds a grandchild that
// called setsid() or left the group), repeated until a pass finds none; then it removes the
// launch's temporary directory (if any) and exits. accel-run waits for it at a normal exit.

// Kills (SIGKILL) the process groups `groups` and every live process whose environment contains
// the entry `marker` ("KEY=VALUE"), repeating the environment scan until one finds no such process
// or `max_seconds` pass. Never kills the calling process. Returns the number of processes killed
// by the scan (groups not counted).
int sweep_launch(const std::set<pid_t>& groups, const std::string& marker, double max_seconds);

class Watchdog {
 public:
  // Forks the watchdog. `marker`: the environment entry of the launch; `temp_dir`: removed by the
  // watchdog after a sweep unless keep_temp_dir() was called (empty: none).
  Watchdog(std::string marker, std::string temp_dir);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // The watchdog exited (accel-run reaped it: its waitpid(-1) also sees this child).
  void exited() { pid_ = -1; }

  void watch_group(pid_t pgid);
  void forget_groups();  // the groups of a finished attempt are gone (their ids may be reused)
  void keep_temp_dir();  // the failure summary names files in it
  // Closes the pipe (the watchdog sweeps and exits) and waits for it at most `seconds`.
  void finish(double seconds);

 private:
  void send(const std::string& msg);

  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace accel::launcher
