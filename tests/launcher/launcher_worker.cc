// Worker program that tests/launcher/test_launcher.cc starts through accel-run. One binary with
// modes (one build instead of six):
//   env        write the env contract to DIR/env.RANK, print to stdout and stderr, exit --exit
//   fail       rank --fail_rank writes stderr lines, waits --delay s, exits --code (or raises
//              --signal); the other ranks wait (optionally ignoring SIGTERM)
//   trap       record the signal that stops the worker in DIR/sig.RANK
//   restart    rank 0 "trains" --steps steps with a checkpoint in DIR/ckpt and crashes on the first
//              --crash_times attempts; the other ranks wait for DIR/done
//   handshake  all ranks meet over TCP at MASTER_ADDR:MASTER_PORT; rank 0 checks every rank 1..W-1
//              arrives exactly once and that the contract is consistent
//   sleep      wait (for the parent-death test); rank --stop_rank stops itself with SIGSTOP (and
//              exits 0 once continued with --exit_when_continued)
//   flood      print long lines to stdout as fast as they are taken, until killed
//   usr1       wait for SIGUSR1, write DIR/usr1.RANK from the handler's flag, exit 0
// Every mode writes DIR/pid.RANK (and DIR/pid.RANK.child for --spawn_child, DIR/pid.RANK.setsid
// for --spawn_setsid: a grandchild in a session of its own) once it is ready.
// --clear_env: that grandchild also execs itself with an empty environment.
// fail --error_file TEXT: the failing rank writes TEXT to $ACCEL_ERROR_FILE first; --bad_utf8: it
// also writes a stderr line that is not UTF-8; --error_nested N: it writes {"message": [[[...]]]}
// with N nested arrays there; --error_link TARGET: it plants symbolic links to TARGET at
// $ACCEL_ERROR_FILE.tmp (the name accel-run used for its temporary) and, with --error_fifo, makes
// $ACCEL_ERROR_FILE a FIFO.
// Every wait is bounded (kMaxWaitSeconds) so that a broken launcher cannot leave processes behind.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr double kMaxWaitSeconds = 60.0;
constexpr int kTimeoutExit = 99;

std::map<std::string, std::string> g_opts;
std::string g_dir;
int g_rank = 0;

std::string opt(const std::string& k, const std::string& def = "") {
  auto it = g_opts.find(k);
  return it == g_opts.end() ? def : it->second;
}
bool flag(const std::string& k) { return g_opts.count(k) != 0; }

std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

void write_file_atomic(const std::string& path, const std::string& text) {
  std::ofstream f(path + ".tmp");
  f << text;
  f.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

void append_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::app);
  f << text;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

[[noreturn]] void wait_forever() {
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         kMaxWaitSeconds) {
    sleep_s(0.05);
  }
  std::fprintf(stderr, "worker rank %d: waited %g s without being stopped\n", g_rank,
               kMaxWaitSeconds);
  _exit(kTimeoutExit);
}

void write_pid_files() {
  if (g_dir.empty()) return;
  if (flag("spawn_child")) {
    pid_t c = fork();
    if (c == 0) {
      // The grandchild stays in the worker's process group and keeps the output pipes open.
      wait_forever();
    }
    write_file_atomic(g_dir + "/pid." + std::to_string(g_rank) + ".child", std::to_string(c));
  }
  if (flag("spawn_setsid")) {
    // Leaves the worker's process group and session: only the launch marker or a cgroup finds it.
    // The intermediate child exits so that the grandchild is reparented away from the worker.
    int p[2];
    if (pipe(p) != 0) std::exit(70);
    pid_t mid = fork();
    if (mid == 0) {
      close(p[0]);
      setsid();
      pid_t g = fork();
      if (g == 0) {
        for (int fd = 0; fd < 3; ++fd) close(fd);  // a daemon: holds none of the worker's pipes
        if (flag("clear_env")) {
          // ...that also drops its environment (and with it the launch marker): only the job
          // cgroup can find it.
          char self[] = "launcher_worker", mode[] = "sleep";
          char* args[] = {self, mode, nullptr};
          char* no_env[] = {nullptr};
          execve("/proc/self/exe", args, no_env);
          _exit(73);
        }
        wait_forever();
      }
      if (write(p[1], &g, sizeof(g)) != sizeof(g)) _exit(71);
      _exit(0);
    }
    close(p[1]);
    pid_t g = -1;
    if (read(p[0], &g, sizeof(g)) != sizeof(g)) std::exit(72);
    close(p[0]);
    waitpid(mid, nullptr, 0);
    write_file_atomic(g_dir + "/pid." + std::to_string(g_rank) + ".setsid", std::to_string(g));
  }
  write_file_atomic(g_dir + "/pid." + std::to_string(g_rank), std::to_string(getpid()));
}

