// The Supervisor's processes: spawning a worker in its own process group and the job cgroup,
// forwarding signals, reaping, stopped workers, teardown (SIGTERM, then SIGKILL) and the sweep of
// what the workers left behind.
#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "launcher/supervisor_impl.h"

namespace accel::launcher::supervisor_detail {
namespace {

// Bound of each cleanup step after the workers of an attempt are gone.
constexpr double kLeftoverSeconds = 0.5;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Children of this process according to /proc (after the workers are gone these are processes
// the workers left behind and that were reparented to us as subreaper).
std::vector<pid_t> list_children() {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    auto pid = parse_int(e->d_name);
    if (!pid || *pid <= 0) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string stat;
    if (!std::getline(f, stat)) continue;
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self) out.push_back(static_cast<pid_t>(*pid));
  }
  closedir(d);
  return out;
}

}  // namespace

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exit code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    std::string s =
        "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + signal_name(WTERMSIG(st)) + ")";
    if (WCOREDUMP(st)) s += ", core dumped";
    return s;
  }
  return "status " + std::to_string(st);
}

int exit_code_of(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

bool succeeded(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

void Supervisor::spawn(Worker& w, const std::vector<std::string>& env, std::string* error) {
  int out[2], err[2], ex[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(ex, O_CLOEXEC) != 0) {
    *error = std::string("cannot create pipes for rank ") + std::to_string(w.rank) + ": " +
             std::strerror(errno);
    return;
  }
  std::vector<char*> argv, envp;
  for (const auto& a : opts_.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    *error =
        std::string("fork failed for rank ") + std::to_string(w.rank) + ": " + std::strerror(errno);
    for (int fd : {out[0], out[1], err[0], err[1], ex[0], ex[1]}) close(fd);
    return;
  }
  if (pid == 0) {
    // Own process group: teardown signals reach the worker and everything it starts, and a
    // Ctrl-C at the terminal reaches only accel-run, which forwards it once.
    setpgid(0, 0);
    if (cgroup_procs_fd_ >= 0) {
      // Note [job cgroup]: join it before exec, so that nothing the program starts is outside.
      const std::string self = std::to_string(getpid());
      ssize_t moved = write(cgroup_procs_fd_, self.data(), self.size());
      (void)moved;  // not fatal: the process group, the marker and the subreaper still apply
    }
    // Note [no orphans]: if accel-run dies without cleaning up (SIGKILL), the kernel kills the
    // workers and the watchdog (Note [watchdog]) kills what they started.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGPIPE, &dfl, nullptr);
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    ssize_t ignored = write(ex[1], &e, sizeof(e));
    (void)ignored;
    _exit(127);
  }
  setpgid(pid, pid);  // also from here, so kill(-pid) works before the child gets to run
  if (watchdog_) watchdog_->watch_group(pid);
  close(out[1]);
  close(err[1]);
  close(ex[1]);
  w.pid = pid;
  w.running = true;
  w.out.fd = out[0];
  w.err.fd = err[0];
  w.err.is_err = true;
  fcntl(w.out.fd, F_SETFL, O_NONBLOCK);
  fcntl(w.err.fd, F_SETFL, O_NONBLOCK);
  int child_errno = 0;
  ssize_t got;
  do {
    got = read(ex[0], &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  close(ex[0]);
  if (got == static_cast<ssize_t>(sizeof(child_errno))) {
    *error = "cannot execute '" + opts_.argv[0] + "' for rank " + std::to_string(w.rank) + ": " +
             std::strerror(child_errno);
  }
}

bool Supervisor::forward_only(int sig) const {
  return std::find(opts_.forward_signals.begin(), opts_.forward_signals.end(), sig) !=
             opts_.forward_signals.end() &&
         std::find(std::begin(kTerminatingSignals), std::end(kTerminatingSignals), sig) ==
             std::end(kTerminatingSignals);
}

void Supervisor::handle_signals() {
  signalfd_siginfo si;
  while (read(sfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
    const int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs every loop iteration
    if (forward_only(sig)) {
      // Note [forwarded signals]: only to the worker processes themselves, not their groups: a
      // helper process the worker started (a data loader, `sleep`) would die of SIGUSR1's
      // default action. The job goes on; the program decides what the signal means.
      int sent = 0;
      for (const Worker& w : workers_) {
        if (w.running && kill(w.pid, sig) == 0) ++sent;
      }
      info("received " + signal_name(sig) + ": forwarded it to " + std::to_string(sent) +
           " worker(s)");
      continue;
    }
    if (interrupt_signal_ != 0) {
      log("second signal (" + signal_name(sig) + "): killing all workers now");
      escalate();
      continue;
    }
    interrupt_signal_ = sig;
    log("received " + signal_name(sig) + ": forwarding it to all workers (SIGKILL after " +
        format_seconds(opts_.grace_period_s) + ")");
    begin_teardown(sig);
  }
}

int Supervisor::running_count() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

void Supervisor::reap() {
  while (true) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid <= 0) break;
    if (watchdog_ && pid == watchdog_->pid()) {
      if (WIFEXITED(st) || WIFSIGNALED(st)) {
        watchdog_->exited();
        log("warning: the watchdog (pid " + std::to_string(pid) + ") ended (" +
            describe_status(st) + "); a SIGKILL of accel-run may now leave processes behind");
      }
      continue;
    }
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [pid](const Worker& w) { return w.running && w.pid == pid; });
    if (it == workers_.end()) continue;  // a reparented leftover process
    Worker& w = *it;
    if (WIFSTOPPED(st)) {
      if (!w.stopped_since) {
        w.stopped_since = Clock::now();
        w.stop_signal = WSTOPSIG(st);
        std::string then = opts_.stopped_timeout_s > 0
                               ? "; it counts as failed unless continued within " +
                                     format_seconds(opts_.stopped_timeout_s)
                               : "";
        log("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
            ") was stopped by " + signal_name(w.stop_signal) + then);
      }
      continue;
    }
    // A worker that exits right after being continued may be reaped before the continue is: an
    // exit (not a kill) also means it ran again.
    if (WIFCONTINUED(st) || WIFEXITED(st)) {
      if (w.stopped_since && !w.killed_for_stop) {
        log("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
            ") continued after " + format_seconds(seconds_since(*w.stopped_since)) + " stopped");
      }
      w.stopped_since.reset();
      if (WIFCONTINUED(st)) continue;
    }
    w.running = false;
    w.status = st;
    w.stopped_since.reset();
    if (w.killed_for_stop) continue;  // recorded when it was killed
    if (!succeeded(st) && !first_failure_ && !tearing_down_) {
      record_failure(w, describe_status(st), exit_code_of(st));
      log("rank " + std::to_string(w.rank) + " failed (" + w.failure + ") after " +
          format_seconds(seconds_since(start_)) + "; stopping the other " +
          std::to_string(running_count()) + " worker(s) (SIGTERM, SIGKILL after " +
          format_seconds(opts_.grace_period_s) + ")");
      begin_teardown(SIGTERM);
    }
  }
}

std::optional<Clock::time_point> Supervisor::next_stop_deadline() const {
  std::optional<Clock::time_point> t;
  if (opts_.stopped_timeout_s <= 0) return t;
  const auto limit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opts_.stopped_timeout_s));
  for (const Worker& w : workers_) {
    if (w.running && w.stopped_since && !w.killed_for_stop) {
      const auto d = *w.stopped_since + limit;
      if (!t || d < *t) t = d;
    }
  }
  return t;
}

