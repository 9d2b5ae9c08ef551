#include "launcher/output.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

namespace accel::launcher {

ConsoleSink::ConsoleSink(int fd, size_t capacity) : fd_(fd), capacity_(capacity) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    broken_ = true;  // closed: nothing can be written
    return;
  }
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    int own = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_APPEND);
    if (own >= 0) {
      own_fd_ = fd_ = own;
      mode_ = Mode::kNonBlocking;
    }
    // Otherwise (no /proc, a FIFO without reader): blocking writes, as before.
  } else if (S_ISSOCK(st.st_mode)) {
    mode_ = Mode::kSocket;
  }
}

ConsoleSink::~ConsoleSink() {
  if (own_fd_ >= 0) close(own_fd_);
}

void ConsoleSink::drop(size_t n) {
  unreported_dropped_ += n;
  total_dropped_ += n;
}

void ConsoleSink::write(std::string_view text) {
  if (broken_) {
    total_dropped_ += text.size();
    return;
  }
  if (off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  }
  const size_t queued = buf_.size() - off_;
  if (queued + text.size() > capacity_) {
    drop(text.size());
    flush();
    return;
  }
  if (unreported_dropped_ > 0) {
    // The notice may exceed the capacity by its own few bytes: it is the point of the exercise.
    buf_ += "[accel-run: " + std::to_string(unreported_dropped_) + " bytes of output dropped]\n";
    unreported_dropped_ = 0;
  }
  buf_.append(text);
  flush();
}

long ConsoleSink::write_some(const char* p, size_t n) {
  while (true) {
    ssize_t w = mode_ == Mode::kSocket ? ::send(fd_, p, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                                       : ::write(fd_, p, n);
    if (w >= 0) return static_cast<long>(w);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

bool ConsoleSink::flush() {
  while (pending() && !broken_) {
    // Writes of at most PIPE_BUF bytes to a pipe are atomic, so ending each write at a line
    // boundary within PIPE_BUF keeps lines whole even when stdout and stderr share one pipe.
    size_t n = buf_.size() - off_;
    if (mode_ == Mode::kNonBlocking && n > PIPE_BUF) {
      const size_t nl = buf_.rfind('\n', off_ + PIPE_BUF - 1);
      n = (nl != std::string::npos && nl >= off_) ? nl + 1 - off_ : PIPE_BUF;
    }
    long w = write_some(buf_.data() + off_, n);
    if (w < 0) {
      broken_ = true;
      total_dropped_ += buf_.size() - off_;
      buf_.clear();
      off_ = 0;
      break;
    }
    if (w == 0) break;
    off_ += static_cast<size_t>(w);
  }
  if (off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  } else if (off_ > capacity_) {
    buf_.erase(0, off_);  // keep the buffer from growing: it holds at most ~2x capacity
    off_ = 0;
  }
  return !pending();
}

bool ConsoleSink::drain(double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  while (!flush() && !broken_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
  }
  if (pending()) {
    total_dropped_ += buf_.size() - off_;
    buf_.clear();
    off_ = 0;
    return false;
  }
  return !broken_;
}

void write_console(int fd, std::string_view text, double seconds) {
  ConsoleSink s(fd);
  s.write(text);
  s.drain(seconds);
}

}  // namespace accel::launcher