const char* kContract[] = {"RANK",
                           "WORLD_SIZE",
                           "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE",
                           "GROUP_RANK",
                           "NODE_RANK",
                           "GROUP_WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "ACCEL_DISTRIBUTED_TYPE",
                           "ACCEL_MIXED_PRECISION",
                           "ACCEL_USE_CPU",
                           "ACCEL_ZERO_STAGE",
                           "ACCEL_GRADIENT_ACCUMULATION_STEPS",
                           "ACCEL_RESTART_COUNT",
                           "ACCEL_MAX_RESTARTS",
                           "OMP_NUM_THREADS",
                           "CUDA_VISIBLE_DEVICES",
                           "ACCEL_RENDEZVOUS_TOKEN",
                           "ACCEL_ERROR_FILE",
                           "TORCHELASTIC_ERROR_FILE",
                           "ACCEL_LAUNCH_ID",
                           "ACCEL_PARAM_DTYPE",
                           "ACCEL_REDUCE_DTYPE",
                           "ACCEL_FSDP_WRAP",
                           "ACCEL_FSDP_WRAP_CLASSES",
                           "ACCEL_FSDP_MIN_PARAMS",
                           "ACCEL_FSDP_RESHARD_AFTER_FORWARD",
                           "ACCEL_FSDP_PREFETCH",
                           "ACCEL_FSDP_ACTIVATION_CHECKPOINTING",
                           "ACCEL_DP_REPLICATE_SIZE",
                           "ACCEL_DP_SHARD_SIZE",
                           "ACCEL_TP_SIZE"};

void write_env_file() {
  if (g_dir.empty()) return;
  std::string text;
  for (const char* k : kContract) {
    if (std::getenv(k)) text += std::string(k) + "=" + env(k) + "\n";
  }
  write_file_atomic(g_dir + "/env." + std::to_string(g_rank), text);
}

int mode_env() {
  write_env_file();
  std::printf("hello from rank %d of %s\n", g_rank, env("WORLD_SIZE").c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "note from rank %d\n", g_rank);
  // A last line without a newline: the launcher must still print it, prefixed.
  std::printf("partial line from rank %d", g_rank);
  std::fflush(stdout);
  return std::atoi(opt("exit", "0").c_str());
}

int mode_fail() {
  const int fail_rank = std::atoi(opt("fail_rank", "0").c_str());
  if (g_rank != fail_rank && flag("ignore_term")) std::signal(SIGTERM, SIG_IGN);
  write_pid_files();
  if (g_rank != fail_rank) wait_forever();
  for (int i = 0; i < 12; ++i) std::fprintf(stderr, "detail %d of rank %d\n", i, g_rank);
  if (flag("bad_utf8")) std::fprintf(stderr, "bytes that are not UTF-8: \xff\xfe\xc3\n");
  if (flag("error_file")) {
    std::ofstream f(env("ACCEL_ERROR_FILE"));
    f << opt("error_file");
  }
  if (flag("error_nested")) {
    const size_t n = size_t(std::atol(opt("error_nested").c_str()));
    std::ofstream f(env("ACCEL_ERROR_FILE"));
    f << "{\"message\": " << std::string(n, '[') << std::string(n, ']') << "}";
  }
  if (flag("error_link"))
    symlink(opt("error_link").c_str(), (env("ACCEL_ERROR_FILE") + ".tmp").c_str());
  if (flag("error_fifo")) mkfifo(env("ACCEL_ERROR_FILE").c_str(), 0600);
  sleep_s(std::atof(opt("delay", "0.2").c_str()));
  if (flag("signal")) {
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(SIGSEGV, SIG_DFL);
    raise(std::atoi(opt("signal").c_str()));
  }
  return std::atoi(opt("code", "3").c_str());
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

int mode_usr1() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  write_pid_files();
  auto start = std::chrono::steady_clock::now();
  while (g_signal != SIGUSR1) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kMaxWaitSeconds) {
      return kTimeoutExit;
    }
    sleep_s(0.01);
  }
  // A real program would save a checkpoint here before its allocation ends.
  write_file_atomic(g_dir + "/usr1." + std::to_string(g_rank), "checkpoint");
  std::printf("rank %d saved a checkpoint after SIGUSR1\n", g_rank);
  return 0;
}

