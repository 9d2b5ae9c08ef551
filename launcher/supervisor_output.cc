// The Supervisor's worker output: per-rank folders and log files, reading the workers' pipes,
// splitting lines and passing them to the console and the stderr tail of the failure report.
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "core/file_io.h"
#include "launcher/supervisor_impl.h"

namespace accel::launcher::supervisor_detail {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
// A line longer than this is emitted in pieces so one chatty worker cannot grow memory unbounded.
constexpr size_t kMaxLine = 64 * 1024;
// The worker's error file in its folder (Note [error files] in launcher/supervisor_report.cc).
constexpr const char* kErrorFileName = "error.json";

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

}  // namespace

bool Supervisor::console_gets(bool is_err) const {
  return opts_.log_dir.empty() || (opts_.tee & (is_err ? kTeeStderr : kTeeStdout)) != 0;
}

// Creates DIR/attempt_<n>/rank_<r>, removes a stale error file, opens the log files.
void Supervisor::prepare_files(Worker& w, int restart) {
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

void Supervisor::close_logs(Worker& w) {
  for (int& fd : w.log_fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

void Supervisor::pump(Stream& s) {
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

void Supervisor::close_stream(Worker& w, Stream& s) {
  if (s.fd < 0) return;
  if (!s.partial.empty()) {
    emit(w, s.is_err, s.partial);
    s.partial.clear();
  }
  close(s.fd);
  s.fd = -1;
}

Worker& Supervisor::owner(Stream& s) {
  for (Worker& w : workers_) {
    if (&w.out == &s || &w.err == &s) return w;
  }
  ACCEL_INTERNAL_ASSERT(false);
  return workers_.front();
}

void Supervisor::emit(Worker& w, bool is_err, std::string_view line) {
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

}  // namespace accel::launcher::supervisor_detail
