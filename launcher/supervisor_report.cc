// The Supervisor's failures: recording them, the report of the first one, each failed worker's
// error file (Note [error files]) and the failure summary.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "launcher/supervisor_impl.h"

namespace accel::launcher::supervisor_detail {
namespace {

// Note [error files]: what accel-run reads of a worker's error file, how deep it parses it, and
// how much of an unparsed one it keeps in the report.
constexpr uint64_t kMaxErrorFileBytes = uint64_t(1) << 20;
constexpr int kMaxErrorFileDepth = 64;
constexpr size_t kMaxKeptErrorText = size_t(64) << 10;
// Words that make a stderr line the "first error line" of the failure summary.
constexpr const char* kErrorWords[] = {"error", "exception", "what()",   "fatal",
                                       "abort", "failed",    "terminate"};

std::string iso_time(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The first line of a worker's own error report, else the first stderr line that looks like an
// error, else its last stderr line.
std::string first_error_line(const Worker& w, const nlohmann::json& report, bool by_worker) {
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
nlohmann::json read_worker_report(const std::string& path, bool& by_worker) {
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
}  // namespace

void Supervisor::record_failure(Worker& w, std::string what, int exit_code) {
  w.failed = true;
  w.failure = std::move(what);
  w.exit_code = exit_code;
  w.failed_at = std::chrono::system_clock::now();
  const size_t idx = static_cast<size_t>(&w - workers_.data());
  failures_.push_back(idx);
  if (!first_failure_) first_failure_ = idx;
}

void Supervisor::report_failure() {
  const Worker& w = workers_[*first_failure_];
  log("first failing worker: rank " + std::to_string(w.rank) + " (local_rank " +
      std::to_string(w.local_rank) + ", machine " + std::to_string(plan_.machine_rank) + ", pid " +
      std::to_string(w.pid) + "): " + w.failure);
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
void Supervisor::collect_self_reported_failures() {
  for (Worker& w : workers_) {
    if (w.failed || w.running || w.pid <= 0 || succeeded(w.status) || w.error_file.empty())
      continue;
    struct stat st {};
    if (lstat(w.error_file.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size > 0))
      record_failure(w, describe_status(w.status), exit_code_of(w.status));
  }
}

void Supervisor::write_error_files() {
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
void Supervisor::print_summary() {
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

}  // namespace accel::launcher::supervisor_detail