// A worker stopped for longer than --stopped_timeout is treated as failed: it holds its peers in
// their collectives and would hang the job.
void Supervisor::check_stopped() {
  if (opts_.stopped_timeout_s <= 0) return;
  for (Worker& w : workers_) {
    if (!w.running || !w.stopped_since || w.killed_for_stop) continue;
    const double stopped = seconds_since(*w.stopped_since);
    if (stopped < opts_.stopped_timeout_s) continue;
    w.killed_for_stop = true;
    kill(-w.pid, SIGKILL);  // a stopped process acts on nothing but SIGKILL
    kill(w.pid, SIGKILL);
    if (first_failure_ || tearing_down_) continue;
    record_failure(w,
                   "stopped by " + signal_name(w.stop_signal) + " for " + format_seconds(stopped) +
                       " (--stopped_timeout " + format_seconds(opts_.stopped_timeout_s) +
                       "), then killed",
                   128 + w.stop_signal);
    log("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
        ") is still stopped by " + signal_name(w.stop_signal) + " after " +
        format_seconds(stopped) + ": treating it as failed; killed it, stopping the other " +
        std::to_string(running_count() - 1) + " worker(s) (SIGTERM, SIGKILL after " +
        format_seconds(opts_.grace_period_s) + ")");
    begin_teardown(SIGTERM);
  }
}

// Sends `sig` to every worker's process group (also the groups of workers already gone: their
// children may still run) and arms the SIGKILL deadline.
void Supervisor::begin_teardown(int sig) {
  if (tearing_down_) {
    signal_groups(sig);
    return;
  }
  tearing_down_ = true;
  term_count_ = signal_groups(sig);
  kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(opts_.grace_period_s));
}

void Supervisor::escalate() {
  tearing_down_ = true;
  sigkill_sent_ = true;
  kill_count_ += signal_groups(SIGKILL);
}

// Returns the number of workers still running when signalled.
int Supervisor::signal_groups(int sig) {
  int running = 0;
  for (const Worker& w : workers_) {
    if (w.pid <= 0) continue;
    if (w.running && !w.killed_for_stop) ++running;
    kill(-w.pid, sig);
    // A stopped worker would hold `sig` pending until the SIGKILL; let it act on it now.
    if (w.running && w.stopped_since && sig != SIGKILL) kill(-w.pid, SIGCONT);
  }
  return running;
}

// All workers have been reaped: kill what is left in their groups, what was reparented to us,
// and anything else carrying this launch's marker, so that nothing the launch started outlives
// it.
void Supervisor::kill_leftovers() {
  std::set<pid_t> groups;
  for (const Worker& w : workers_) {
    if (w.pid > 0) groups.insert(w.pid);
  }
  if (!cgroup_.empty()) kill_cgroup(cgroup_, kLeftoverSeconds);
  sweep_launch(groups, launch_marker_, kLeftoverSeconds);
  const pid_t wd = watchdog_ ? watchdog_->pid() : -1;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(kLeftoverSeconds));
  while (Clock::now() < deadline) {
    auto kids = list_children();
    kids.erase(std::remove(kids.begin(), kids.end(), wd), kids.end());
    if (kids.empty()) break;
    for (pid_t k : kids) kill(k, SIGKILL);
    usleep(2000);
    for (pid_t k : kids) waitpid(k, nullptr, WNOHANG);
  }
}

}  // namespace accel::launcher::supervisor_detail
