#include "launcher/watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <thread>

#include "launcher/util.h"

namespace accel::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Bounds of one pass reading another process's environment.
constexpr size_t kMaxEnvironBytes = 1 << 20;
constexpr auto kSweepPause = std::chrono::milliseconds(5);
// How long the watchdog sweeps at most once accel-run is gone.
constexpr double kWatchdogSweepSeconds = 5.0;

bool is_zombie(const std::string& pid) {
  int fd = open(("/proc/" + pid + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // gone
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return true;
  std::string_view s(buf, static_cast<size_t>(n));
  size_t close_paren = s.rfind(')');
  return close_paren != std::string_view::npos && close_paren + 2 < s.size() &&
         (s[close_paren + 2] == 'Z' || s[close_paren + 2] == 'X');
}

bool environ_has(const std::string& pid, const std::string& needle) {
  int fd = open(("/proc/" + pid + "/environ").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone, or not ours to read
  std::string env(1, '\0');  // leading NUL so that the first entry matches "\0KEY=VALUE\0" too
  char buf[16384];
  while (env.size() < kMaxEnvironBytes) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    env.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  env.push_back('\0');
  return env.find(needle) != std::string::npos;
}

std::string read_small_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  while (out.size() < kMaxEnvironBytes) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool write_small_file(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n;
  do {
    n = write(fd, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  close(fd);
  return n == static_cast<ssize_t>(text.size());
}

bool cgroup_populated(const std::string& dir) {
  const std::string events = read_small_file(dir + "/cgroup.events");
  if (events.empty()) return !trim(read_small_file(dir + "/cgroup.procs")).empty();
  return events.find("populated 1") != std::string::npos;
}

[[noreturn]] void watchdog_main(int rfd, const std::string& marker, const std::string& temp_dir,
                                const std::string& cgroup) {
  std::set<pid_t> groups;
  bool keep = false;
  std::string pending;
  char buf[512];
  while (true) {
    ssize_t n = read(rfd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // accel-run is gone (or closed the pipe): sweep
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string msg = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (msg == "-") {
        groups.clear();
      } else if (msg == "k") {
        keep = true;
      } else if (!msg.empty() && msg[0] == '+') {
        if (auto g = parse_int(msg.substr(1)); g && *g > 1) groups.insert(static_cast<pid_t>(*g));
      }
    }
  }
  if (!cgroup.empty()) remove_cgroup(cgroup, kWatchdogSweepSeconds);
  sweep_launch(groups, marker, kWatchdogSweepSeconds);
  if (!keep && !temp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir, ec);
  }
  _exit(0);
}

}  // namespace

std::string create_job_cgroup(const std::string& name, std::string* why_not) {
  // The cgroup v2 mount point (mountinfo: "... <mount point> ... - cgroup2 ...").
  std::string mount;
  {
    std::istringstream is(read_small_file("/proc/self/mountinfo"));
    std::string line;
    while (std::getline(is, line)) {
      const size_t dash = line.find(" - ");
      if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
      std::istringstream f(line.substr(0, dash));
      std::string id, parent, dev, root, point;
      f >> id >> parent >> dev >> root >> point;
      if (root == "/") {
        mount = point;
        break;
      }
    }
  }
  if (mount.empty()) {
    *why_not = "no cgroup v2 mounted";
    return {};
  }
  // Our cgroup v2 path ("0::/path").
  std::string own;
  {
    std::istringstream is(read_small_file("/proc/self/cgroup"));
    std::string line;
    while (std::getline(is, line)) {
      if (line.rfind("0::", 0) == 0) own = line.substr(3);
    }
  }
  if (own.empty() || own.find("..") != std::string::npos) {
    *why_not = "this process is in no cgroup v2 cgroup";
    return {};
  }
  const std::string dir = mount + (own == "/" ? "" : own) + "/" + name;
  if (mkdir(dir.c_str(), 0755) != 0) {
    *why_not = "cannot create " + dir + ": " + std::strerror(errno);
    return {};
  }
  return dir;
}

bool kill_cgroup(const std::string& dir, double max_seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(max_seconds));
  const bool has_kill =
      write_small_file(dir + "/cgroup.kill", "1");  // Linux >= 5.14: the whole subtree at once
  while (cgroup_populated(dir)) {
    if (!has_kill) {
      std::istringstream is(read_small_file(dir + "/cgroup.procs"));
      std::string pid;
      while (is >> pid) {
        if (auto n = parse_int(pid); n && *n > 1) kill(static_cast<pid_t>(*n), SIGKILL);
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kSweepPause);
  }
  return true;
}

void remove_cgroup(const std::string& dir, double max_seconds) {
  kill_cgroup(dir, max_seconds);
  // Children first (a nested accel-run made its own); a cgroup directory holds only control files,
  // which rmdir removes with it. A failure (a member still exiting) leaves an empty cgroup behind.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_directory(ec) && !e.is_symlink(ec)) remove_cgroup(e.path().string(), 0.0);
  }
  rmdir(dir.c_str());
}

int sweep_launch(const std::set<pid_t>& groups, const std::string& marker, double max_seconds) {
  for (pid_t g : groups) kill(-g, SIGKILL);
  if (marker.empty()) return 0;
  const std::string needle = std::string(1, '\0') + marker + '\0';
  const std::string self = std::to_string(getpid());
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(max_seconds));
  int killed = 0;
  while (true) {
    int found = 0;
    DIR* d = opendir("/proc");
    if (d == nullptr) break;
    while (dirent* e = readdir(d)) {
      const std::string pid = e->d_name;
      auto n = parse_int(pid);
      if (!n || *n <= 1 || pid == self) continue;
      if (!environ_has(pid, needle) || is_zombie(pid)) continue;
      if (kill(static_cast<pid_t>(*n), SIGKILL) == 0) ++found;
    }
    closedir(d);
    killed += found;
    if (found == 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(
        kSweepPause);  // let them die; anything they forked meanwhile shows up next pass
  }
  return killed;
}

Watchdog::Watchdog(std::string marker, std::string temp_dir, std::string cgroup) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return;  // no watchdog: the subreaper and PDEATHSIG still apply
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return;
  }
  if (pid == 0) {
    close(p[1]);
    setpgid(0, 0);  // a Ctrl-C or a signal to accel-run's group does not reach it
    prctl(PR_SET_NAME, "accel-run-wd");
    for (int s = 1; s < NSIG; ++s) {
      if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD) signal(s, SIG_IGN);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Hold no copy of accel-run's stdout/stderr (a reader would wait for us) or other descriptors.
    int devnull = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) {
      if (devnull >= 0) dup2(devnull, fd);
    }
    int rfd = fcntl(p[0], F_DUPFD_CLOEXEC, 3);
    if (rfd < 0) _exit(1);
    close_range(static_cast<unsigned>(rfd) + 1, ~0U, 0);
    for (int fd = 3; fd < rfd; ++fd) close(fd);
    watchdog_main(rfd, marker, temp_dir, cgroup);
  }
  close(p[0]);
  fcntl(p[1], F_SETFL, O_NONBLOCK);  // never block accel-run on a stuck watchdog
  pid_ = pid;
  fd_ = p[1];
}

Watchdog::~Watchdog() { finish(0.0); }

void Watchdog::send(const std::string& msg) {
  if (fd_ < 0) return;
  const std::string line = msg + "\n";
  ssize_t n;
  do {
    n = ::write(fd_, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  // A short or failed write (the watchdog is gone) is not fatal: the subreaper still cleans up.
}

void Watchdog::watch_group(pid_t pgid) {
  std::string msg = std::to_string(pgid);
  msg.insert(msg.begin(), '+');  // not "+" + to_string(): GCC 12 warns falsely (-Wrestrict)
  send(msg);
}
void Watchdog::forget_groups() { send("-"); }
void Watchdog::keep_temp_dir() { send("k"); }

void Watchdog::finish(double seconds) {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  if (pid_ <= 0) return;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  while (true) {
    pid_t r = waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      pid_ = -1;
      return;
    }
    if (Clock::now() >= deadline) return;  // it finishes on its own; init reaps it
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace accel::launcher
