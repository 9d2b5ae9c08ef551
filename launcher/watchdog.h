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

// Note [job cgroup]: where cgroup v2 is mounted and our own cgroup is writable (root, a systemd
// user session with delegation; not a SLURM step), accel-run creates a child cgroup
// `accel-run-<id>` of its own cgroup, and every worker moves itself into it before exec. No
// process can leave a cgroup by itself, so killing the cgroup (cgroup.kill, or SIGKILL to each
// member of cgroup.procs on kernels before 5.14) reaches everything the launch started, even a
// daemon that called setsid() and cleared its environment. The launch marker remains the fallback
// where no cgroup can be created. ACCEL_RUN_CGROUP=0 turns the cgroup off.

// Creates the job cgroup `name` below this process's cgroup v2 cgroup. Returns its directory, or
// "" (with the reason in *why_not) when there is no cgroup v2 or it is not writable.
std::string create_job_cgroup(const std::string& name, std::string* why_not);
// SIGKILLs every process in the cgroup `dir` and waits (at most `max_seconds`) until it is empty.
// Returns true when it is empty.
bool kill_cgroup(const std::string& dir, double max_seconds);
// kill_cgroup, then removes the directory.
void remove_cgroup(const std::string& dir, double max_seconds);

class Watchdog {
 public:
  // Forks the watchdog. `marker`: the environment entry of the launch; `temp_dir`: removed by the
  // watchdog after a sweep unless keep_temp_dir() was called (empty: none); `cgroup`: the job
  // cgroup, killed and removed by the watchdog (empty: none).
  Watchdog(std::string marker, std::string temp_dir, std::string cgroup = "");
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