[[noreturn]] void mode_flood() {
  write_pid_files();
  const std::string line(200, 'x');
  auto start = std::chrono::steady_clock::now();
  long long n = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         kMaxWaitSeconds) {
    std::printf("%lld %s\n", n++, line.c_str());
  }
  _exit(kTimeoutExit);
}

int mode_trap() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  write_pid_files();
  auto start = std::chrono::steady_clock::now();
  while (g_signal == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kMaxWaitSeconds) {
      return kTimeoutExit;
    }
    sleep_s(0.01);
  }
  write_file_atomic(g_dir + "/sig." + std::to_string(g_rank),
                    std::to_string(static_cast<int>(g_signal)));
  std::printf("rank %d stopping after signal %d\n", g_rank, static_cast<int>(g_signal));
  return 0;
}

int mode_restart() {
  const int attempt = std::atoi(env("ACCEL_RESTART_COUNT").c_str());
  const int steps = std::atoi(opt("steps", "6").c_str());
  const int crash_times = std::atoi(opt("crash_times", "1").c_str());
  append_file(g_dir + "/attempts." + std::to_string(g_rank), std::to_string(attempt) + "\n");
  write_pid_files();
  write_file_atomic(g_dir + "/ready." + std::to_string(attempt) + "." + std::to_string(g_rank),
                    "1");
  if (g_rank != 0) {
    auto start = std::chrono::steady_clock::now();
    while (access((g_dir + "/done").c_str(), F_OK) != 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
          kMaxWaitSeconds) {
        return kTimeoutExit;
      }
      sleep_s(0.01);
    }
    return 0;
  }
  // Rendezvous: a real program meets its peers before training; the crash comes after that.
  const int world = std::atoi(env("WORLD_SIZE").c_str());
  auto wait_start = std::chrono::steady_clock::now();
  while (true) {
    int ready = 0;
    for (int r = 0; r < world; ++r) {
      ready +=
          access((g_dir + "/ready." + std::to_string(attempt) + "." + std::to_string(r)).c_str(),
                 F_OK) == 0;
    }
    if (ready == world) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count() >
        kMaxWaitSeconds) {
      return kTimeoutExit;
    }
    sleep_s(0.005);
  }
  int step = 0;
  {
    std::ifstream ck(g_dir + "/ckpt");
    ck >> step;  // load_state: resume where the last attempt stopped
  }
  std::printf("rank 0 attempt %d resumes at step %d\n", attempt, step);
  std::fflush(stdout);
  // Attempt k crashes after reaching step (k+1) * steps / (crash_times+1).
  const int crash_at = attempt < crash_times ? (attempt + 1) * steps / (crash_times + 1) : -1;
  for (; step < steps; ++step) {
    if (step == crash_at) {
      std::fprintf(stderr, "rank 0 crashing at step %d on attempt %d\n", step, attempt);
      return 1;
    }
    write_file_atomic(g_dir + "/ckpt", std::to_string(step + 1));  // save_state after every step
  }
  write_file_atomic(g_dir + "/done", "1");
  return 0;
}

