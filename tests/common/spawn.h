// Spawning one process per rank under the env contract, for the multi-process dist tests.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace accel::test {

struct RankResult {
  bool exited = false;  // exited by itself (not killed by us)
  int code = -1;        // exit status, or -signal
  std::string output;   // stdout + stderr
};

// A helper executable next to the running test binary (build/tests/<folder>/), or
// $ACCEL_DIST_<NAME>.
inline std::string helper_path(const std::string& name) {
  std::string env_name = "ACCEL_DIST_HELPER_DIR";
  if (const char* d = std::getenv(env_name.c_str())) return std::string(d) + "/" + name;
  char buf[PATH_MAX] = {0};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, size_t(n)) : std::string("./x");
  return self.substr(0, self.rfind('/')) + "/" + name;
}

inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Runs `exe args...` as ranks 0..world-1 with `extra_env` ("NAME@r" keys: rank r only). world == 1
// runs without RANK/WORLD_SIZE (single process). Waits up to `limit`; with kill_after_survivors, as
// soon as every rank that exits by itself has done so and the rest are stopped or stuck (e.g. a
// SIGSTOPped victim), waits 1 s more and kills the rest. Ranks still running at `limit` are killed
// and reported as such.
inline std::vector<RankResult> run_world(const std::string& exe,
                                         const std::vector<std::string>& args, int world,
                                         const std::map<std::string, std::string>& extra_env,
                                         std::chrono::milliseconds limit,
                                         bool kill_after_survivors = false) {
  const int port = free_port();
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<std::string> logs(static_cast<size_t>(world));
  std::vector<RankResult> res(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // Everything the child needs is built before fork: only exec-safe calls after it.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string s = *e;
      std::string key = s.substr(0, s.find('='));
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" ||
          key == "LOCAL_WORLD_SIZE" || key == "MASTER_ADDR" || key == "MASTER_PORT" ||
          extra_env.count(key) || extra_env.count(key + "@" + std::to_string(r)))
        continue;
      env.push_back(s);
    }
    if (world > 1) {
      env.push_back("RANK=" + std::to_string(r));
      env.push_back("WORLD_SIZE=" + std::to_string(world));
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back("MASTER_PORT=" + std::to_string(port));
    }
    // "NAME@r" entries set NAME on rank r only, over a plain "NAME" entry.
    std::map<std::string, std::string> mine;
    for (auto& [k, v] : extra_env)
      if (k.find('@') == std::string::npos) mine[k] = v;
    for (auto& [k, v] : extra_env) {
      const size_t at = k.find('@');
      if (at != std::string::npos && k.substr(at + 1) == std::to_string(r))
        mine[k.substr(0, at)] = v;
    }
    for (auto& [k, v] : mine)
      if (!(k == "OMP_NUM_THREADS" && v.empty())) env.push_back(k + "=" + v);
    // One thread per rank unless the test sets OMP_NUM_THREADS itself ("" leaves it unset).
    if (!extra_env.count("OMP_NUM_THREADS")) env.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_s = {exe};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    char tmpl[] = "/tmp/accel-dist-test-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    logs[size_t(r)] = tmpl;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(fd);
    pids[size_t(r)] = pid;
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  int running = world;
  std::chrono::steady_clock::time_point quiet_since{};
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    bool progressed = false;
    for (int r = 0; r < world; ++r) {
      if (pids[size_t(r)] < 0) continue;
      int status = 0;
      pid_t got = waitpid(pids[size_t(r)], &status, WNOHANG);
      if (got == pids[size_t(r)]) {
        res[size_t(r)].exited = true;
        res[size_t(r)].code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        pids[size_t(r)] = -1;
        --running;
        progressed = true;
      }
    }
    if (kill_after_survivors && running > 0) {
      // Stopped processes: count them; when only stopped ones remain, end after a grace.
      int stopped = 0;
      for (int r = 0; r < world; ++r) {
        if (pids[size_t(r)] < 0) continue;
        std::ifstream st("/proc/" + std::to_string(pids[size_t(r)]) + "/stat");
        std::string line;
        std::getline(st, line);
        auto p = line.rfind(')');
        if (p != std::string::npos && p + 2 < line.size() && line[p + 2] == 'T') ++stopped;
      }
      if (stopped == running) {
        if (quiet_since == std::chrono::steady_clock::time_point{})
          quiet_since = std::chrono::steady_clock::now();
        if (std::chrono::steady_clock::now() - quiet_since > std::chrono::seconds(1)) break;
      } else {
        quiet_since = {};
      }
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    if (pids[size_t(r)] < 0) continue;
    kill(pids[size_t(r)], SIGKILL);
    int status = 0;
    waitpid(pids[size_t(r)], &status, 0);
    res[size_t(r)].exited = false;
    res[size_t(r)].code = -SIGKILL;
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(logs[size_t(r)]);
    std::stringstream ss;
    ss << f.rdbuf();
    res[size_t(r)].output = ss.str();
    unlink(logs[size_t(r)].c_str());
  }
  return res;
}

}  // namespace accel::test
