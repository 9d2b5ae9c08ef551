// The Supervisor behind supervise() (launcher/supervisor.h), internal to accel-run. Its methods
// are spread over four files by concern:
//   supervisor.cc            lifecycle: signal and cgroup setup, the restart loop, one attempt
//   supervisor_processes.cc  spawning, signals, reaping, stopped workers, teardown, leftovers
//   supervisor_output.cc     worker output streams, the console and the per-rank log files
//   supervisor_report.cc     failures: the report, the error files (Note [error files]), summary
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/output.h"
#include "launcher/plan.h"
#include "launcher/supervisor.h"
#include "launcher/watchdog.h"

namespace accel::launcher::supervisor_detail {

using Clock = std::chrono::steady_clock;

// Signals that stop the job (forwarded, then teardown).
inline constexpr int kTerminatingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// waitpid statuses in words and as accel-run's exit code (supervisor_processes.cc).
std::string describe_status(int st);  // "exit code 3", "killed by signal 9 (SIGKILL)"
int exit_code_of(int st);             // the exit code, or 128 + signal
bool succeeded(int st);               // exited with 0

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
  Supervisor(LaunchPlan& plan, const EnvMap& base_env, const SuperviseOptions& opts);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  int run();

 private:
  enum class Outcome { kSuccess, kFailure, kInterrupted, kSpawnError, kStopped };

  void log(const std::string& line) { err_.write(opts_.log_prefix + ": " + line + "\n"); }
  void info(const std::string& line) {
    if (!opts_.quiet) log(line);
  }
  static std::string format_seconds(double s);

  // supervisor.cc: one attempt of the group.
  Outcome run_attempt(int restart);
  std::string start_workers(int restart);  // the spawn error, empty when all started
  void poll_once(const std::optional<Clock::time_point>& drain_deadline);
  void drain_console();

  // supervisor_output.cc
  bool console_gets(bool is_err) const;
  void prepare_files(Worker& w, int restart);
  void close_logs(Worker& w);
  void pump(Stream& s);
  void close_stream(Worker& w, Stream& s);
  Worker& owner(Stream& s);
  void emit(Worker& w, bool is_err, std::string_view line);

  // supervisor_processes.cc
  void spawn(Worker& w, const std::vector<std::string>& env, std::string* error);
  bool forward_only(int sig) const;
  void handle_signals();
  int running_count() const;
  void reap();
  std::optional<Clock::time_point> next_stop_deadline() const;
  void check_stopped();
  void begin_teardown(int sig);
  void escalate();
  int signal_groups(int sig);
  void kill_leftovers();

  // supervisor_report.cc
  void record_failure(Worker& w, std::string what, int exit_code);
  void report_failure();
  void collect_self_reported_failures();
  void write_error_files();
  void print_summary();

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
  bool stop_requested_ = false;  // should_stop said true this attempt
  int term_count_ = 0;
  int kill_count_ = 0;
};

}  // namespace accel::launcher::supervisor_detail