int connect_to(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

std::string read_line(int fd) {
  std::string s;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

void send_line(int fd, const std::string& s) {
  std::string t = s + "\n";
  if (write(fd, t.data(), t.size()) != static_cast<ssize_t>(t.size())) std::perror("write");
}

int mode_handshake() {
  write_env_file();
  write_pid_files();
  const int world = std::atoi(env("WORLD_SIZE").c_str());
  const std::string addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  // What every rank reports; rank 0 checks that all agree on the world and the master.
  std::string me = std::to_string(g_rank) + " " + env("WORLD_SIZE") + " " + env("LOCAL_RANK") +
                   " " + env("LOCAL_WORLD_SIZE") + " " + env("GROUP_RANK") + " " + addr + ":" +
                   port;
  if (g_rank == 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    if (getaddrinfo(addr.c_str(), port.c_str(), &hints, &res) != 0) {
      std::fprintf(stderr, "cannot resolve %s\n", addr.c_str());
      return 10;
    }
    int ls = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(ls, res->ai_addr, res->ai_addrlen) != 0 || listen(ls, 64) != 0) {
      std::fprintf(stderr, "rank 0 cannot listen on %s:%s: %s\n", addr.c_str(), port.c_str(),
                   std::strerror(errno));
      return 11;
    }
    freeaddrinfo(res);
    timeval tv{20, 0};
    setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::set<int> seen;
    std::vector<int> peers;
    for (int i = 1; i < world; ++i) {
      int c = accept(ls, nullptr, nullptr);
      if (c < 0) {
        std::fprintf(stderr, "rank 0: only %zu of %d peers arrived\n", seen.size(), world - 1);
        return 12;
      }
      std::istringstream is(read_line(c));
      int r = -1, w = -1;
      std::string lr, lws, gr, master;
      is >> r >> w >> lr >> lws >> gr >> master;
      if (r <= 0 || r >= world || w != world || master != addr + ":" + port ||
          !seen.insert(r).second) {
        std::fprintf(stderr, "rank 0: bad or duplicate hello '%s'\n", is.str().c_str());
        return 13;
      }
      std::printf("rank 0 met rank %d (local_rank %s, machine %s)\n", r, lr.c_str(), gr.c_str());
      peers.push_back(c);
    }
    for (int c : peers) {
      send_line(c, "ok " + std::to_string(world));
      close(c);
    }
    close(ls);
  } else {
    int fd = -1;
    auto start = std::chrono::steady_clock::now();
    while ((fd = connect_to(addr, port)) < 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > 20) {
        std::fprintf(stderr, "rank %d cannot reach %s:%s\n", g_rank, addr.c_str(), port.c_str());
        return 14;
      }
      sleep_s(0.02);
    }
    send_line(fd, me);
    std::string reply = read_line(fd);
    close(fd);
    if (reply != "ok " + std::to_string(world)) {
      std::fprintf(stderr, "rank %d: bad reply '%s'\n", g_rank, reply.c_str());
      return 15;
    }
  }
  std::printf("check handshake rank %d of %d: ok\n", g_rank, world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: launcher_worker MODE [--key value | --flag]...\n");
    return 64;
  }
  const std::string mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0) continue;
    const std::string key(argv[i] + 2);
    const bool has_value = i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0;
    g_opts[key] = has_value ? std::string(argv[++i]) : std::string("1");
  }
  g_dir = opt("dir");
  g_rank = std::atoi(env("RANK").c_str());
  if (mode == "env") return mode_env();
  if (mode == "fail") return mode_fail();
  if (mode == "trap") return mode_trap();
  if (mode == "restart") return mode_restart();
  if (mode == "handshake") return mode_handshake();
  if (mode == "usr1") return mode_usr1();
  if (mode == "flood") mode_flood();
  if (mode == "sleep") {
    write_pid_files();
    if (flag("stop_rank") && std::atoi(opt("stop_rank").c_str()) == g_rank) {
      raise(SIGSTOP);
      if (flag("exit_when_continued")) return 0;
    }
    wait_forever();
  }
  std::fprintf(stderr, "launcher_worker: unknown mode '%s'\n", mode.c_str());
  return 64;
}
