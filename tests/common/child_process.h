// Runs a piece of a test in a forked child with a deadline, for the hostile-file tests: a read
// that blocks on a FIFO, a SIGBUS or a bad_alloc then fails that one check instead of hanging or
// killing the whole suite (Note [safe file access] in core/file_io.h). Header-only, std + POSIX.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

namespace accel::test {

// What the child did: exited with `code`, was killed by `signal`, or ran past the deadline (then
// it was killed).
struct ChildResult {
  bool timed_out = false;
  int code = -1;   // exit code, when it exited
  int signal = 0;  // the signal that killed it, when one did
  bool ok() const { return !timed_out && signal == 0 && code == 0; }
};

// Exit codes of expect_error_child: 0 when the body threw E whose message contains the
// fragment; these otherwise.
inline constexpr int kChildWrongMessage = 101;
inline constexpr int kChildOtherException = 102;
inline constexpr int kChildNoException = 103;

// Runs body() in a child and waits at most timeout_s seconds (generous: it is a bound on a hang,
// not a timing claim); the child's exit code is what body returns (an exception: 99, with its
// message on stderr).
inline ChildResult run_in_child(const std::function<int()>& body, double timeout_s = 60.0) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int rc = 99;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  ChildResult r;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  int status = 0;
  while (true) {
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// Runs f() in a child: 0 when it throws E with `fragment` in its message (printed to stderr
// otherwise), one of the kChild* codes when not.
template <typename E, typename F>
ChildResult expect_error_child(F&& f, const std::string& fragment, double timeout_s = 60.0) {
  return run_in_child(
      [&]() -> int {
        try {
          f();
        } catch (const E& e) {
          if (std::string(e.what()).find(fragment) != std::string::npos) return 0;
          std::fprintf(stderr, "child: message lacks '%s': %s\n", fragment.c_str(), e.what());
          return kChildWrongMessage;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "child: other exception: %s\n", e.what());
          return kChildOtherException;
        }
        return kChildNoException;
      },
      timeout_s);
}

}  // namespace accel::test
