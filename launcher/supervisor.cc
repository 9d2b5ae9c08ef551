#include "launcher/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/env_contract.h"
#include "core/file_io.h"
#include "launcher/output.h"
#include "launcher/watchdog.h"

namespace accel::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 64 * 1024;
// A line longer than this is emitted in pieces so one chatty worker cannot grow memory unbounded.
constexpr size_t kMaxLine = 64 * 1024;
// After the last worker is reaped, output still in flight (a grandchild holding the pipe) is read
// for at most this long.
constexpr double kDrainSeconds = 1.0;
// Signals that stop the job (forwarded, then teardown).
constexpr int kTerminatingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// At exit, output still queued for a console nobody reads is dropped after this long.
constexpr double kConsoleDrainSeconds = 1.0;
// The watchdog's final sweep after a normal end normally takes milliseconds.
constexpr double kWatchdogFinishSeconds = 2.0;
constexpr size_t kLaunchIdBytes = 16;
constexpr size_t kCgroupIdChars = 12;
// Bound of each cleanup step after the workers of an attempt are gone.
constexpr double kLeftoverSeconds = 0.5;
constexpr const char* kLaunchIdVar = env::kLaunchId;
constexpr const char* kErrorFileName = "error.json";
// Note [error files]: what accel-run reads of a worker's error file, how deep it parses it, and
// how much of an unparsed one it keeps in the report.
constexpr uint64_t kMaxErrorFileBytes = uint64_t(1) << 20;
constexpr int kMaxErrorFileDepth = 64;
constexpr size_t kMaxKeptErrorText = size_t(64) << 10;
// Words that make a stderr line the "first error line" of the failure summary.
constexpr const char* kErrorWords[] = {"error", "exception", "what()",   "fatal",
                                       "abort", "failed",    "terminate"};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Blocking write of a whole buffer to a regular (log) file; errors drop the rest.
