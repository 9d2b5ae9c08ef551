#include "launcher/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>

namespace accel::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 64 * 1024;
// A line longer than this is emitted in pieces so one chatty worker cannot grow memory unbounded.
constexpr size_t kMaxLine = 64 * 1024;
// After the last worker is reaped, output still in flight (a grandchild holding the pipe) is read
// for at most this long.
constexpr double kDrainSeconds = 1.0;
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return;  // EPIPE and friends: the reader went away; output is dropped, supervision goes on
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exit code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    std::string s = "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + signal_name(WTERMSIG(st)) + ")";
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
};

class Supervisor {
 public:
  Supervisor(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts)
      : plan_(plan), base_env_(base_env), opts_(opts) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    for (int s : kForwardedSignals) {
      // A SIGHUP ignored by our parent (nohup) stays ignored; everything else is ours to forward.
      struct sigaction old{};
      sigaction(s, nullptr, &old);
      if (s == SIGHUP && old.sa_handler == SIG_IGN) continue;
      sigaddset(&mask, s);
    }
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);
    // SIGCHLD must not be SIG_IGN (children would be reaped by the kernel and their status lost).
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &old_chld_);
    struct sigaction ign = dfl;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe_);
    sfd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    ACCEL_CHECK(sfd_ >= 0, DistError, "accel-run", "signalfd failed: ", std::strerror(errno));
    prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  ~Supervisor() {
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
        case Outcome::kSpawnError:
          return 127;
        case Outcome::kInterrupted:
          log("stopped all workers after " + signal_name(interrupt_signal_));
          return 128 + interrupt_signal_;
        case Outcome::kFailure: {
          const int code = exit_code_of(workers_[*first_failure_].status);
          if (restart < max_restarts) {
            log("restarting all " + std::to_string(workers_.size()) + " worker(s) (restart " +
                std::to_string(restart + 1) + " of " + std::to_string(max_restarts) + ")");
            continue;
          }
          if (max_restarts > 0) log("giving up after " + std::to_string(max_restarts) + " restart(s)");
          return code == 0 ? 1 : code;
        }
      }
    }
  }

 private:
  enum class Outcome { kSuccess, kFailure, kInterrupted, kSpawnError };

  void log(const std::string& line) { write_all(2, opts_.log_prefix + ": " + line + "\n"); }
  void info(const std::string& line) {
    if (!opts_.quiet) log(line);
  }

  Outcome run_attempt(int restart) {
    workers_.clear();
    first_failure_.reset();
    kill_deadline_.reset();
    sigkill_sent_ = false;
    tearing_down_ = false;
    term_count_ = kill_count_ = 0;
    if (plan_.port_auto) plan_.master_port = pick_free_port(plan_.master_addr);

    const int n = plan_.num_local_workers;
    workers_.resize(n);
    const std::string ranks = n == 1 ? "rank " + std::to_string(plan_.first_rank)
                                     : "ranks " + std::to_string(plan_.first_rank) + "-" +
                                           std::to_string(plan_.first_rank + n - 1);
    info("starting " + std::to_string(n) + " worker(s): " + ranks + " of " + std::to_string(plan_.world_size) + " on machine " +
         std::to_string(plan_.machine_rank) + " of " + std::to_string(plan_.num_machines) + ", MASTER_ADDR=" +
         plan_.master_addr + " MASTER_PORT=" + std::to_string(plan_.master_port) +
         (restart > 0 ? ", ACCEL_RESTART_COUNT=" + std::to_string(restart) : ""));
    start_ = Clock::now();
    std::string spawn_error;
    for (int i = 0; i < n && spawn_error.empty(); ++i) {
      Worker& w = workers_[i];
      w.rank = plan_.first_rank + i;
      w.local_rank = plan_.first_local_rank + i;
      w.prefix = opts_.rank_prefix ? "[rank" + std::to_string(w.rank) + "]: " : "";
      spawn(w, make_environ(base_env_, worker_env(plan_, i, restart)), &spawn_error);
    }
    if (!spawn_error.empty()) {
      log(spawn_error);
      begin_teardown(SIGTERM);
    }

    std::optional<Clock::time_point> drain_deadline;
    bool cleaned_up = false;
    while (true) {
      reap();
      if (kill_deadline_ && !sigkill_sent_ && Clock::now() >= *kill_deadline_) escalate();
      if (std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; })) {
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
      double wait_s = plan_.config.monitor_interval;
      auto until = [&](Clock::time_point t) {
        wait_s = std::min(wait_s, std::chrono::duration<double>(t - Clock::now()).count());
      };
      if (kill_deadline_ && !sigkill_sent_) until(*kill_deadline_);
      if (drain_deadline) until(*drain_deadline);
      int timeout_ms = std::max(0, static_cast<int>(wait_s * 1000.0 + 0.999));
      int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0 && errno != EINTR) {
        log(std::string("poll failed: ") + std::strerror(errno) + "; killing the workers");
        escalate();
      }
      if (rc <= 0) continue;
      if (fds[0].revents & POLLIN) handle_signals();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump(*streams[i - 1]);
      }
    }
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) close_stream(w, *s);
    }

    if (!spawn_error.empty()) return Outcome::kSpawnError;
    if (first_failure_) report_failure();
    if (interrupt_signal_ != 0) return Outcome::kInterrupted;
    if (first_failure_) return Outcome::kFailure;
    return Outcome::kSuccess;
  }

  void spawn(Worker& w, const std::vector<std::string>& env, std::string* error) {
    int out[2], err[2], ex[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(ex, O_CLOEXEC) != 0) {
      *error = std::string("cannot create pipes for rank ") + std::to_string(w.rank) + ": " + std::strerror(errno);
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
      *error = std::string("fork failed for rank ") + std::to_string(w.rank) + ": " + std::strerror(errno);
      for (int fd : {out[0], out[1], err[0], err[1], ex[0], ex[1]}) close(fd);
      return;
    }
    if (pid == 0) {
      // Own process group: teardown signals reach the worker and everything it starts, and a
      // Ctrl-C at the terminal reaches only accel-run, which forwards it once.
      setpgid(0, 0);
      // Note [no orphans]: if accel-run dies without cleaning up (SIGKILL), the kernel kills the
      // workers; the subreaper setting catches what they start.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      struct sigaction dfl{};
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

  void handle_signals() {
    signalfd_siginfo si;
    while (read(sfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs every loop iteration
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

  void reap() {
    while (true) {
      int st = 0;
      pid_t pid = waitpid(-1, &st, WNOHANG);
      if (pid <= 0) break;
      auto it = std::find_if(workers_.begin(), workers_.end(),
                             [pid](const Worker& w) { return w.running && w.pid == pid; });
      if (it == workers_.end()) continue;  // a reparented leftover process
      it->running = false;
      it->status = st;
      if (!succeeded(st) && !first_failure_ && !tearing_down_) {
        first_failure_ = static_cast<size_t>(it - workers_.begin());
        int others = static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                                    [](const Worker& w) { return w.running; }));
        log("rank " + std::to_string(it->rank) + " failed (" + describe_status(st) + ") after " +
            format_seconds(seconds_since(start_)) + "; stopping the other " + std::to_string(others) +
            " worker(s) (SIGTERM, SIGKILL after " + format_seconds(opts_.grace_period_s) + ")");
        begin_teardown(SIGTERM);
      }
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
      if (w.running) ++running;
      kill(-w.pid, sig);
    }
    return running;
  }

  // All workers have been reaped: kill what is left in their groups and what was reparented to
  // us, so that nothing the launch started outlives it.
  void kill_leftovers() {
    for (const Worker& w : workers_) {
      if (w.pid > 0) kill(-w.pid, SIGKILL);
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < deadline) {
      auto kids = list_children();
      if (kids.empty()) break;
      for (pid_t k : kids) kill(k, SIGKILL);
      usleep(2000);
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
  }

  void pump(Stream& s) {
    Worker& w = owner(s);
    char buf[kReadChunk];
    while (s.fd >= 0) {
      ssize_t n = read(s.fd, buf, sizeof(buf));
      if (n > 0) {
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
    std::string text;
    text.reserve(w.prefix.size() + line.size() + 1);
    text.append(w.prefix).append(line).push_back('\n');
    write_all(is_err ? 2 : 1, text);
    if (is_err && opts_.tail_lines > 0) {
      w.tail.emplace_back(line);
      if (w.tail.size() > opts_.tail_lines) w.tail.pop_front();
    }
  }

  void report_failure() {
    const Worker& w = workers_[*first_failure_];
    log("first failing worker: rank " + std::to_string(w.rank) + " (local_rank " + std::to_string(w.local_rank) +
        ", machine " + std::to_string(plan_.machine_rank) + ", pid " + std::to_string(w.pid) + "): " +
        describe_status(w.status));
    if (w.tail.empty()) {
      log("rank " + std::to_string(w.rank) + " wrote nothing to stderr");
    } else {
      log("last " + std::to_string(w.tail.size()) + " stderr line(s) of rank " + std::to_string(w.rank) + ":");
      for (const auto& l : w.tail) log("  | " + l);
    }
    const int others = static_cast<int>(workers_.size()) - 1;
    if (others > 0) {
      log("the other " + std::to_string(others) + " worker(s): " + std::to_string(term_count_) +
          " were running at the failure and got SIGTERM, " + std::to_string(kill_count_) +
          " needed SIGKILL after the " + format_seconds(opts_.grace_period_s) + " grace period");
    }
  }

  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
    return buf;
  }

  LaunchPlan& plan_;
  const EnvMap& base_env_;
  const SuperviseOptions& opts_;
  sigset_t old_mask_{};
  struct sigaction old_chld_{}, old_pipe_{};
  int sfd_ = -1;
  std::vector<Worker> workers_;
  Clock::time_point start_;
  std::optional<size_t> first_failure_;
  std::optional<Clock::time_point> kill_deadline_;
  int interrupt_signal_ = 0;
  bool sigkill_sent_ = false;
  bool tearing_down_ = false;
  int term_count_ = 0;
  int kill_count_ = 0;
};

}  // namespace

int supervise(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts) {
  ACCEL_CHECK(!opts.argv.empty(), launcher::ConfigError, "launch", "no program to launch");
  Supervisor s(plan, base_env, opts);
  return s.run();
}

}  // namespace accel::launcher
