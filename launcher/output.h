// accel-run's own stdout/stderr: writes that never block the supervisor.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace accel::launcher {

// Note [non-blocking console]: a blocking write to a stdout nobody reads (a full pipe, a terminal
// paused with Ctrl-S) would wedge accel-run: SIGTERM/SIGINT are read from a signalfd in the same
// loop, so it could no longer stop the workers. The console is therefore written without blocking
// through a bounded buffer. Setting O_NONBLOCK on fd 1 itself would change the open file
// description we share with the shell (which then sees EAGAIN on its own terminal), so pipes, FIFOs
// and terminals are reopened through /proc/self/fd/N with O_NONBLOCK (a description of our own),
// sockets are written with MSG_DONTWAIT, and regular files (which never block for long) are written
// directly. When the buffer is full, whole writes are dropped and counted; once there is room again
// the sink writes "[accel-run: N bytes of output dropped]" before the next text.
class ConsoleSink {
 public:
  static constexpr size_t kDefaultCapacity = 4 << 20;

  explicit ConsoleSink(int fd, size_t capacity = kDefaultCapacity);
  ~ConsoleSink();
  ConsoleSink(const ConsoleSink&) = delete;
  ConsoleSink& operator=(const ConsoleSink&) = delete;

  // Queues `text` and writes what the fd accepts now. Never blocks (except on a regular file).
  void write(std::string_view text);
  // Writes what the fd accepts now; true when nothing is left.
  bool flush();
  // Keeps flushing for at most `seconds` (polling for room); what is left then is dropped.
  // Returns true when everything was written.
  bool drain(double seconds);

  bool pending() const { return off_ < buf_.size(); }
  // fd to poll for POLLOUT while pending(); -1 when there is nothing to wait for.
  int poll_fd() const { return pending() && !broken_ ? fd_ : -1; }
  size_t dropped_bytes() const { return total_dropped_; }

 private:
  enum class Mode { kNonBlocking, kSocket, kBlocking };
  // One write(2)/send(2); returns bytes written, 0 when the fd would block, -1 when it is broken.
  long write_some(const char* p, size_t n);
  void drop(size_t n);

  int fd_;
  int own_fd_ = -1;
  Mode mode_ = Mode::kBlocking;
  size_t capacity_;
  std::string buf_;
  size_t off_ = 0;
  size_t unreported_dropped_ = 0;
  size_t total_dropped_ = 0;
  bool broken_ = false;  // EPIPE and friends: the reader is gone; everything is dropped from now on
};

// Writes `text` to fd through a ConsoleSink, waiting at most `seconds` for room.
void write_console(int fd, std::string_view text, double seconds = 1.0);

}  // namespace accel::launcher