void write_file_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string iso_time(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

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

struct Stream {
  int fd = -1;
  bool is_err = false;
  std::string partial;
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
  std::deque<std::string> tail;  // last stderr lines, unprefixed
  std::string prefix;
  std::string dir;           // DIR/attempt_<n>/rank_<r> (empty: no per-rank files)
  std::string error_file;    // TORCHELASTIC_ERROR_FILE / ACCEL_ERROR_FILE (empty: none)
  int log_fd[2] = {-1, -1};  // stdout.log, stderr.log
  // Stopped by a signal (waitpid WUNTRACED) and not continued since.
  std::optional<Clock::time_point> stopped_since;
  int stop_signal = 0;
  bool killed_for_stop = false;
  // Set when the worker is listed in the failure summary.
  bool failed = false;
  std::string failure;  // "exit code 7", "killed by signal 11 (SIGSEGV)", ...
  int exit_code = 0;    // accel-run's exit code if this is the first failure
  std::chrono::system_clock::time_point failed_at;
  std::string first_error;  // for the summary
};

class Supervisor {
 public:
  Supervisor(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts)
      : plan_(plan),
        base_env_(base_env),
        opts_(opts),
        out_(1, opts.console_capacity),
        err_(2, opts.console_capacity),
        host_(host_name()) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    std::vector<int> handled(std::begin(kTerminatingSignals), std::end(kTerminatingSignals));
    handled.insert(handled.end(), opts.forward_signals.begin(), opts.forward_signals.end());
    for (int s : handled) {
      // A signal ignored by our parent (nohup: SIGHUP) stays ignored; everything else is ours to
      // forward.
      struct sigaction old {};
      sigaction(s, nullptr, &old);
      if (old.sa_handler == SIG_IGN) continue;
      sigaddset(&mask, s);
    }
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);
    // SIGCHLD must not be SIG_IGN (children would be reaped by the kernel and their status lost).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &old_chld_);
    struct sigaction ign = dfl;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe_);
    sfd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    ACCEL_CHECK(sfd_ >= 0, DistError, "accel-run", "signalfd failed: ", std::strerror(errno));
    prctl(PR_SET_CHILD_SUBREAPER, 1);

    if (!opts.log_dir.empty()) {
      root_ = opts.log_dir;
    } else {
      const char* tmp = std::getenv("TMPDIR");
      std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/accel-run-XXXXXX";
      if (mkdtemp(tmpl.data()) != nullptr) {
        root_ = temp_root_ = tmpl;
      } else {
        log("warning: cannot create a temporary directory for the workers' error files (" + tmpl +
            ": " + std::strerror(errno) + "); TORCHELASTIC_ERROR_FILE is not set");
      }
    }
    const std::string id = random_hex(kLaunchIdBytes);
    launch_marker_ = std::string(kLaunchIdVar) + "=" + id;
    if (env_get(base_env_, env::kRunCgroup).value_or("1") != "0") {
      std::string why_not;
      cgroup_ = create_job_cgroup("accel-run-" + id.substr(0, kCgroupIdChars), &why_not);
      if (!cgroup_.empty()) {
        cgroup_procs_fd_ = open((cgroup_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
        if (cgroup_procs_fd_ < 0) {
          rmdir(cgroup_.c_str());
          cgroup_.clear();
        }
      }
    }
    watchdog_ = std::make_unique<Watchdog>(launch_marker_, temp_root_, cgroup_);
    if (!watchdog_->running())
      log("warning: cannot start the watchdog; a SIGKILL of accel-run may leave processes behind");
  }

  ~Supervisor() {
    for (Worker& w : workers_) close_logs(w);
    if (cgroup_procs_fd_ >= 0) close(cgroup_procs_fd_);
    if (watchdog_) watchdog_->finish(kWatchdogFinishSeconds);
    if (!cgroup_.empty() && access(cgroup_.c_str(), F_OK) == 0)
      remove_cgroup(cgroup_, kWatchdogFinishSeconds);
    if (!temp_root_.empty() && !keep_temp_) {
      std::error_code ec;
      std::filesystem::remove_all(temp_root_, ec);
    }
    drain_console();
    if (sfd_ >= 0) close(sfd_);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  int run() {
    const int max_restarts = plan_.config.max_restarts;
    for (int restart = 0;; ++restart) {
      Outcome o = run_attempt(restart);
      switch (o) {
        case Outcome::kSuccess:
          info("all " + std::to_string(workers_.size()) + " worker(s) exited successfully" +
               (restart > 0 ? " after " + std::to_string(restart) + " restart(s)" : ""));
          return 0;
        case Outcome::kSpawnError: return 127;
        case Outcome::kInterrupted:
          log("stopped all workers after " + signal_name(interrupt_signal_));
          return 128 + interrupt_signal_;
        case Outcome::kFailure: {
          const int code = workers_[*first_failure_].exit_code;
          if (restart < max_restarts) {
            log("restarting all " + std::to_string(workers_.size()) + " worker(s) (restart " +
                std::to_string(restart + 1) + " of " + std::to_string(max_restarts) + ")");
            continue;
          }
          if (max_restarts > 0)
            log("giving up after " + std::to_string(max_restarts) + " restart(s)");
          return code == 0 ? 1 : code;
        }
      }
    }
  }

 private:
  enum class Outcome { kSuccess, kFailure, kInterrupted, kSpawnError };

  void log(const std::string& line) { err_.write(opts_.log_prefix + ": " + line + "\n"); }
  void info(const std::string& line) {
    if (!opts_.quiet) log(line);
  }

  // Output queued for a console nobody reads is given up after kConsoleDrainSeconds; say so.
  void drain_console() {
    out_.drain(kConsoleDrainSeconds);
    if (out_.dropped_bytes() > 0) {
      log(std::to_string(out_.dropped_bytes()) +
          " bytes of stdout output were dropped (stdout was not being read)");
    }
    err_.drain(kConsoleDrainSeconds);
  }

  bool console_gets(bool is_err) const {
    return opts_.log_dir.empty() || (opts_.tee & (is_err ? kTeeStderr : kTeeStdout)) != 0;
  }

  // Creates DIR/attempt_<n>/rank_<r>, removes a stale error file, opens the log files.
  void prepare_files(Worker& w, int restart) {
    if (root_.empty()) return;
    w.dir = root_ + "/attempt_" + std::to_string(restart) + "/rank_" + std::to_string(w.rank);
    // The folder is created or checked one component at a time and every file in it is created
    // new, never opened through a link (Note [safe file access] in core/file_io.h).
    try {
      const file_io::Fd dir = file_io::open_dir(w.dir, /*create=*/true, "launch");
      // A file left by an earlier run would pass for this worker's report: its name goes,
      // whatever it is (a link is removed, not followed).
      file_io::remove_tree(dir.get(), kErrorFileName, w.dir + "/" + kErrorFileName, "launch");
    } catch (const IoError& e) {
      ACCEL_THROW(IoError, "launch", "cannot create the directory '", w.dir, "' for rank ", w.rank,
                  "'s log and error files: ", e.what());
    }
    w.error_file = w.dir + "/" + kErrorFileName;
    if (opts_.log_dir.empty()) return;
    const char* names[2] = {"stdout.log", "stderr.log"};
    for (int i = 0; i < 2; ++i) {
      w.log_fd[i] =
          file_io::create_file(w.dir + "/" + names[i], "launch", file_io::CreateMode::kReplace)
              .release();
    }
  }

  void close_logs(Worker& w) {
    for (int& fd : w.log_fd) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }

  Outcome run_attempt(int restart) {
    for (Worker& w : workers_) close_logs(w);
    workers_.clear();
    first_failure_.reset();
    failures_.clear();
    kill_deadline_.reset();
    sigkill_sent_ = false;
    tearing_down_ = false;
    term_count_ = kill_count_ = 0;
    if (plan_.port_auto) plan_.master_port = pick_free_port(plan_.master_addr);

    const int n = plan_.num_local_workers;
    workers_.resize(n);
    for (int i = 0; i < n; ++i) {
      Worker& w = workers_[i];
      w.rank = plan_.first_rank + i;
      w.local_rank = plan_.first_local_rank + i;
      w.prefix = opts_.rank_prefix ? "[rank" + std::to_string(w.rank) + "]: " : "";
      prepare_files(w, restart);
    }
    const std::string ranks = n == 1 ? "rank " + std::to_string(plan_.first_rank)
                                     : "ranks " + std::to_string(plan_.first_rank) + "-" +
                                           std::to_string(plan_.first_rank + n - 1);
    info("starting " + std::to_string(n) + " worker(s): " + ranks + " of " +
         std::to_string(plan_.world_size) + " on machine " + std::to_string(plan_.machine_rank) +
         " of " + std::to_string(plan_.num_machines) + ", MASTER_ADDR=" + plan_.master_addr +
         " MASTER_PORT=" + std::to_string(plan_.master_port) +
         (restart > 0 ? ", ACCEL_RESTART_COUNT=" + std::to_string(restart) : ""));
    if (!opts_.log_dir.empty())
      info("worker output goes to " + root_ + "/attempt_" + std::to_string(restart) + "/rank_<r>/");
    start_ = Clock::now();
    std::string spawn_error;
    for (int i = 0; i < n && spawn_error.empty(); ++i) {
      Worker& w = workers_[i];
      EnvMap vars = worker_env(plan_, i, restart);
      vars[kLaunchIdVar] = launch_marker_.substr(launch_marker_.find('=') + 1);
      if (!w.error_file.empty())
        vars[env::kTorchElasticErrorFile] = vars[env::kErrorFile] = w.error_file;
      spawn(w, make_environ(base_env_, vars), &spawn_error);
    }
    if (!spawn_error.empty()) {
      log(spawn_error);
      begin_teardown(SIGTERM);
    }

    std::optional<Clock::time_point> drain_deadline;
    bool cleaned_up = false;
    while (true) {
      reap();
      check_stopped();
      if (kill_deadline_ && !sigkill_sent_ && Clock::now() >= *kill_deadline_) escalate();
      if (std::none_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.running; })) {
        if (!cleaned_up) {
          cleaned_up = true;
          kill_leftovers();
          drain_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(kDrainSeconds));
        }
        bool open = std::any_of(workers_.begin(), workers_.end(),
                                [](const Worker& w) { return w.out.fd >= 0 || w.err.fd >= 0; });
        if (!open || Clock::now() >= *drain_deadline) break;
      }

      std::vector<pollfd> fds;
      std::vector<Stream*> streams;
      fds.push_back({sfd_, POLLIN, 0});
      for (Worker& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      const size_t console_at = fds.size();
      for (ConsoleSink* c : {&out_, &err_})
        fds.push_back({c->poll_fd(), POLLOUT, 0});  // -1: ignored by poll
      double wait_s = plan_.config.monitor_interval;
      auto until = [&](Clock::time_point t) {
        wait_s = std::min(wait_s, std::chrono::duration<double>(t - Clock::now()).count());
      };
      if (kill_deadline_ && !sigkill_sent_) until(*kill_deadline_);
      if (drain_deadline) until(*drain_deadline);
      if (auto t = next_stop_deadline()) until(*t);
      int timeout_ms = std::max(0, static_cast<int>(wait_s * 1000.0 + 0.999));
      int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0 && errno != EINTR) {
        log(std::string("poll failed: ") + std::strerror(errno) + "; killing the workers");
        escalate();
      }
      if (rc <= 0) continue;
      if (fds[0].revents & POLLIN) handle_signals();
      for (size_t i = 1; i < console_at; ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump(*streams[i - 1]);
      }
      out_.flush();
      err_.flush();
    }
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) close_stream(w, *s);
      close_logs(w);
    }
    if (watchdog_) watchdog_->forget_groups();

    if (!spawn_error.empty()) return Outcome::kSpawnError;
    if (first_failure_) {
      report_failure();
      collect_self_reported_failures();
      write_error_files();
      print_summary();
    }
    if (interrupt_signal_ != 0) return Outcome::kInterrupted;
    if (first_failure_) return Outcome::kFailure;
    return Outcome::kSuccess;
  }

  void spawn(Worker& w, const std::vector<std::string>& env, std::string* error) {
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
      *error = std::string("fork failed for rank ") + std::to_string(w.rank) + ": " +
               std::strerror(errno);
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

  bool forward_only(int sig) const {
    return std::find(opts_.forward_signals.begin(), opts_.forward_signals.end(), sig) !=
               opts_.forward_signals.end() &&
           std::find(std::begin(kTerminatingSignals), std::end(kTerminatingSignals), sig) ==
               std::end(kTerminatingSignals);
  }

  void handle_signals() {
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

  void record_failure(Worker& w, std::string what, int exit_code) {
    w.failed = true;
    w.failure = std::move(what);
    w.exit_code = exit_code;
    w.failed_at = std::chrono::system_clock::now();
    const size_t idx = static_cast<size_t>(&w - workers_.data());
    failures_.push_back(idx);
    if (!first_failure_) first_failure_ = idx;
  }

  int running_count() const {
    return static_cast<int>(
        std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
  }

  void reap() {
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

  std::optional<Clock::time_point> next_stop_deadline() const {
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
  void check_stopped() {
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
                     "stopped by " + signal_name(w.stop_signal) + " for " +
                         format_seconds(stopped) + " (--stopped_timeout " +
                         format_seconds(opts_.stopped_timeout_s) + "), then killed",
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
  void begin_teardown(int sig) {
    if (tearing_down_) {
      signal_groups(sig);
      return;
    }
    tearing_down_ = true;
    term_count_ = signal_groups(sig);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(opts_.grace_period_s));
  }

  void escalate() {
    tearing_down_ = true;
    sigkill_sent_ = true;
    kill_count_ += signal_groups(SIGKILL);
  }

  // Returns the number of workers still running when signalled.
  int signal_groups(int sig) {
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
  void kill_leftovers() {
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

  void pump(Stream& s) {
    Worker& w = owner(s);
    char buf[kReadChunk];
    while (s.fd >= 0) {
      ssize_t n = read(s.fd, buf, sizeof(buf));
      if (n > 0) {
        if (int fd = w.log_fd[s.is_err ? 1 : 0]; fd >= 0)
          write_file_all(fd, buf, static_cast<size_t>(n));
        s.partial.append(buf, static_cast<size_t>(n));
        size_t start = 0;
        while (true) {
          size_t nl = s.partial.find('\n', start);
          if (nl == std::string::npos) break;
          emit(w, s.is_err, std::string_view(s.partial).substr(start, nl - start));
          start = nl + 1;
        }
        s.partial.erase(0, start);
        while (s.partial.size() >= kMaxLine) {
          emit(w, s.is_err, std::string_view(s.partial).substr(0, kMaxLine));
          s.partial.erase(0, kMaxLine);
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      close_stream(w, s);  // EOF or error
    }
  }

  void close_stream(Worker& w, Stream& s) {
    if (s.fd < 0) return;
    if (!s.partial.empty()) {
      emit(w, s.is_err, s.partial);
      s.partial.clear();
    }
    close(s.fd);
    s.fd = -1;
  }

  Worker& owner(Stream& s) {
    for (Worker& w : workers_) {
      if (&w.out == &s || &w.err == &s) return w;
    }
    ACCEL_INTERNAL_ASSERT(false);
    return workers_.front();
  }

  void emit(Worker& w, bool is_err, std::string_view line) {
    if (console_gets(is_err)) {
      std::string text;
      text.reserve(w.prefix.size() + line.size() + 1);
      text.append(w.prefix).append(line).push_back('\n');
      (is_err ? err_ : out_).write(text);
    }
    if (is_err && opts_.tail_lines > 0) {
      w.tail.emplace_back(line);
      if (w.tail.size() > opts_.tail_lines) w.tail.pop_front();
    }
  }

  void report_failure() {
    const Worker& w = workers_[*first_failure_];
    log("first failing worker: rank " + std::to_string(w.rank) + " (local_rank " +
        std::to_string(w.local_rank) + ", machine " + std::to_string(plan_.machine_rank) +
        ", pid " + std::to_string(w.pid) + "): " + w.failure);
    if (w.tail.empty()) {
      log("rank " + std::to_string(w.rank) + " wrote nothing to stderr");
    } else {
      log("last " + std::to_string(w.tail.size()) + " stderr line(s) of rank " +
          std::to_string(w.rank) + ":");
      for (const auto& l : w.tail) log("  | " + l);
    }
    const int others = static_cast<int>(workers_.size()) - 1;
    if (others > 0) {
      log("the other " + std::to_string(others) + " worker(s): " + std::to_string(term_count_) +
          " were running at the failure and got SIGTERM, " + std::to_string(kill_count_) +
          " needed SIGKILL after the " + format_seconds(opts_.grace_period_s) + " grace period");
    }
  }

  // Besides the root cause, a worker that failed and wrote its error file itself reported an
  // error of its own (for example a peer timeout raised by the library): it is listed too.
  void collect_self_reported_failures() {
    for (Worker& w : workers_) {
      if (w.failed || w.running || w.pid <= 0 || succeeded(w.status) || w.error_file.empty())
        continue;
      struct stat st {};
      if (lstat(w.error_file.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size > 0))
        record_failure(w, describe_status(w.status), exit_code_of(w.status));
    }
  }

  // The first line of a worker's own error report, else the first stderr line that looks like an
  // error, else its last stderr line.
  static std::string first_error_line(const Worker& w, const nlohmann::json& report,
                                      bool by_worker) {
    if (by_worker) {
      const nlohmann::json* m = report.contains("message") ? &report["message"] : nullptr;
      if (m && m->is_object() && m->contains("message")) m = &(*m)["message"];
      if (m && m->is_string() && !m->get<std::string>().empty())
        return first_line(m->get<std::string>());
    }
    for (const auto& l : w.tail) {
      const std::string low = to_lower(l);
      for (const char* word : kErrorWords) {
        if (low.find(word) != std::string::npos) return l;
      }
    }
    return w.tail.empty() ? "(nothing on stderr)" : w.tail.back();
  }

  // Note [error files]: each worker's TORCHELASTIC_ERROR_FILE / ACCEL_ERROR_FILE. A program may
  // write its own JSON report there (torchelastic's record() format: {"message": {"message": ...,
  // "extraInfo": {...}}}); its keys are kept and what is missing is added. For a worker that wrote
  // nothing accel-run writes the whole report: what it knows about the process and the last
  // stderr lines as the "traceback".
  // What a worker wrote is untrusted input (read_worker_report): at most kMaxErrorFileBytes of a
  // regular file that is not a link (a FIFO, a device or a link is described, not read: Note
  // [safe file access]), parsed only when it nests at most kMaxErrorFileDepth deep (100,000 nested
  // arrays made accel-run's re-indenting dump() use 7.9 GB and overflow the stack). Otherwise its
  // text, cut to kMaxKeptErrorText, is kept as "worker_content" with "worker_content_note" saying
  // why; the worker's exit status is reported either way.
  static nlohmann::json read_worker_report(const std::string& path, bool& by_worker) {
    nlohmann::json j = nlohmann::json::object();
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return j;  // nothing written
    std::string text;
    bool cut = false;
    try {
      file_io::ReadableFile f =
          file_io::open_read(path, "error file", file_io::kNoSizeCap, file_io::Links::kRefuse);
      cut = f.size > kMaxErrorFileBytes;
      text.resize(size_t(std::min<uint64_t>(f.size, kMaxErrorFileBytes)));
      if (!file_io::pread_all(f.fd.get(), text.data(), text.size(), 0)) text.clear();
    } catch (const IoError& e) {
      by_worker = true;
      j["worker_content_note"] = std::string("not read: ") + e.what();
      return j;
    }
    if (trim(text).empty()) return j;
    by_worker = true;
    std::string note;
    if (cut) {
      note = "not parsed: the file is larger than " + std::to_string(kMaxErrorFileBytes) + " bytes";
    } else {
      struct TooDeep {};
      try {
        nlohmann::json parsed = nlohmann::json::parse(
            text,
            [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
              if (depth > kMaxErrorFileDepth) throw TooDeep{};
              return true;
            },
            /*allow_exceptions=*/false);
        if (parsed.is_object()) return parsed;
      } catch (const TooDeep&) {
        note = "not parsed: JSON nested more than " + std::to_string(kMaxErrorFileDepth) +
               " levels deep";
      }
    }
    // Not a JSON object (or not parsed): kept verbatim, up to a bound.
    if (text.size() > kMaxKeptErrorText) {
      text.resize(kMaxKeptErrorText);
      note += std::string(note.empty() ? "" : "; ") + "cut to its first " +
              std::to_string(kMaxKeptErrorText) + " bytes";
    }
    j["worker_content"] = text;
    if (!note.empty()) j["worker_content_note"] = note;
    return j;
  }

  void write_error_files() {
    for (size_t idx : failures_) {
      Worker& w = workers_[idx];
      if (w.error_file.empty()) continue;
      bool by_worker = false;
      nlohmann::json j = read_worker_report(w.error_file, by_worker);
      std::string traceback;
      for (const auto& l : w.tail) traceback += l + "\n";
      const long long unix_s =
          std::chrono::duration_cast<std::chrono::seconds>(w.failed_at.time_since_epoch()).count();
      w.first_error = first_error_line(w, j, by_worker);
      auto put = [&j](const char* key, nlohmann::json v) {
        if (!j.contains(key)) j[key] = std::move(v);
      };
      if (!j.contains("message")) {
        j["message"] = {
            {"message", w.first_error},
            {"extraInfo", {{"py_callstack", traceback}, {"timestamp", std::to_string(unix_s)}}}};
      }
      put("rank", w.rank);
      put("local_rank", w.local_rank);
      put("host", host_);
      put("pid", w.pid);
      const bool signalled = !w.killed_for_stop && WIFSIGNALED(w.status);
      put("exitcode", !w.killed_for_stop && WIFEXITED(w.status)
                          ? nlohmann::json(WEXITSTATUS(w.status))
                          : nlohmann::json());
      put("signal", signalled           ? nlohmann::json(signal_name(WTERMSIG(w.status)))
                    : w.killed_for_stop ? nlohmann::json(signal_name(w.stop_signal))
                                        : nlohmann::json());
      put("failure", w.failure);
      put("traceback", traceback);
      put("timestamp", unix_s);
      put("time", iso_time(w.failed_at));
      put("written_by", by_worker ? "worker, completed by accel-run" : "accel-run");
      try {
        // Worker output need not be UTF-8; dump() would throw on it (type_error 316). The report
        // replaces the file through a unique temporary (Note [safe file access]).
        file_io::write_file_atomic(
            w.error_file, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
            "error file", /*durable=*/false);
      } catch (const IoError& e) {
        log(std::string("warning: cannot write the error file: ") + e.what());
      }
    }
    if (!temp_root_.empty() && !keep_temp_) {
      keep_temp_ = true;  // the summary names files in it
      if (watchdog_) watchdog_->keep_temp_dir();
    }
  }

  // One row per failed rank, root cause first (as torchelastic's ChildFailedError report).
  void print_summary() {
    const std::string rule(72, '=');
    log(rule);
    log("failure summary: " + std::to_string(failures_.size()) + " failed rank(s) on " + host_ +
        ", root cause first");
    for (size_t idx : failures_) {
      const Worker& w = workers_[idx];
      log("  rank " + std::to_string(w.rank) + " (local_rank " + std::to_string(w.local_rank) +
          ") | host " + host_ + " | " + w.failure + " | " + iso_time(w.failed_at) +
          " | error file: " + (w.error_file.empty() ? std::string("(none)") : w.error_file) +
          " | first error: " +
          (w.first_error.empty() ? first_error_line(w, nlohmann::json(), false) : w.first_error));
    }
    log(rule);
  }

  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
    return buf;
  }

  LaunchPlan& plan_;
  const EnvMap& base_env_;
  const SuperviseOptions& opts_;
  ConsoleSink out_, err_;
  std::string host_;
  std::string root_;       // log_dir, or temp_root_
  std::string temp_root_;  // our temporary directory for error files (empty: none)
  bool keep_temp_ = false;
  std::string launch_marker_;  // "ACCEL_LAUNCH_ID=<hex>"
  std::unique_ptr<Watchdog> watchdog_;
  std::string cgroup_;  // the job cgroup (empty: none), Note [job cgroup]
  int cgroup_procs_fd_ = -1;
  sigset_t old_mask_{};
  struct sigaction old_chld_ {
  }, old_pipe_{};
  int sfd_ = -1;
  std::vector<Worker> workers_;
  Clock::time_point start_;
  std::optional<size_t> first_failure_;
  std::vector<size_t> failures_;
  std::optional<Clock::time_point> kill_deadline_;
  int interrupt_signal_ = 0;
  bool sigkill_sent_ = false;
  bool tearing_down_ = false;
  int term_count_ = 0;
  int kill_count_ = 0;
};

}  // namespace

int parse_tee(const std::string& v) {
  const std::string t = to_lower(trim(v));
  if (t == "0" || t == "none") return 0;
  if (t == "1" || t == "stdout" || t == "out") return kTeeStdout;
  if (t == "2" || t == "stderr" || t == "err") return kTeeStderr;
  if (t == "3" || t == "all" || t == "both") return kTeeStdout | kTeeStderr;
  ACCEL_THROW(launcher::ConfigError, "launch",
              "--tee: expected 0-3 or none, stdout, stderr, all, got '", v, "'");
}

std::vector<int> parse_forward_signals(const std::string& v) {
  std::vector<int> out;
  const std::string t = trim(v);
  if (t.empty() || to_lower(t) == "none") return out;
  // Fault signals are sent by the kernel to the thread that faults; blocking them in accel-run
  // would turn its own crash into a hang. Stop/continue and SIGCHLD are supervision's business.
  static const std::set<int> kRefused = {SIGKILL, SIGSTOP, SIGCHLD, SIGSEGV, SIGBUS,
                                         SIGFPE,  SIGILL,  SIGABRT, SIGTRAP, SIGSYS,
                                         SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT};
  for (const auto& part : split(t, ',')) {
    auto sig = parse_signal(part);
    ACCEL_CHECK(sig.has_value(), launcher::ConfigError, "launch",
                "--forward_signals: unknown signal '", trim(part),
                "' (expected names such as SIGUSR1,SIGUSR2 or numbers, or none)");
    ACCEL_CHECK(!kRefused.count(*sig), launcher::ConfigError, "launch",
                "--forward_signals: ", signal_name(*sig),
                " cannot be forwarded (accel-run needs its default meaning)");
    if (std::find(out.begin(), out.end(), *sig) == out.end()) out.push_back(*sig);
  }
  return out;
}

int supervise(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts) {
  ACCEL_CHECK(!opts.argv.empty(), launcher::ConfigError, "launch", "no program to launch");
  Supervisor s(plan, base_env, opts);
  return s.run();
}

}  // namespace accel::launcher
