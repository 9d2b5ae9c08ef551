// supervise() and the Supervisor's lifecycle: signal, cgroup and watchdog setup, the restart loop
// and one attempt of the group (launcher/supervisor_impl.h lists where the rest lives).
#include "launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "core/env_contract.h"
#include "launcher/supervisor_impl.h"
#include "launcher/watchdog.h"

namespace accel::launcher {
namespace supervisor_detail {
namespace {

// After the last worker is reaped, output still in flight (a grandchild holding the pipe) is read
// for at most this long.
constexpr double kDrainSeconds = 1.0;
// At exit, output still queued for a console nobody reads is dropped after this long.
constexpr double kConsoleDrainSeconds = 1.0;
// The watchdog's final sweep after a normal end normally takes milliseconds.
constexpr double kWatchdogFinishSeconds = 2.0;
constexpr size_t kLaunchIdBytes = 16;
constexpr size_t kCgroupIdChars = 12;
constexpr const char* kLaunchIdVar = env::kLaunchId;

}  // namespace

Supervisor::Supervisor(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts)
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

Supervisor::~Supervisor() {
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

int Supervisor::run() {
  const int max_restarts = opts_.local_restarts ? plan_.config.max_restarts : 0;
  for (int restart = opts_.restart_offset;; ++restart) {
    Outcome o = run_attempt(restart);
    switch (o) {
      case Outcome::kSuccess:
        info("all " + std::to_string(workers_.size()) + " worker(s) exited successfully" +
             (restart > 0 ? " after " + std::to_string(restart) + " restart(s)" : ""));
        return 0;
      case Outcome::kSpawnError: return 127;
      case Outcome::kStopped: return kSuperviseStopped;
      case Outcome::kInterrupted:
        if (opts_.interrupted) *opts_.interrupted = true;
        log("stopped all workers after " + signal_name(interrupt_signal_));
        return 128 + interrupt_signal_;
      case Outcome::kFailure: {
        const int code = workers_[*first_failure_].exit_code;
        if (restart - opts_.restart_offset < max_restarts) {
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

// Output queued for a console nobody reads is given up after kConsoleDrainSeconds; say so.
void Supervisor::drain_console() {
  out_.drain(kConsoleDrainSeconds);
  if (out_.dropped_bytes() > 0) {
    log(std::to_string(out_.dropped_bytes()) +
        " bytes of stdout output were dropped (stdout was not being read)");
  }
  err_.drain(kConsoleDrainSeconds);
}

// Clears the previous attempt, prepares each worker's files and starts the workers; returns the
// spawn error (empty when every worker started).
std::string Supervisor::start_workers(int restart) {
  for (Worker& w : workers_) close_logs(w);
  workers_.clear();
  first_failure_.reset();
  failures_.clear();
  kill_deadline_.reset();
  sigkill_sent_ = false;
  tearing_down_ = false;
  stop_requested_ = false;
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
  return spawn_error;
}

Supervisor::Outcome Supervisor::run_attempt(int restart) {
  const std::string spawn_error = start_workers(restart);
  if (!spawn_error.empty()) {
    log(spawn_error);
    begin_teardown(SIGTERM);
  }

  std::optional<Clock::time_point> drain_deadline;
  bool cleaned_up = false;
  while (true) {
    reap();
    check_stopped();
    if (opts_.should_stop && !tearing_down_ && opts_.should_stop()) {
      stop_requested_ = true;
      info("stopping the workers for the next rendezvous round");
      begin_teardown(SIGTERM);
    }
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
    poll_once(drain_deadline);
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
  if (stop_requested_) return Outcome::kStopped;
  return Outcome::kSuccess;
}

// One wait for a signal, worker output or console space, bounded by the monitor interval and the
// next deadline (SIGKILL, end of the drain, a stopped worker's timeout); handles what arrived.
void Supervisor::poll_once(const std::optional<Clock::time_point>& drain_deadline) {
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
  if (rc <= 0) return;
  if (fds[0].revents & POLLIN) handle_signals();
  for (size_t i = 1; i < console_at; ++i) {
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump(*streams[i - 1]);
  }
  out_.flush();
  err_.flush();
}

std::string Supervisor::format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

}  // namespace supervisor_detail

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
  supervisor_detail::Supervisor s(plan, base_env, opts);
  return s.run();
}

}  // namespace accel::launcher
