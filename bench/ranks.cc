#include "bench/ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/model_workloads.h"
#include "core/error.h"

namespace accel::bench {

namespace {

using Clock = std::chrono::steady_clock;

// A temporary directory, removed with its rank files.
class TempDir {
 public:
  explicit TempDir(const char* op) {
    char tmpl[] = "/tmp/accel_bench_ranks_XXXXXX";
    ACCEL_CHECK(mkdtemp(tmpl) != nullptr, IoError, op, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    for (int r = 0; r < 256; ++r)
      std::remove((path_ + "/rank" + std::to_string(r) + ".txt").c_str());
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

Fields parse_fields(const std::string& line) {
  Fields f;
  std::stringstream ss(line);
  for (std::string tok; ss >> tok;) {
    const size_t eq = tok.find('=');
    if (eq != std::string::npos && eq > 0) f[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return f;
}

double number(const Fields& f, const std::string& key, const std::string& who, const char* op) {
  const auto it = f.find(key);
  ACCEL_CHECK(it != f.end(), ValueError, op, who, " reported no ", key);
  char* end = nullptr;
  const double d = std::strtod(it->second.c_str(), &end);
  ACCEL_CHECK(end != it->second.c_str() && *end == '\0' && std::isfinite(d), ValueError, op, who,
              " reported ", key, "=", it->second);
  return d;
}

int env_count(const char* name, int fallback, const char* op) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  ACCEL_CHECK(end != v && *end == '\0' && n >= 0 && n <= 1000000, ValueError, op, name,
              " must be a count, got '", v, "'");
  return int(n);
}

void set_rank_env(int rank, int world, int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("OMP_NUM_THREADS", "1", 1);
}

double proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return std::strtod(line.c_str() + prefix.size(), nullptr);
  ACCEL_THROW(IoError, "bench", "/proc/self/status has no ", key);
}

std::vector<Fields> run_ranks(const char* workload, int world,
                              const std::map<std::string, std::string>& env, const char* out_env,
                              int timeout_s, const std::string& what) {
  TempDir dir(workload);
  const int port = world > 1 ? free_loopback_port() : 0;
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (const pid_t p : pids) kill(p, SIGKILL);
      for (const pid_t p : pids) waitpid(p, nullptr, 0);
      ACCEL_THROW(DistError, workload, "fork failed for rank ", r);
    }
    if (pid == 0) {
      setenv(out_env, dir.path().c_str(), 1);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      if (world > 1) {
        set_rank_env(r, world, port);
      } else {
        for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
      }
      dup2(STDERR_FILENO, STDOUT_FILENO);  // our stdout carries result lines only
      std::string self = "workloads", name = workload;
      char* argv[] = {self.data(), name.data(), nullptr};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Wait for all; on the first failure (or the deadline) kill the rest.
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  std::vector<bool> alive(pids.size(), true);
  size_t running = pids.size();
  std::string failure;
  while (running > 0) {
    bool reaped = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!alive[i]) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
      alive[i] = false;
      --running;
      reaped = true;
      if (failure.empty() && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        failure = "rank " + std::to_string(i) +
                  (WIFEXITED(st) ? " exited with status " + std::to_string(WEXITSTATUS(st))
                                 : " was killed by signal " + std::to_string(WTERMSIG(st)));
    }
    if (failure.empty() && Clock::now() > deadline)
      failure = "the ranks ran longer than " + std::to_string(timeout_s) + " s";
    if (!failure.empty())
      for (size_t i = 0; i < pids.size(); ++i)
        if (alive[i]) kill(pids[i], SIGKILL);
    if (!reaped && running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ACCEL_CHECK(failure.empty(), DistError, workload, what, ": ", failure, " (its stderr is above)");
  std::vector<Fields> ranks;
  for (int r = 0; r < world; ++r) {
    const std::string path = dir.path() + "/rank" + std::to_string(r) + ".txt";
    std::ifstream in(path);
    std::string line;
    ACCEL_CHECK(in && std::getline(in, line), IoError, workload, "rank ", r, " wrote no result to ",
                path);
    ranks.push_back(parse_fields(line));
  }
  return ranks;
}

}  // namespace accel::bench
