// accel-run: config parsing and questionnaire, SLURM/OpenMPI placement, and end-to-end launches
// of tests/launcher/launcher_worker through the real binary (teardown timing, no orphans,
// restarts, signal forwarding, two machines on loopback).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/cluster.h"
#include "launcher/config.h"
#include "launcher/output.h"
#include "launcher/plan.h"
#include "launcher/supervisor.h"
#include "launcher/util.h"
#include "tests/common/util.h"

namespace fs = std::filesystem;
namespace al = accel::launcher;
using Clock = std::chrono::steady_clock;
using accel::test::contains;
using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;

namespace {

// ACCEL_RUN_UNDER_TEST runs the suite against another build (e.g. the previous version, to see
// that a new test fails there).
const std::string kAccelRun =
    std::getenv("ACCEL_RUN_UNDER_TEST") ? std::getenv("ACCEL_RUN_UNDER_TEST") : ACCEL_RUN_PATH;
const std::string kWorker = LAUNCHER_WORKER_PATH;
const std::string kFsdpEnvWorker = FSDP_ENV_WORKER_PATH;
const std::string kSelftestBuilt = ACCEL_SELFTEST_BUILD_PATH;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::map<std::string, std::string> read_env_file(const std::string& p) {
  std::map<std::string, std::string> out;
  std::istringstream is(read_file(p));
  std::string line;
  while (std::getline(is, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

// Running and not a zombie.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

std::vector<pid_t> read_pids(const TempDir& dir) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    if (e.path().filename().string().rfind("pid.", 0) == 0)
      out.push_back(std::stoi(read_file(e.path().string())));
  }
  return out;
}

size_t count_files(const TempDir& dir, const std::string& prefix) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) ++n;
  }
  return n;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  auto start = Clock::now();
  while (since(start) < seconds) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Result {
  int status = -1;
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
};

// TMPDIR of every accel-run the tests start: the error files of failed launches are kept in a
// temporary directory, which is removed with this one when the test program ends.
const std::string& tmp_root() {
  static TempDir dir;
  return dir.path.native();
}

// A token as `accel-run token` prints it, for the launches spanning several accel-runs.
const std::string kToken = "0123456789abcdef0123456789abcdef";

// One accel-run process with captured stdout/stderr and optional stdin text.
class Proc {
 public:
  Proc(std::vector<std::string> args, std::map<std::string, std::string> env = {},
       std::string input = "", std::string exe = kAccelRun) {
    if (!env.count("TMPDIR")) env["TMPDIR"] = tmp_root();
    int out[2], err[2], in[2];
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(pipe2(err, O_CLOEXEC) == 0);
    REQUIRE(pipe2(in, O_CLOEXEC) == 0);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      std::string k = kv.substr(0, kv.find('='));
      // Tests never see the developer's config or an outer cluster launcher.
      if (env.count(k) || k == "ACCEL_CONFIG_FILE" || k == "XDG_CACHE_HOME" ||
          k.rfind("SLURM_", 0) == 0 || k.rfind("OMPI_", 0) == 0 || k == "ACCEL_SELFTEST" ||
          k == "ACCEL_RENDEZVOUS_TOKEN" || k == "MASTER_PORT" || k == "MASTER_ADDR" ||
          k.rfind("ACCEL_LAUNCH_ID", 0) == 0 || k.find("ERROR_FILE") != std::string::npos) {
        continue;
      }
      envs.push_back(kv);
    }
    for (const auto& [k, v] : env) {
      if (v != "<unset>") envs.push_back(k + "=" + v);
    }
    args.insert(args.begin(), exe);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    start_ = Clock::now();
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) std::signal(s, SIG_DFL);
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(argv[0], argv.data(), envp.data());
      _exit(126);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    out_ = out[0];
    err_ = err[0];
    if (!input.empty()) {
      ssize_t n = write(in[1], input.data(), input.size());
      CHECK(n == static_cast<ssize_t>(input.size()));
    }
    close(in[1]);
  }

  pid_t pid() const { return pid_; }
  // finish() leaves stdout unread (a pipe nobody reads, as behind a stalled pager).
  void ignore_stdout() { read_out_ = false; }

  Result finish(double timeout_s = 30) {
    Result r;
    int fds[2] = {read_out_ ? out_ : -1, err_};
    std::string* bufs[2] = {&r.out, &r.err};
    bool timed_out = false;
    while (fds[0] >= 0 || fds[1] >= 0) {
      pollfd p[2];
      int n = 0;
      int idx[2];
      for (int i = 0; i < 2; ++i) {
        if (fds[i] >= 0) {
          p[n] = {fds[i], POLLIN, 0};
          idx[n++] = i;
        }
      }
      double left = timeout_s - since(start_);
      if (left <= 0) {
        timed_out = true;
        kill(pid_, SIGKILL);
        break;
      }
      poll(p, n, static_cast<int>(left * 1000) + 1);
      for (int j = 0; j < n; ++j) {
        if (!(p[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        ssize_t got = read(fds[idx[j]], buf, sizeof(buf));
        if (got > 0) {
          bufs[idx[j]]->append(buf, static_cast<size_t>(got));
        } else {
          close(fds[idx[j]]);
          fds[idx[j]] = -1;
        }
      }
    }
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    if (!read_out_) close(out_);
    waitpid(pid_, &r.status, 0);
    r.seconds = since(start_);
    r.code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status);
    CHECK_MESSAGE(!timed_out, "accel-run did not finish within ", timeout_s, " s; stderr:\n",
                  r.err);
    return r;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool read_out_ = true;
  Clock::time_point start_;
};

Result accel_run(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                 std::string input = "", double timeout_s = 30) {
  Proc p(std::move(args), std::move(env), std::move(input));
  return p.finish(timeout_s);
}

std::vector<std::string> launch_args(std::vector<std::string> flags,
                                     std::vector<std::string> worker) {
  std::vector<std::string> a = {"launch"};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back(kWorker);
  a.insert(a.end(), worker.begin(), worker.end());
  return a;
}

void check_no_orphans(const TempDir& dir, size_t expected) {
  auto pids = read_pids(dir);
  CHECK(pids.size() == expected);
  // The launcher has exited, so everything it started must already be gone (allow the kernel a
  // moment to finish delivering SIGKILL to reparented grandchildren).
  for (pid_t p : pids)
    CHECK_MESSAGE(wait_for([&] { return !alive(p); }, 1.0), "process ", p, " survived accel-run");
}

al::EnvMap env_of(std::initializer_list<std::pair<const std::string, std::string>> kv) {
  return al::EnvMap(kv);
}

}  // namespace

// ---------------------------------------------------------------- config

TEST_CASE("config: save and load round trip every key") {
  TempDir dir;
  al::LaunchConfig c;
  c.distributed_type = "MULTI_GPU";
  c.num_machines = 2;
  c.num_processes = 8;
  c.machine_rank = 1;
  c.main_process_ip = "10.1.2.3";
  c.main_process_port = 29555;
  c.set("mixed_precision", "bf16");
  c.set("use_cpu", "false");
  c.gpu_ids = "0,2,3,5";
  c.same_network = false;
  c.main_training_function = "train";
  c.set("gradient_accumulation_steps", "4");
  c.set("zero_config.zero_stage", "2");
  c.max_restarts = 3;
  c.monitor_interval = 0.5;
  c.num_cpu_threads_per_process = 6;
  c.set("zero_config.param_dtype", "fp16");
  c.set("zero_config.reduce_dtype", "fp32");
  c.set("fsdp_config.fsdp_wrap", "classes");
  c.set("fsdp_config.fsdp_wrap_classes", "Block,Layer");
  c.set("fsdp_config.fsdp_reshard_after_forward", "false");
  c.set("fsdp_config.fsdp_prefetch", "false");
  c.set("fsdp_config.fsdp_activation_checkpointing", "true");
  c.set("--dp_replicate_size", "2");
  c.set("--tp_size", "4");
  const std::string path = dir / "sub/dir/cfg.yaml";  // parents are created
  al::save_config(c, path);
  al::LaunchConfig back = al::load_config(path);
  CHECK(back == c);
  CHECK(contains(read_file(path), "mixed_precision: 'bf16'"));
  CHECK(contains(read_file(path), "zero_config:\n  zero_stage: 2\n  param_dtype: 'fp16'"));
  CHECK(contains(read_file(path), "fsdp_config:"));
  CHECK(contains(read_file(path), "  fsdp_wrap_classes: 'Block,Layer'\n"));
  CHECK(contains(read_file(path),
                 "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_tp_size: 4\n"));
  c.set("fsdp_config.fsdp_wrap", "min_params");
  c.set("fsdp_config.fsdp_wrap_classes", std::nullopt);
  c.set("fsdp_config.fsdp_min_params", "123456789012");
  al::save_config(c, path);
  CHECK(al::load_config(path) == c);

  al::LaunchConfig defaults;
  al::save_config(defaults, path);
  CHECK(al::load_config(path) == defaults);
  CHECK(contains(read_file(path), "main_process_ip: null"));
  // Unset ZeRO options are not written (and not exported): the program's choice stands.
  CHECK(!contains(read_file(path), "fsdp"));
  CHECK(!contains(read_file(path), "dtype"));
  CHECK(!contains(read_file(path), "parallelism"));
}

TEST_CASE("config: an Accelerate default_config.yaml loads") {
  const std::string text =
      "compute_environment: LOCAL_MACHINE\n"
      "debug: false\n"
      "distributed_type: MULTI_GPU\n"
      "downcast_bf16: 'no'\n"
      "enable_cpu_affinity: false\n"
      "gpu_ids: all\n"
      "machine_rank: 0\n"
      "main_training_function: main\n"
      "mixed_precision: no\n"  // unquoted on purpose: YAML 1.1 would read a boolean
      "num_machines: 1\n"
      "num_processes: 2\n"
      "rdzv_backend: static\n"
      "same_network: true\n"
      "tpu_env: []\n"
      "tpu_use_cluster: false\n"
      "tpu_use_sudo: false\n"
      "use_cpu: false\n";
  al::LaunchConfig c = al::parse_config(text, "accelerate.yaml");
  CHECK(c.distributed_type == "MULTI_GPU");
  CHECK(c.num_processes == 2);
  CHECK(c.get("mixed_precision") == "no");
  CHECK(c.gpu_ids == "all");
  CHECK(!c.main_process_ip);
  CHECK(al::parse_config("", "empty.yaml") == al::LaunchConfig{});
  CHECK(al::parse_config("gpu_ids: [1, 0]\n", "x").gpu_ids == "1,0");
  CHECK(al::parse_config("gpu_ids: 3\n", "x").gpu_ids == "3");

  // Accelerate's fsdp_config: its names for our settings are read, its other FSDP keys accepted
  // with the values that describe what accel does (and refused otherwise: the bad-config cases).
  const std::string fsdp =
      "fsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_transformer_layer_cls_to_wrap: [Block, Layer]\n"
      "  fsdp_activation_checkpointing: true\n"
      "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"
      "  fsdp_offload_params: false\n"
      "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
      "  fsdp_version: 2\n";
  const al::LaunchConfig f = al::parse_config(fsdp, "accelerate.yaml");
  CHECK(f.get("fsdp_config.fsdp_wrap") == std::optional<std::string>("classes"));
  CHECK(f.get("fsdp_config.fsdp_wrap_classes") == std::optional<std::string>("Block,Layer"));
  CHECK(f.get_bool("fsdp_config.fsdp_activation_checkpointing") == std::optional<bool>(true));
  CHECK(f.get_bool("fsdp_config.fsdp_reshard_after_forward") == std::optional<bool>(false));
  CHECK(!f.get_bool("fsdp_config.fsdp_prefetch"));
  const al::LaunchConfig acc = al::parse_config(
      "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_backward_prefetch: "
      "NO_PREFETCH\n  fsdp_forward_prefetch: false\n  fsdp_sync_module_states: true\n"
      "  fsdp_use_orig_params: true\ndebug: false\ndowncast_bf16: 'no'\ntpu_env: []\n"
      "dynamo_config: {dynamo_backend: 'NO'}\nipex_config: {ipex: false}\n"
      "parallelism_config: {parallelism_config_tp_size: 1}\n",
      "x");
  CHECK(acc.get_bool("fsdp_config.fsdp_reshard_after_forward") == std::optional<bool>(false));
  CHECK(acc.get_bool("fsdp_config.fsdp_prefetch") == std::optional<bool>(false));
  const al::LaunchConfig size = al::parse_config(
      "fsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1000\n", "x");
  CHECK(size.get("fsdp_config.fsdp_wrap") == std::optional<std::string>("min_params"));
  CHECK(size.get_int("fsdp_config.fsdp_min_params") == std::optional<long long>(1000));
  // fsdp_wrap_classes alone implies the classes policy.
  CHECK(al::parse_config("fsdp_config:\n  fsdp_wrap_classes: Block\n", "x")
            .get("fsdp_config.fsdp_wrap") == std::optional<std::string>("classes"));
}

TEST_CASE("config: malformed files name the key, the line and what is accepted") {
  struct Case {
    std::string yaml;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"num_processes: two\n", {"[config]", "bad.yaml:1", "'num_processes'", "'two'"}},
      {"num_machines: 1\nnum_processes: 0\n", {"bad.yaml:2", "'num_processes'", "[1, "}},
      {"mixed_precision: fp8\n", {"'mixed_precision'", "no, fp16, bf16", "'fp8'"}},
      {"distributed_type: DEEPSPEED\n", {"'distributed_type'", "NO, MULTI_CPU, MULTI_GPU"}},
      {"zero_config:\n  zero_stage: 5\n", {"bad.yaml:2", "'zero_config.zero_stage'", "[0, 3]"}},
      {"zero_config:\n  stage: 1\n", {"'zero_config.stage'", "unknown key"}},
      {"zero_config: 2\n", {"'zero_config'", "mapping"}},
      {"num_proceses: 2\n", {"'num_proceses'", "did you mean 'num_processes'"}},
      {"totally_unknown_thing: 1\n", {"'totally_unknown_thing'", "unknown key"}},
      {"use_cpu: maybe\n", {"'use_cpu'", "true or false", "'maybe'"}},
      {"gpu_ids: 0,x\n", {"'gpu_ids'", "comma-separated"}},
      {"gpu_ids: 1,1\n", {"'gpu_ids'", "listed twice"}},
      {"main_process_port: 70000\n", {"'main_process_port'", "65535"}},
      {"num_processes: [1, 2]\n", {"'num_processes'", "got a list"}},
      {"num_machines: 2\nnum_processes: 3\n", {"'num_processes'", "multiple of num_machines (2)"}},
      {"num_machines: 2\nnum_processes: 2\nmachine_rank: 2\n", {"'machine_rank'", "[0, 1]"}},
      {"rdzv_backend: c10d\n", {"'rdzv_backend'", "static"}},
      {"compute_environment: AMAZON_SAGEMAKER\n", {"'compute_environment'", "LOCAL_MACHINE"}},
      {"num_processes: 2\nnum_processes: 3\n", {"'num_processes'", "given twice"}},
      {"num_processes: [2\n", {"bad.yaml:", "YAML syntax error"}},
      {"- a\n- b\n", {"mapping of keys"}},
      {"monitor_interval: -1\n", {"'monitor_interval'"}},
      {"zero_config:\n  param_dtype: fp8\n",
       {"bad.yaml:2", "'zero_config.param_dtype'", "bf16, fp16, fp32", "'fp8'"}},
      {"zero_config:\n  reduce_dtype: bf16\n", {"'zero_config.reduce_dtype'", "param", "fp32"}},
      {"fsdp_config: [1]\n", {"'fsdp_config'", "mapping"}},
      {"fsdp_config:\n  fsdp_wrap: layers\n",
       {"bad.yaml:2", "'fsdp_config.fsdp_wrap'", "entries, classes, min_params, none", "'layers'"}},
      {"fsdp_config:\n  fsdp_wrap: classes\n", {"'fsdp_config.fsdp_wrap'", "fsdp_wrap_classes"}},
      {"fsdp_config:\n  fsdp_wrap: entries\n  fsdp_min_params: 10\n",
       {"'fsdp_config.fsdp_min_params'", "only with fsdp_wrap: min_params", "entries"}},
      {"fsdp_config:\n  fsdp_wrap_classes: Block\n  fsdp_min_params: 10\n",
       {"'fsdp_config'", "two different wrap policies"}},
      {"fsdp_config:\n  fsdp_min_params: 0\n", {"'fsdp_config.fsdp_min_params'", "[1, "}},
      {"fsdp_config:\n  fsdp_wrap_classes: 'Block,,Layer'\n",
       {"'fsdp_config.fsdp_wrap_classes'", "class names"}},
      {"fsdp_config:\n  fsdp_prefetch: sometimes\n",
       {"'fsdp_config.fsdp_prefetch'", "true or false", "'sometimes'"}},
      {"fsdp_config:\n  fsdp_wrp: none\n", {"'fsdp_config.fsdp_wrp'", "did you mean 'fsdp_wrap'"}},
      {"fsdp_config:\n  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_wrap: none\n",
       {"'fsdp_config.fsdp_wrap'", "given already"}},
      {"fsdp_config:\n  fsdp_auto_wrap_policy: BLOCK_WRAP\n",
       {"'fsdp_config.fsdp_auto_wrap_policy'", "TRANSFORMER_BASED_WRAP"}},
      // Issue 22, item 14: Accelerate keys and values accel does not implement are refused with
      // the key, the value and what is supported (Note [accelerate keys accel does not
      // implement]), never accepted and ignored.
      {"fsdp_config:\n  fsdp_offload_params: true\n",
       {"bad.yaml:2", "'fsdp_config.fsdp_offload_params'", "'true'", "no CPU offload",
        "supported: false"}},
      {"fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n",
       {"'fsdp_config.fsdp_sharding_strategy'", "'HYBRID_SHARD'", "hybrid", "FULL_SHARD"}},
      {"fsdp_config:\n  fsdp_sharding_strategy: 5\n",
       {"'fsdp_config.fsdp_sharding_strategy'", "hybrid"}},
      {"fsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n",
       {"'fsdp_config.fsdp_sharding_strategy'", "zero_stage 0"}},
      {"fsdp_config:\n  fsdp_reshard_after_forward: HYBRID_SHARD\n",
       {"'fsdp_config.fsdp_reshard_after_forward'", "hybrid"}},
      {"fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: true\n",
       {"'fsdp_config.fsdp_reshard_after_forward'", "given already",
        "fsdp_config.fsdp_sharding_strategy"}},
      {"fsdp_config:\n  fsdp_state_dict_type: FULL_STATE_DICT\n",
       {"'fsdp_config.fsdp_state_dict_type'", "'FULL_STATE_DICT'", "SHARDED_STATE_DICT"}},
      {"fsdp_config:\n  fsdp_sync_module_states: false\n",
       {"'fsdp_config.fsdp_sync_module_states'", "supported: true"}},
      {"fsdp_config:\n  fsdp_use_orig_params: false\n",
       {"'fsdp_config.fsdp_use_orig_params'", "supported: true"}},
      {"fsdp_config:\n  fsdp_version: 1\n", {"'fsdp_config.fsdp_version'", "supported: 2"}},
      {"fsdp_config:\n  fsdp_cpu_ram_efficient_loading: true\n",
       {"'fsdp_config.fsdp_cpu_ram_efficient_loading'", "DeferredInit", "load_model"}},
      {"fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_POST\n",
       {"'fsdp_config.fsdp_backward_prefetch'", "BACKWARD_PRE", "NO_PREFETCH"}},
      {"fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_forward_prefetch: false\n",
       {"'fsdp_config.fsdp_forward_prefetch'", "fsdp_config.fsdp_backward_prefetch", "agree"}},
      {"fsdp_config:\n  fsdp_prefetch: false\n  fsdp_backward_prefetch: BACKWARD_PRE\n",
       {"'fsdp_config.fsdp_backward_prefetch'", "agree"}},
      {"deepspeed_config:\n  zero_stage: 2\n",
       {"'deepspeed_config'", "DeepSpeed", "zero_config.zero_stage"}},
      {"debug: true\n", {"'debug'", "'true'", "accepted only when off"}},
      {"enable_cpu_affinity: true\n", {"'enable_cpu_affinity'", "CPUs"}},
      {"dynamo_config:\n  dynamo_backend: INDUCTOR\n", {"'dynamo_config'", "dynamo"}},
      {"tpu_name: my-pod\n", {"'tpu_name'", "'my-pod'", "TPU"}},
      {"use_mps_device: true\n", {"'use_mps_device'", "MPS"}},
      {"parallelism_config:\n  parallelism_config_cp_size: 0\n",
       {"bad.yaml:2", "'parallelism_config.parallelism_config_cp_size'", "a size >= 1"}},
      {"parallelism_config:\n  parallelism_config_tp_size: 2.5\n",
       {"'parallelism_config.parallelism_config_tp_size'", "a size >= 1", "'2.5'"}},
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.yaml);
    std::string msg;
    try {
      al::parse_config(tc.yaml, "bad.yaml");
    } catch (const al::ConfigError& e) {
      msg = e.what();
    }
    REQUIRE_MESSAGE(!msg.empty(), "no ConfigError for:\n", tc.yaml);
    for (const auto& want : tc.expect)
      CHECK_MESSAGE(contains(msg, want), "'", want, "' not in: ", msg);
  }
  CHECK_THROWS_AS(al::load_config("/nonexistent/accel.yaml"), accel::IoError);
}

TEST_CASE("config: default path respects ACCEL_CONFIG_FILE, XDG_CACHE_HOME and HOME") {
  CHECK(al::default_config_path(env_of({{"HOME", "/h"}})) == "/h/.cache/accel/default_config.yaml");
  CHECK(al::default_config_path(env_of({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}})) ==
        "/x/accel/default_config.yaml");
  CHECK(al::default_config_path(env_of({{"HOME", "/h"}, {"ACCEL_CONFIG_FILE", "/c.yaml"}})) ==
        "/c.yaml");
  CHECK_THROWS_AS(al::default_config_path(env_of({})), al::ConfigError);
}

TEST_CASE("config: questionnaire re-asks invalid answers and writes what was answered") {
  // compute env, type (7 invalid, then multi-CPU), machines 2, rank (5 invalid, then 1), address,
  // port (default), same network (maybe invalid, then no), processes (3 invalid: not a multiple
  // of 2, then 4), replicas (3 invalid: does not divide 4, then 2), cp (the default 1), tp (4
  // invalid: does not divide the 2 processes per replica, then the default 1), pp (the default
  // 1), ZeRO (9 invalid, then 2), param
  // dtype bf16, reduce dtype (yes invalid, then fp32), accumulation 4, precision (fp8 invalid,
  // then bf16).
  std::istringstream in(
      "\n7\n1\n2\n5\n1\n10.0.0."
      "7\n\nmaybe\nno\n3\n4\n3\n2\n\n4\n\n\n9\n2\nbf16\nyes\nfp32\n4\nfp8\nbf16\n");
  std::ostringstream out;
  al::LaunchConfig c = al::run_questionnaire(in, out, 0);
  const std::string log = out.str();
  CHECK(contains(log, "Invalid answer '7'"));
  CHECK(contains(log, "Invalid answer '5'"));
  CHECK(contains(log, "Invalid answer 'maybe'"));
  CHECK(contains(log,
                 "Invalid answer '3': the total must be a multiple of the number of machines (2)"));
  // The mesh sizes by the rule accel-run applies at launch (Note [cross-row rules]).
  CHECK(contains(log,
                 "Invalid answer '3': parallelism_config (--pp_size, --dp_replicate_size, "
                 "--dp_shard_size, --cp_size, --tp_size) does not fit 4 processes: pp_size unset, "
                 "dp_replicate_size 3"));
  CHECK(contains(log,
                 "Invalid answer '4': parallelism_config (--pp_size, --dp_replicate_size, "
                 "--dp_shard_size, --cp_size, --tp_size) does not fit 4 processes: pp_size unset, "
                 "dp_replicate_size 2"));
  CHECK(contains(log, "Invalid answer 'yes'"));
  CHECK(contains(log, "Invalid answer '9'"));
  CHECK(contains(log, "Invalid answer 'fp8'"));
  CHECK(c.distributed_type == "MULTI_CPU");
  CHECK(c.use_cpu());
  CHECK(c.num_machines == 2);
  CHECK(c.machine_rank == 1);
  CHECK(c.main_process_ip == std::optional<std::string>("10.0.0.7"));
  CHECK(c.main_process_port == std::optional<int>(29500));
  CHECK(!c.same_network);
  CHECK(c.num_processes == 4);
  CHECK(c.get_int("zero_config.zero_stage") == 2);
  CHECK(c.get_int("gradient_accumulation_steps") == 4);
  CHECK(c.get("mixed_precision") == "bf16");
  CHECK(c.get("zero_config.param_dtype") == std::optional<std::string>("bf16"));
  CHECK(c.get("zero_config.reduce_dtype") == std::optional<std::string>("fp32"));
  CHECK(!c.get("fsdp_config.fsdp_wrap"));  // stage 2: no ZeRO-3 questions
  CHECK(c.get_int("--dp_replicate_size") == std::optional<int>(2));
  CHECK(!c.get_int("--dp_shard_size"));  // the rest of the processes, inferred at launch
  CHECK(!c.get_int("--tp_size"));        // the default 1 is not written
  CHECK(al::parse_config(al::config_to_yaml(c), "q1") == c);

  // ZeRO-3: multi-CPU, 1 machine, 2 processes, mesh defaults (replicas, cp, tp, pp), stage 3, param
  // dtype default (not written), wrap (x invalid, then classes), classes (1bad invalid, then
  // "Block, Layer"), checkpointing yes, accumulation and precision default.
  std::istringstream in3("\n1\n\n\n\n\n\n\n3\n\nx\nclasses\n1bad\nBlock, Layer\ny\n\n\n");
  std::ostringstream out3;
  al::LaunchConfig c3 = al::run_questionnaire(in3, out3, 0);
  CHECK(contains(out3.str(), "Invalid answer 'x'"));
  CHECK(contains(out3.str(), "Invalid answer '1bad'"));
  CHECK(c3.get_int("zero_config.zero_stage") == 3);
  CHECK(!c3.get_int("--dp_replicate_size"));
  CHECK(!c3.get_int("--tp_size"));
  CHECK(!c3.get("zero_config.param_dtype"));
  CHECK(!c3.get("zero_config.reduce_dtype"));
  CHECK(c3.get("fsdp_config.fsdp_wrap") == std::optional<std::string>("classes"));
  CHECK(c3.get("fsdp_config.fsdp_wrap_classes") == std::optional<std::string>("Block,Layer"));
  CHECK(c3.get_bool("fsdp_config.fsdp_activation_checkpointing") == std::optional<bool>(true));
  CHECK(!c3.get_bool("fsdp_config.fsdp_prefetch"));
  CHECK(al::parse_config(al::config_to_yaml(c3), "q3") == c3);
  // Defaults everywhere (a yes/no question needs an answer): nothing ZeRO-3 specific is written.
  std::istringstream in4("\n1\n\n\n\n\n\n\n3\n\n\nno\n\n\n");
  std::ostringstream out4;
  al::LaunchConfig c4 = al::run_questionnaire(in4, out4, 0);
  CHECK(c4.get_int("zero_config.zero_stage") == 3);
  CHECK(!c4.get("fsdp_config.fsdp_wrap"));
  CHECK(!c4.get_bool("fsdp_config.fsdp_activation_checkpointing"));
  // tp 2 of 2 processes with ZeRO stage 2: every strategy composes with tp (Note [apply order] in
  // parallel/parallelize.h), so it is taken as it is.
  std::istringstream in5("\n1\n\n\n\n\n2\n\n2\n\n\n\n\n\n");
  std::ostringstream out5;
  al::LaunchConfig c5 = al::run_questionnaire(in5, out5, 0);
  CHECK_MESSAGE(!contains(out5.str(), "Invalid answer"), out5.str());
  CHECK(c5.get_int("--tp_size") == std::optional<int>(2));
  CHECK(c5.get_int("zero_config.zero_stage") == std::optional<int>(2));

  std::istringstream short_in("0\n2\n");
  std::ostringstream short_out;
  CHECK_THROWS_WITH_AS(al::run_questionnaire(short_in, short_out, 2),
                       doctest::Contains("input ended before the questionnaire was finished"),
                       al::ConfigError);
}

TEST_CASE("accel-run config: questionnaire over stdin, config default, malformed file errors") {
  TempDir dir;
  const std::string cfg = dir / "q.yaml";
  // Single machine multi-GPU by name; GPU ids "0,z" invalid then "1,0".
  Result r = accel_run({"config", "--config_file", cfg}, {},
                       "LOCAL_MACHINE\nmulti_gpu\n\n2\n0,z\n1,0\n\n\n2\n\n\n\nfp16\n");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(contains(r.out, "Invalid answer '0,z'"));
  al::LaunchConfig c = al::load_config(cfg);
  CHECK(c.distributed_type == "MULTI_GPU");
  CHECK(c.num_processes == 2);
  CHECK(c.gpu_ids == "1,0");
  CHECK(c.get("mixed_precision") == "fp16");
  // replicas and cp default 1, then tp 2 of 2 (pp default 1)
  CHECK(c.get_int("--tp_size") == std::optional<int>(2));

  Result eof = accel_run({"config", "--config_file", dir / "eof.yaml"}, {}, "0\n");
  CHECK(eof.code == 1);
  CHECK(contains(eof.err, "input ended"));
  CHECK(!fs::exists(dir / "eof.yaml"));

  // config default: to --config_file, refusing to overwrite, and to $HOME/.cache/accel.
  Result d = accel_run(
      {"config", "default", "--config_file", dir / "d.yaml", "--mixed_precision", "bf16"});
  CHECK_MESSAGE(d.code == 0, d.err);
  al::LaunchConfig dc = al::load_config(dir / "d.yaml");
  CHECK(dc.get("mixed_precision") == "bf16");
  CHECK(dc.num_machines == 1);
  Result again = accel_run({"config", "default", "--config_file", dir / "d.yaml"});
  CHECK(again.code == 1);
  CHECK(contains(again.err, "already exists"));
  CHECK(accel_run({"config", "default", "--config_file", dir / "d.yaml", "--force"}).code == 0);
  CHECK(al::load_config(dir / "d.yaml").get("mixed_precision") == "no");
  Result home = accel_run({"config", "default"}, {{"HOME", dir.str()}});
  CHECK_MESSAGE(home.code == 0, home.err);
  CHECK(fs::exists(dir / ".cache/accel/default_config.yaml"));
  CHECK(
      accel_run({"config", "default", "--mixed_precision", "fp8", "--config_file", dir / "x.yaml"})
          .code == 1);

  // A launch reading a malformed file fails before starting anything and names the key.
  write_file(dir / "bad.yaml", "num_processes: 2\nmixed_precision: fp32\n");
  Result bad = accel_run(launch_args({"--config_file", dir / "bad.yaml"}, {"env"}));
  CHECK(bad.code == 1);
  CHECK(contains(bad.err, "'mixed_precision'"));
  CHECK(contains(bad.err, "bad.yaml:2"));
  CHECK(!contains(bad.out, "hello"));
  Result missing = accel_run(launch_args({"--config_file", dir / "nope.yaml"}, {"env"}));
  CHECK(missing.code == 1);
  CHECK(contains(missing.err, "does not exist"));
}

// ---------------------------------------------------------------- placement

TEST_CASE("slurm: node list expansion") {
  using V = std::vector<std::string>;
  CHECK(al::expand_slurm_nodelist("node[01-03,07]") == V{"node01", "node02", "node03", "node07"});
  CHECK(al::expand_slurm_nodelist("a1,b[2-3],c") == V{"a1", "b2", "b3", "c"});
  CHECK(al::expand_slurm_nodelist("gpu[8-10]-ib") == V{"gpu8-ib", "gpu9-ib", "gpu10-ib"});
  CHECK(al::expand_slurm_nodelist("r[1-2]n[01-02]") == V{"r1n01", "r1n02", "r2n01", "r2n02"});
  CHECK(al::expand_slurm_nodelist("single") == V{"single"});
  CHECK(al::expand_slurm_nodelist("n[007]") == V{"n007"});
  for (const char* bad :
       {"node[01-03", "node]1[", "node[3-1]", "node[a-b]", "", "a,,b", "n[]", "n[1-2[3]]"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(al::expand_slurm_nodelist(bad), al::ConfigError);
  }
  CHECK(al::expand_slurm_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(al::expand_slurm_tasks_per_node("4") == std::vector<int>{4});
  CHECK_THROWS_AS(al::expand_slurm_tasks_per_node("2(3)"), al::ConfigError);
}

TEST_CASE("worker env: OMP_WAIT_POLICY=passive when the local workers fill the cores") {
  const int cores = al::usable_cpu_count();
  al::LaunchConfig cfg;
  cfg.num_processes = 2;
  auto worker_policy = [&](const al::EnvMap& env) {
    al::LaunchPlan p = al::resolve_plan(cfg, {}, env, 0);
    p.master_port = 1234;
    const al::EnvMap e = al::worker_env(p, p.num_local_workers - 1, 0);
    return e.count("OMP_WAIT_POLICY") ? e.at("OMP_WAIT_POLICY") : std::string("(unset)");
  };
  // Two workers, threads split over the cores: together they fill them.
  CHECK(worker_policy({}) == "passive");
  // More threads than cores, set by the user's OMP_NUM_THREADS.
  CHECK(worker_policy(env_of({{"OMP_NUM_THREADS", std::to_string(cores)}})) == "passive");
  // The user's choice is kept: the worker inherits it, the launcher adds nothing.
  CHECK(worker_policy(env_of({{"OMP_WAIT_POLICY", "active"}})) == "(unset)");
  CHECK(worker_policy(env_of({{"GOMP_SPINCOUNT", "1000"}})) == "(unset)");
  // Leaving cores free (one thread each on a machine with more than two cores): spinning is
  // harmless.
  if (cores > 2) CHECK(worker_policy(env_of({{"OMP_NUM_THREADS", "1"}})) == "(unset)");
  // One worker: nothing to compete with.
  cfg.num_processes = 1;
  CHECK(worker_policy({}) == "(unset)");
}

TEST_CASE("placement: flags, SLURM and OpenMPI") {
  al::LaunchConfig cfg;
  cfg.num_processes = 4;
  SUBCASE("single machine: loopback, free port, OMP threads split") {
    al::LaunchPlan p = al::resolve_plan(cfg, {}, {}, 0);
    CHECK(p.world_size == 4);
    CHECK(p.num_local_workers == 4);
    CHECK(p.master_addr == "127.0.0.1");
    CHECK(p.port_auto);
    CHECK(p.distributed_type == "MULTI_CPU");
    CHECK(p.use_cpu);
    CHECK(p.omp_threads == std::max(1, al::usable_cpu_count() / 4));
    p.master_port = 1234;
    al::EnvMap e = al::worker_env(p, 3, 2);
    CHECK(e["RANK"] == "3");
    CHECK(e["LOCAL_RANK"] == "3");
    CHECK(e["ACCEL_RESTART_COUNT"] == "2");
    CHECK(e["MASTER_PORT"] == "1234");
    CHECK(e.count("CUDA_VISIBLE_DEVICES") == 0);
    // OMP_NUM_THREADS already set by the user: left alone.
    CHECK(al::resolve_plan(cfg, {}, env_of({{"OMP_NUM_THREADS", "3"}}), 0).omp_threads == 0);
  }
  SUBCASE("flags override the config; GPUs") {
    al::LaunchFlags f;
    f.num_processes = 6;
    f.num_machines = 3;
    f.machine_rank = 2;
    f.main_process_ip = "10.0.0.1";
    f.gpu_ids = "1, 3";
    al::set_setting_flag(f, "--mixed_precision", "BF16");
    al::set_setting_flag(f, "--zero_stage", "3");
    al::LaunchPlan p = al::resolve_plan(cfg, f, {}, 4);
    CHECK(p.world_size == 6);
    CHECK(p.local_world_size == 2);
    CHECK(p.first_rank == 4);
    CHECK(p.master_port == 29500);
    CHECK(p.distributed_type == "MULTI_GPU");
    al::EnvMap e = al::worker_env(p, 1, 0);
    CHECK(e["RANK"] == "5");
    CHECK(e["LOCAL_RANK"] == "1");
    CHECK(e["GROUP_RANK"] == "2");
    CHECK(e["GROUP_WORLD_SIZE"] == "3");
    CHECK(e["CUDA_VISIBLE_DEVICES"] == "1,3");
    CHECK(e["ACCEL_MIXED_PRECISION"] == "bf16");
    CHECK(e["ACCEL_ZERO_STAGE"] == "3");
    CHECK(e.count("ACCEL_USE_CPU") == 0);  // never exported as false: the program may choose
    al::set_setting_flag(f, "--cpu", "true");
    al::LaunchPlan cpu = al::resolve_plan(cfg, f, {}, 4);
    CHECK(cpu.distributed_type == "MULTI_CPU");
    CHECK(al::worker_env(cpu, 0, 0).count("CUDA_VISIBLE_DEVICES") == 0);
  }
  SUBCASE("errors name the problem") {
    al::LaunchFlags f;
    f.num_machines = 2;
    CHECK_THROWS_WITH_AS(al::resolve_plan(cfg, f, {}, 0),
                         doctest::Contains("main_process_ip is required"), al::ConfigError);
    f.main_process_ip = "h";
    f.num_processes = 3;
    CHECK_THROWS_WITH_AS(al::resolve_plan(cfg, f, {}, 0),
                         doctest::Contains("multiple of num_machines"), al::ConfigError);
    al::LaunchFlags m;
    CHECK_THROWS_WITH_AS(al::set_setting_flag(m, "--mixed_precision", "fp64"),
                         doctest::Contains("--mixed_precision"), al::ConfigError);
  }
  SUBCASE("SLURM, one task per node") {
    al::EnvMap env = env_of({{"SLURM_PROCID", "1"},
                             {"SLURM_NTASKS", "2"},
                             {"SLURM_NNODES", "2"},
                             {"SLURM_NODEID", "1"},
                             {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                             {"SLURM_JOB_ID", "4242"}});
    al::LaunchPlan p = al::resolve_plan(cfg, {}, env, 0);
    CHECK(p.num_machines == 2);
    CHECK(p.machine_rank == 1);
    CHECK(p.local_world_size == 2);
    CHECK(p.first_rank == 2);
    CHECK(p.master_addr == "gpu07");
    CHECK(p.master_port == 29500 + 4242 % 1000);
    al::LaunchFlags f;
    f.main_process_port = 1111;  // flags beat the cluster
    CHECK(al::resolve_plan(cfg, f, env, 0).master_port == 1111);
    f.ignore_cluster_env = true;
    CHECK(al::resolve_plan(cfg, f, env, 0).num_machines == 1);
  }
  SUBCASE("SLURM, one task per worker") {
    al::EnvMap env = env_of({{"SLURM_PROCID", "5"},
                             {"SLURM_NTASKS", "6"},
                             {"SLURM_NNODES", "2"},
                             {"SLURM_NODEID", "1"},
                             {"SLURM_LOCALID", "2"},
                             {"SLURM_TASKS_PER_NODE", "3(x2)"},
                             {"SLURM_JOB_NODELIST", "n[1-2]"},
                             {"MASTER_PORT", "23456"}});
    al::LaunchPlan p = al::resolve_plan(cfg, {}, env, 0);
    CHECK(p.num_local_workers == 1);
    CHECK(p.world_size == 6);
    CHECK(p.first_rank == 5);
    CHECK(p.first_local_rank == 2);
    CHECK(p.local_world_size == 3);
    CHECK(p.machine_rank == 1);
    CHECK(p.master_addr == "n1");
    CHECK(p.master_port == 23456);
    al::LaunchFlags f;
    f.num_processes = 4;
    CHECK_THROWS_WITH_AS(al::resolve_plan(cfg, f, env, 0), doctest::Contains("conflicts"),
                         al::ConfigError);
    al::EnvMap bad = env;
    bad["SLURM_PROCID"] = "9";
    CHECK_THROWS_WITH_AS(al::resolve_plan(cfg, {}, bad, 0), doctest::Contains("SLURM_PROCID"),
                         al::ConfigError);
  }
  SUBCASE("OpenMPI") {
    al::EnvMap per_task = env_of({{"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_RANK", "3"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    al::LaunchPlan p = al::resolve_plan(cfg, {}, per_task, 0);
    CHECK(p.num_local_workers == 1);
    CHECK(p.first_rank == 3);
    CHECK(p.world_size == 4);
    CHECK(p.master_addr == "127.0.0.1");
    CHECK(p.master_port == 29500);
    al::EnvMap per_machine = env_of({{"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"OMPI_COMM_WORLD_RANK", "1"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                     {"MASTER_ADDR", "head"}});
    al::LaunchPlan q = al::resolve_plan(cfg, {}, per_machine, 0);
    CHECK(q.num_machines == 2);
    CHECK(q.machine_rank == 1);
    CHECK(q.first_rank == 2);
    CHECK(q.master_addr == "head");
  }
}

// ---------------------------------------------------------------- launch

TEST_CASE("launch: 1, 2 and 3 workers get the env contract; output is prefixed by rank") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    TempDir dir;
    Result r =
        accel_run(launch_args({"--num_processes", std::to_string(n), "--mixed_precision", "bf16",
                               "--zero_stage", "1", "--gradient_accumulation_steps", "2", "--cpu"},
                              {"env", "--dir", dir.str()}));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    std::string port, token;
    for (int rank = 0; rank < n; ++rank) {
      auto e = read_env_file(dir / ("env." + std::to_string(rank)));
      CHECK(e["RANK"] == std::to_string(rank));
      CHECK(e["LOCAL_RANK"] == std::to_string(rank));
      CHECK(e["WORLD_SIZE"] == std::to_string(n));
      CHECK(e["LOCAL_WORLD_SIZE"] == std::to_string(n));
      CHECK(e["GROUP_RANK"] == "0");
      CHECK(e["MASTER_ADDR"] == "127.0.0.1");
      CHECK(e["ACCEL_MIXED_PRECISION"] == "bf16");
      CHECK(e["ACCEL_USE_CPU"] == "true");
      CHECK(e["ACCEL_ZERO_STAGE"] == "1");
      CHECK(e["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "2");
      CHECK(e["ACCEL_RESTART_COUNT"] == "0");
      CHECK(e["ACCEL_DISTRIBUTED_TYPE"] == (n == 1 ? "NO" : "MULTI_CPU"));
      if (rank == 0) port = e["MASTER_PORT"], token = e["ACCEL_RENDEZVOUS_TOKEN"];
      CHECK(e["MASTER_PORT"] == port);
      CHECK(e["ACCEL_RENDEZVOUS_TOKEN"] == token);
      const std::string p = "[rank" + std::to_string(rank) + "]: ";
      CHECK(contains(r.out, p + "hello from rank " + std::to_string(rank) + " of " +
                                std::to_string(n) + "\n"));
      CHECK(contains(r.out, p + "partial line from rank " + std::to_string(rank) + "\n"));
      CHECK(contains(r.err, p + "note from rank " + std::to_string(rank) + "\n"));
    }
    CHECK(std::stoi(port) > 0);
    CHECK(token.size() == 32);  // a fresh store token per launch
  }
  // Worker flags after PROGRAM are not taken by accel-run; --no_rank_prefix; missing program.
  TempDir dir;
  Result r = accel_run({"launch", "--no_rank_prefix", "-q", "--", kWorker, "env", "--dir",
                        dir.str(), "--exit", "0"});
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(contains(r.out, "hello from rank 0 of 1\n"));
  CHECK(!contains(r.out, "[rank0]"));
  CHECK(r.err == "note from rank 0\n");
  // "--" after PROGRAM and "=" forms; PROGRAM's own flags that look like accel-run's.
  Result pass = accel_run({"launch", "-q", "--num_processes=2", "--", "printf", "%s|",
                           "--num_processes", "3", "--", "x"});
  CHECK_MESSAGE(pass.code == 0, pass.err);
  CHECK(contains(pass.out, "[rank1]: --num_processes|3|--|x|\n"));
  CHECK(!contains(pass.out, "[rank2]"));
  Result unknown = accel_run({"launch", "--num_procs", "2", kWorker, "env"});
  CHECK(unknown.code != 0);
  CHECK(contains(unknown.err, "unknown flag '--num_procs'"));
  Result none = accel_run({"launch", "--num_processes", "2"});
  CHECK(none.code == 2);
  CHECK(contains(none.err, "missing PROGRAM"));
  Result noexec = accel_run({"launch", "--num_processes", "2", dir / "no-such-program"});
  CHECK(noexec.code == 127);
  CHECK(contains(noexec.err, "cannot execute"));
}

TEST_CASE("launch: ZeRO-3 and ZeRO mixed-precision flags reach the workers' environment") {
  const std::vector<std::string> names = {
      "ACCEL_PARAM_DTYPE",     "ACCEL_REDUCE_DTYPE",
      "ACCEL_FSDP_WRAP",       "ACCEL_FSDP_WRAP_CLASSES",
      "ACCEL_FSDP_MIN_PARAMS", "ACCEL_FSDP_RESHARD_AFTER_FORWARD",
      "ACCEL_FSDP_PREFETCH",   "ACCEL_FSDP_ACTIVATION_CHECKPOINTING"};
  auto launch_env = [&names](const std::vector<std::string>& flags, const TempDir& dir) {
    std::vector<std::string> f = {"--num_processes", "2", "--cpu", "-q"};
    f.insert(f.end(), flags.begin(), flags.end());
    Result r = accel_run(launch_args(f, {"env", "--dir", dir.str()}));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    auto e0 = read_env_file(dir / "env.0"), e1 = read_env_file(dir / "env.1");
    for (const auto& n : names) {
      const bool same = e0.count(n) == e1.count(n) && (e0.count(n) == 0 || e0.at(n) == e1.at(n));
      CHECK_MESSAGE(same, n);
    }
    return std::make_pair(e0, r);
  };
  {
    // Both spellings; --fsdp_min_params alone implies min_params; values normalised.
    TempDir dir;
    auto [e, r] = launch_env({"--zero_stage", "3", "--fsdp-min-params", "500", "--param_dtype",
                              "BF16", "--reduce-dtype", "fp32", "--fsdp_prefetch", "false",
                              "--fsdp_reshard_after_forward=no", "--fsdp_activation_checkpointing"},
                             dir);
    CHECK(e["ACCEL_FSDP_WRAP"] == "min_params");
    CHECK(e["ACCEL_FSDP_MIN_PARAMS"] == "500");
    CHECK(e.count("ACCEL_FSDP_WRAP_CLASSES") == 0);
    CHECK(e["ACCEL_PARAM_DTYPE"] == "bf16");
    CHECK(e["ACCEL_REDUCE_DTYPE"] == "fp32");
    CHECK(e["ACCEL_FSDP_PREFETCH"] == "false");
    CHECK(e["ACCEL_FSDP_RESHARD_AFTER_FORWARD"] == "false");
    CHECK(e["ACCEL_FSDP_ACTIVATION_CHECKPOINTING"] == "true");
  }
  {
    // The config file's fsdp_config, partly overridden: the wrap flags replace its policy as a
    // whole, --fsdp_no_activation_checkpointing turns off what the file turned on.
    TempDir dir;
    write_file(dir / "c.yaml",
               "zero_config:\n  zero_stage: 3\n  param_dtype: fp16\nfsdp_config:\n"
               "  fsdp_wrap_classes: [Block]\n  fsdp_activation_checkpointing: true\n"
               "  fsdp_prefetch: false\n");
    auto [e, r] = launch_env({"--config_file", dir / "c.yaml"}, dir);
    CHECK(e["ACCEL_FSDP_WRAP"] == "classes");
    CHECK(e["ACCEL_FSDP_WRAP_CLASSES"] == "Block");
    CHECK(e["ACCEL_FSDP_ACTIVATION_CHECKPOINTING"] == "true");
    CHECK(e["ACCEL_PARAM_DTYPE"] == "fp16");
    auto [o, r2] = launch_env({"--config_file", dir / "c.yaml", "--fsdp_wrap", "none",
                               "--fsdp_no_activation_checkpointing", "--param_dtype", "fp32"},
                              dir);
    CHECK(o["ACCEL_FSDP_WRAP"] == "none");
    CHECK(o.count("ACCEL_FSDP_WRAP_CLASSES") == 0);
    CHECK(o["ACCEL_FSDP_ACTIVATION_CHECKPOINTING"] == "false");
    CHECK(o["ACCEL_FSDP_PREFETCH"] == "false");
    CHECK(o["ACCEL_PARAM_DTYPE"] == "fp32");
  }
  {
    // Nothing chosen: nothing exported. fsdp options with another stage, ZeRO dtypes with stage
    // 0: refused (they would be ignored), nothing started. Without a stage accel-run leaves the
    // check to the program, whose AcceleratorConfig says the stage (Note [who wins: launcher or
    // program] in launcher/config.h; test_env_contract checks with_env's refusal).
    TempDir dir;
    auto [e, r] = launch_env({"--zero_stage", "3"}, dir);
    for (const auto& n : names) CHECK_MESSAGE(e.count(n) == 0, n);
    Result w = accel_run(
        launch_args({"--num_processes", "1", "--cpu", "--zero_stage", "2", "--fsdp_wrap", "none"},
                    {"env", "--dir", dir.str()}));
    CHECK(w.code != 0);
    CHECK(contains(w.err, "apply to zero_stage 3 only"));
    Result d = accel_run(
        launch_args({"--num_processes", "1", "--cpu", "--zero_stage", "0", "--param_dtype", "bf16"},
                    {"env", "--dir", dir.str()}));
    CHECK(d.code != 0);
    CHECK(contains(d.err, "ZeRO compute dtypes apply to zero_stage 1-3 only"));
  }
  struct Bad {
    std::vector<std::string> flags;
    std::vector<std::string> expect;
  };
  const std::vector<Bad> bad = {
      {{"--fsdp_wrap", "layers"}, {"--fsdp_wrap", "'layers'", "entries, classes"}},
      {{"--fsdp_wrap", "classes"}, {"fsdp_wrap_classes"}},
      {{"--fsdp_wrap", "entries", "--fsdp_min_params", "5"}, {"only with fsdp_wrap: min_params"}},
      {{"--fsdp_wrap_classes", "A", "--fsdp_min_params", "5"}, {"two different wrap policies"}},
      {{"--fsdp_wrap_classes", "A-B"}, {"--fsdp_wrap_classes", "class names"}},
      {{"--fsdp_min_params", "0"}, {"--fsdp_min_params", ">= 1"}},
      {{"--fsdp_prefetch", "maybe"}, {"--fsdp_prefetch", "true or false", "'maybe'"}},
      {{"--param_dtype", "fp8"}, {"--param_dtype", "bf16, fp16, fp32"}},
      {{"--reduce_dtype", "bf16"}, {"--reduce_dtype", "param"}},
  };
  for (const auto& b : bad) {
    CAPTURE(b.flags[0]);
    std::vector<std::string> f = {"--num_processes", "2", "--cpu", "--zero_stage", "3"};
    f.insert(f.end(), b.flags.begin(), b.flags.end());
    Result r = accel_run(launch_args(f, {"env"}));
    CHECK(r.code == 1);
    CHECK(!contains(r.out, "hello"));
    for (const auto& want : b.expect) CHECK_MESSAGE(contains(r.err, want), want, " not in ", r.err);
  }
}

// accel-run -> ACCEL_* -> AcceleratorConfig::with_env -> the ZeRO-3 strategy, with a real
// Accelerator (tests/launcher/fsdp_env_worker.cc). Between steps the strategy holds the root unit
// (parameters of no unit) in full, so its bytes show the wrap policy and the param dtype: the
// worker's ModuleList entries have 288, 1056 and 264 parameters, the head outside it 36.
TEST_CASE("launch: ZeRO-3 options reach the strategy of an Accelerator (end to end)") {
  struct Case {
    std::vector<std::string> flags;
    long long gathered;  // root unit bytes between steps
  };
  const long long full = (288 + 1056 + 264 + 36) * 4;
  const std::vector<Case> cases = {
      {{}, 36 * 4},                                                // every entry a unit
      {{"--fsdp_wrap", "min_params", "--fsdp_min_params", "500"},  // only the 1056 entry
       (288 + 264 + 36) * 4},
      {{"--fsdp_min_params", "500", "--param_dtype", "bf16", "--mixed_precision", "bf16"},
       (288 + 264 + 36) * 2},
      {{"--fsdp_wrap", "none", "--fsdp_activation_checkpointing"}, full},
  };
  for (const auto& c : cases) {
    std::vector<std::string> a = {"launch", "--cpu", "--num_processes", "2", "--zero_stage", "3"};
    a.insert(a.end(), c.flags.begin(), c.flags.end());
    a.push_back(kFsdpEnvWorker);
    CAPTURE(a.size());
    Result r = accel_run(a, {}, "", 120);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string want = "rank=" + std::to_string(rank) +
                               " strategy=fsdp full=" + std::to_string(full) +
                               " gathered=" + std::to_string(c.gathered) + " ";
      CHECK_MESSAGE(contains(r.out, want), want, " not in ", r.out);
    }
  }
}

TEST_CASE("launch: a failing rank tears the group down quickly and leaves no process behind") {
  SUBCASE("exit code; others ignore SIGTERM and have children; default grace period") {
    TempDir dir;
    const double delay = 0.5;
    Result r = accel_run(
        launch_args({"--num_processes", "3"},
                    {"fail", "--fail_rank", "1", "--code", "7", "--delay", std::to_string(delay),
                     "--dir", dir.str(), "--ignore_term", "--spawn_child"}));
    CHECK(r.code == 7);
    CHECK(contains(r.err, "first failing worker: rank 1"));
    CHECK(contains(r.err, "exit code 7"));
    CHECK(contains(r.err, "| detail 11 of rank 1"));  // the last stderr lines...
    CHECK(!contains(r.err, "| detail 1 of rank 1"));  // ...and only the last 10
    CHECK(contains(r.err, "2 needed SIGKILL"));
    // The requirement: exit within 10 s of the failure, with the default 5 s grace period.
    MESSAGE("teardown with SIGTERM ignored took ", r.seconds - delay, " s after the failure");
    CHECK(r.seconds - delay < 10.0);
    CHECK(r.seconds - delay > 4.0);  // the grace period was honoured before SIGKILL
    check_no_orphans(dir, 6);
  }
  SUBCASE("killed by a signal; short grace period") {
    TempDir dir;
    Result r =
        accel_run(launch_args({"--num_processes", "2", "--grace_period", "1"},
                              {"fail", "--fail_rank", "0", "--signal", std::to_string(SIGSEGV),
                               "--delay", "0.2", "--dir", dir.str(), "--spawn_child"}));
    CHECK(r.code == 128 + SIGSEGV);
    CHECK(contains(r.err, "rank 0"));
    CHECK(contains(r.err, "killed by signal 11 (SIGSEGV)"));
    CHECK(contains(r.err, "0 needed SIGKILL"));  // the others stopped at SIGTERM
    MESSAGE("teardown after SIGSEGV took ", r.seconds - 0.2, " s");
    CHECK(r.seconds < 5.0);
    check_no_orphans(dir, 4);
  }
}

TEST_CASE("launch: --max_restarts restarts the group and the program resumes from its checkpoint") {
  TempDir dir;
  Result r =
      accel_run(launch_args({"--num_processes", "2", "--max_restarts", "2", "--grace_period", "1"},
                            {"restart", "--dir", dir.str(), "--steps", "6", "--crash_times", "2"}));
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(read_file(dir / "ckpt") == "6");
  CHECK(read_file(dir / "attempts.0") == "0\n1\n2\n");
  CHECK(read_file(dir / "attempts.1") == "0\n1\n2\n");
  CHECK(contains(r.out, "[rank0]: rank 0 attempt 1 resumes at step 2"));
  CHECK(contains(r.out, "[rank0]: rank 0 attempt 2 resumes at step 4"));
  CHECK(contains(r.err, "restart 2 of 2"));

  TempDir dir2;
  Result give_up = accel_run(
      launch_args({"--num_processes", "2", "--max_restarts", "1", "--grace_period", "1"},
                  {"restart", "--dir", dir2.str(), "--steps", "6", "--crash_times", "3"}));
  CHECK(give_up.code == 1);
  CHECK(read_file(dir2 / "attempts.0") == "0\n1\n");
  CHECK(contains(give_up.err, "giving up after 1 restart"));
}

TEST_CASE("launch: SIGINT and SIGTERM are forwarded to every worker") {
  for (int sig : {SIGINT, SIGTERM}) {
    CAPTURE(sig);
    TempDir dir;
    Proc p(launch_args({"--num_processes", "3"}, {"trap", "--dir", dir.str()}));
    REQUIRE(wait_for([&] { return count_files(dir, "pid.") == 3; }, 10));
    kill(p.pid(), sig);
    Result r = p.finish(15);
    CHECK(r.code == 128 + sig);
    for (int rank = 0; rank < 3; ++rank)
      CHECK(read_file(dir / ("sig." + std::to_string(rank))) == std::to_string(sig));
    CHECK(contains(r.out, "[rank2]: rank 2 stopping after signal " + std::to_string(sig)));
    check_no_orphans(dir, 3);
  }
}

// Children of `parent` named `comm` (/proc/PID/stat: "pid (comm) state ppid ...").
std::vector<pid_t> children_named(pid_t parent, const std::string& comm) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file("/proc/" + name + "/stat");
    auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && stat.substr(open + 1, close - open - 1) == comm)
      out.push_back(std::stoi(name));
  }
  return out;
}

TEST_CASE("launch: SIGKILL of accel-run takes the workers and everything they started with it") {
  // Each worker starts a grandchild in its process group and a daemon that called setsid() (outside
  // its group and session). Before the watchdog only the workers died (PR_SET_PDEATHSIG); both
  // grandchildren ran on as orphans for the worker's 60 s. Without the job cgroup
  // (ACCEL_RUN_CGROUP=0) the watchdog finds the daemon by the launch marker in its environment;
  // with it, also a daemon that cleared its environment.
  for (const std::string cgroup : {"0", "1"}) {
    CAPTURE(cgroup);
    TempDir dir;
    std::vector<std::string> worker = {"sleep", "--dir", dir.str(), "--spawn_child",
                                       "--spawn_setsid"};
    if (cgroup == "1") worker.push_back("--clear_env");
    Proc p(launch_args({"--num_processes", "2"}, worker), {{"ACCEL_RUN_CGROUP", cgroup}});
    REQUIRE(wait_for([&] { return count_files(dir, "pid.") == 6; }, 20));
    const auto watchdogs = children_named(p.pid(), "accel-run-wd");
    CHECK(watchdogs.size() == 1);
    const pid_t worker0 = std::stoi(read_file(dir / "pid.0"));
    const bool in_cgroup =
        contains(read_file("/proc/" + std::to_string(worker0) + "/cgroup"), "/accel-run-");
    if (cgroup == "0") CHECK(!in_cgroup);
    const auto pids = read_pids(dir);
    CHECK(pids.size() == 6);
    kill(p.pid(), SIGKILL);
    const auto killed = Clock::now();
    if (cgroup == "1" && !in_cgroup) {
      MESSAGE("no writable cgroup v2 here: the daemons without environment are not checked");
      for (int r = 0; r < 2; ++r)
        kill(std::stoi(read_file(dir / ("pid." + std::to_string(r) + ".setsid"))), SIGKILL);
    }
    for (pid_t w : pids)
      CHECK_MESSAGE(wait_for([&] { return !alive(w); }, 10), "process ", w,
                    " survived SIGKILL of accel-run");
    MESSAGE("all 6 workers and grandchildren were gone ", since(killed),
            " s after SIGKILL of accel-run (cgroup: ", std::string(in_cgroup ? "yes" : "no"), ")");
    for (pid_t w : watchdogs)
      CHECK_MESSAGE(wait_for([&] { return !alive(w); }, 10), "the watchdog ", w, " stayed");
    p.finish(10);
  }
}

TEST_CASE("launch: two machines on loopback (flags, then SLURM per node, then SLURM per task)") {
  SUBCASE("--machine_rank") {
    TempDir dir;
    const std::string port = std::to_string(free_port());
    std::vector<std::unique_ptr<Proc>> machines;
    for (int m = 0; m < 2; ++m) {
      machines.push_back(std::make_unique<Proc>(
          launch_args(
              {"--num_machines", "2", "--num_processes", "4", "--machine_rank", std::to_string(m),
               "--main_process_ip", "127.0.0.1", "--main_process_port", port},
              {"handshake", "--dir", dir.str()}),
          std::map<std::string, std::string>{{"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
    }
    for (auto& m : machines) {
      Result r = m->finish(30);
      CHECK_MESSAGE(r.code == 0, r.err);
    }
    for (int rank = 0; rank < 4; ++rank) {
      auto e = read_env_file(dir / ("env." + std::to_string(rank)));
      CHECK(e["WORLD_SIZE"] == "4");
      CHECK(e["LOCAL_WORLD_SIZE"] == "2");
      CHECK(e["LOCAL_RANK"] == std::to_string(rank % 2));
      CHECK(e["GROUP_RANK"] == std::to_string(rank / 2));
      CHECK(e["NODE_RANK"] == std::to_string(rank / 2));
      CHECK(e["GROUP_WORLD_SIZE"] == "2");
      CHECK(e["MASTER_PORT"] == port);
      CHECK(e["ACCEL_RENDEZVOUS_TOKEN"] ==
            kToken);  // the exported one: machines cannot agree on a random one
    }
  }
  SUBCASE("SLURM one task per node") {
    TempDir dir;
    const std::string port = std::to_string(free_port());
    std::vector<std::unique_ptr<Proc>> machines;
    for (int m = 0; m < 2; ++m) {
      machines.push_back(std::make_unique<Proc>(
          launch_args({"--num_processes", "4"}, {"handshake", "--dir", dir.str()}),
          std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(m)},
                                             {"SLURM_NTASKS", "2"},
                                             {"SLURM_NNODES", "2"},
                                             {"SLURM_NODEID", std::to_string(m)},
                                             {"SLURM_JOB_NODELIST", "127.0.0.[1-2]"},
                                             {"MASTER_PORT", port},
                                             {"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
    }
    for (auto& m : machines) {
      Result r = m->finish(30);
      CHECK_MESSAGE(r.code == 0, r.err);
      CHECK(contains(r.err, "SLURM step with one task per node"));
    }
    CHECK(read_env_file(dir / "env.3")["GROUP_RANK"] == "1");
    CHECK(read_env_file(dir / "env.3")["MASTER_ADDR"] == "127.0.0.1");
  }
  SUBCASE("SLURM one task per worker") {
    TempDir dir;
    const std::string port = std::to_string(free_port());
    std::vector<std::unique_ptr<Proc>> tasks;
    for (int t = 0; t < 3; ++t) {
      tasks.push_back(std::make_unique<Proc>(
          launch_args({}, {"handshake", "--dir", dir.str()}),
          std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(t)},
                                             {"SLURM_NTASKS", "3"},
                                             {"SLURM_NNODES", "1"},
                                             {"SLURM_LOCALID", std::to_string(t)},
                                             {"SLURM_JOB_NODELIST", "127.0.0.1"},
                                             {"MASTER_PORT", port},
                                             {"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
    }
    for (auto& t : tasks) {
      Result r = t->finish(30);
      CHECK_MESSAGE(r.code == 0, r.err);
    }
    for (int rank = 0; rank < 3; ++rank) {
      auto e = read_env_file(dir / ("env." + std::to_string(rank)));
      CHECK(e["LOCAL_RANK"] == std::to_string(rank));
      CHECK(e["LOCAL_WORLD_SIZE"] == "3");
      CHECK(e["WORLD_SIZE"] == "3");
      CHECK(e["ACCEL_RENDEZVOUS_TOKEN"] == kToken);
    }
  }
  SUBCASE("without a shared token every accel-run refuses to start and says how to get one") {
    TempDir dir;
    const std::string port = std::to_string(free_port());
    for (int m = 0; m < 2; ++m) {
      Result r = accel_run(launch_args(
          {"--num_machines", "2", "--num_processes", "4", "--machine_rank", std::to_string(m),
           "--main_process_ip", "127.0.0.1", "--main_process_port", port},
          {"handshake", "--dir", dir.str()}));
      CHECK(r.code == 1);
      CHECK(contains(r.err, "[launch] this job spans 2 machines"));
      CHECK(contains(r.err, "accel-run token"));
      CHECK(contains(r.err, "ACCEL_RENDEZVOUS_TOKEN"));
      CHECK(count_files(dir, "pid.") == 0);  // nothing was started
    }
    // --rendezvous_token works as well as the variable (the flag wins).
    std::vector<std::unique_ptr<Proc>> machines;
    for (int m = 0; m < 2; ++m) {
      machines.push_back(std::make_unique<Proc>(
          launch_args({"--num_machines", "2", "--num_processes", "2", "--machine_rank",
                       std::to_string(m), "--main_process_ip", "127.0.0.1", "--main_process_port",
                       port, "--rendezvous_token", kToken},
                      {"handshake", "--dir", dir.str()}),
          std::map<std::string, std::string>{
              {"ACCEL_RENDEZVOUS_TOKEN", "another-token-that-loses"}}));
    }
    for (auto& m : machines) {
      Result r = m->finish(30);
      CHECK_MESSAGE(r.code == 0, r.err);
    }
    CHECK(read_env_file(dir / "env.1")["ACCEL_RENDEZVOUS_TOKEN"] == kToken);
  }
}

// ---------------------------------------------------------------- env and test

TEST_CASE("launch: --num_machines MIN:MAX (elastic) on loopback, and what it refuses") {
  SUBCASE("two agents form round 1; their workers meet at the round's MASTER_ADDR:PORT") {
    TempDir dir;
    const int port = free_port();
    std::vector<std::unique_ptr<Proc>> machines;
    for (int m = 0; m < 2; ++m) {
      machines.push_back(std::make_unique<Proc>(
          launch_args({"--num_machines", "2:2", "--num_processes", "4", "--main_process_ip",
                       "127.0.0.1", "--main_process_port", std::to_string(port)},
                      {"handshake", "--dir", dir.str()}),
          std::map<std::string, std::string>{{"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
    }
    std::string log;
    for (auto& m : machines) {
      Result r = m->finish(30);
      CHECK_MESSAGE(r.code == 0, r.err);
      log += r.err;
    }
    CHECK(contains(log, "serving the rendezvous at 127.0.0.1:" + std::to_string(port)));
    CHECK(contains(log, "round 1: this machine is node rank 0 of 2, world size 4 (ranks 0-1)"));
    CHECK(contains(log, "round 1: this machine is node rank 1 of 2, world size 4 (ranks 2-3)"));
    for (int rank = 0; rank < 4; ++rank) {
      auto e = read_env_file(dir / ("env." + std::to_string(rank)));
      CHECK(e["WORLD_SIZE"] == "4");
      CHECK(e["LOCAL_WORLD_SIZE"] == "2");  // num_processes / MIN per machine
      CHECK(e["NODE_RANK"] == std::to_string(rank / 2));
      CHECK(e["GROUP_WORLD_SIZE"] == "2");
      CHECK(e["MASTER_PORT"] == std::to_string(port + 1));  // the port + the round
      CHECK(e["ACCEL_RESTART_COUNT"] == "0");
      CHECK(e["ACCEL_DISTRIBUTED_TYPE"] == "MULTI_CPU");
    }
  }
  SUBCASE("a failure past --max_restarts stops the job on every machine") {
    TempDir dir;
    const int port = free_port();
    std::vector<std::unique_ptr<Proc>> machines;
    for (int m = 0; m < 2; ++m) {
      machines.push_back(std::make_unique<Proc>(
          launch_args(
              {"--num_machines", "2:2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
               "--main_process_port", std::to_string(port), "--rdzv_keep_alive", "2",
               "--grace_period", "1"},
              {"fail", "--fail_rank", "0", "--code", "7", "--delay", "0.5", "--dir", dir.str()}),
          std::map<std::string, std::string>{{"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
      if (m == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // serves
    }
    Result r0 = machines[0]->finish(30), r1 = machines[1]->finish(30);
    // Machine 0 (rank 0; it serves the rendezvous) failed with 7 and stays until machine 1's
    // next keep-alive has heard it (else machine 1 would wait for an answer for a minute).
    CHECK_MESSAGE(r0.code == 7, r0.err);
    CHECK_MESSAGE(r1.code == 1, r1.err);
    CHECK(r1.seconds < 15);
    for (const Result* r : {&r0, &r1}) {
      CHECK_MESSAGE(contains(r->err,
                             "the job stops: the workers of machine 0 failed in round 1, "
                             "and --max_restarts 0 rounds after failures have been used"),
                    r->err);
    }
  }
  SUBCASE("the config file's num_machines: MIN:MAX launches elastically too; a flag N wins") {
    TempDir dir;
    const std::string cfg = dir / "elastic.yaml";
    std::ofstream(cfg) << "num_machines: 1:2\nnum_processes: 1\n";
    const std::map<std::string, std::string> token = {{"ACCEL_RENDEZVOUS_TOKEN", kToken}};
    Result r = accel_run(launch_args({"--config_file", cfg}, {"env"}), token);
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.err, "--num_machines 1:2 needs --main_process_ip"), r.err);
    r = accel_run(launch_args({"--config_file", cfg, "--num_machines", "1"}, {"env"}), token);
    CHECK_MESSAGE(r.code == 0, r.err);
  }
  SUBCASE("refusals name the flag and what is needed") {
    const std::map<std::string, std::string> token = {{"ACCEL_RENDEZVOUS_TOKEN", kToken}};
    Result r = accel_run(launch_args({"--num_machines", "3:2"}, {"env"}), token);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "--num_machines 3:2: MIN must not exceed MAX"));
    r = accel_run(launch_args({"--num_machines", "x:2"}, {"env"}), token);
    CHECK(contains(r.err, "expected N or MIN:MAX"));
    r = accel_run(launch_args({"--num_machines", "1:2"}, {"env"}), token);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "needs --main_process_ip"));
    r = accel_run(
        launch_args({"--num_machines", "1:2", "--main_process_ip", "127.0.0.1"}, {"env"}));
    CHECK(r.code == 1);
    CHECK(contains(r.err, "needs a rendezvous token shared by every machine"));
    r = accel_run(launch_args({"--num_machines", "1:2", "--main_process_ip", "127.0.0.1",
                               "--machine_rank", "1"},
                              {"env"}),
                  token);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "elastic machine ranks are assigned by each rendezvous round"));
  }
}

TEST_CASE("accel-run env reports versions, devices, libraries and the config") {
  TempDir dir;
  al::LaunchConfig c;
  c.num_processes = 2;
  c.set("mixed_precision", "fp16");
  al::save_config(c, dir / "c.yaml");
  Result r = accel_run({"env", "--config_file", dir / "c.yaml"});
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(contains(r.out, "accel-run " ACCEL_PROJECT_VERSION));
  CHECK(contains(r.out, "CPU: "));
  CHECK(contains(r.out, "GPUs ("));
  for (const char* lib : {"oneDNN: ", "CUDA runtime: ", "cuBLAS: ", "cuDNN: ", "NCCL: "})
    CHECK(contains(r.out, lib));
  CHECK(contains(r.out, "mixed_precision: 'fp16'"));
  CHECK(contains(r.out, "launch without flags: 2 process(es)"));
  if (fs::exists("/usr/lib/x86_64-linux-gnu/libdnnl.so.2")) CHECK(contains(r.out, "oneDNN: 2."));

  CHECK(contains(r.out, "rendezvous token: a fresh one per launch"));
  CHECK(contains(r.out, "Process cleanup\n  job cgroup: "));
  // The token is a secret: the report says it is set, not what it is (it was printed before).
  Result tok =
      accel_run({"env", "--config_file", dir / "c.yaml"}, {{"ACCEL_RENDEZVOUS_TOKEN", kToken}});
  CHECK(tok.code == 0);
  CHECK(!contains(tok.out, kToken));
  CHECK(contains(tok.out, "ACCEL_RENDEZVOUS_TOKEN=<set, 32 characters>"));
  CHECK(contains(tok.out, "rendezvous token: ACCEL_RENDEZVOUS_TOKEN (exported)"));
  al::LaunchConfig two = c;
  two.num_machines = 2;
  two.main_process_ip = "10.0.0.1";
  al::save_config(two, dir / "two.yaml");
  Result no_tok = accel_run({"env", "--config_file", dir / "two.yaml"});
  CHECK(
      contains(no_tok.out, "launch without flags would fail: [launch] this job spans 2 machines"));

  write_file(dir / "bad.yaml", "num_processes: -3\n");
  Result bad = accel_run({"env", "--config_file", dir / "bad.yaml"});
  CHECK(bad.code == 0);  // env still reports everything else
  CHECK(contains(bad.out, "error: [config]"));
  CHECK(contains(bad.out, "'num_processes'"));
}

TEST_CASE("accel-run test: runs the self test through the launch path") {
  TempDir dir;
  // A stand-in self test (the real one is dist's accel-selftest) shows pass and fail reporting.
  write_file(dir / "pass.sh", "#!/bin/sh\nexec " + kWorker + " handshake\n");
  write_file(dir / "fail.sh", "#!/bin/sh\necho 'check allreduce: FAILED' >&2\nexit 4\n");
  fs::permissions(dir / "pass.sh", fs::perms::owner_all);
  fs::permissions(dir / "fail.sh", fs::perms::owner_all);
  Result pass = accel_run({"test", "--config_file", dir / "none.yaml"},
                          {{"ACCEL_SELFTEST", dir / "pass.sh"}});
  CHECK(pass.code == 1);  // an explicit --config_file must exist
  write_file(dir / "c.yaml", "num_processes: 1\n");
  pass =
      accel_run({"test", "--config_file", dir / "c.yaml"}, {{"ACCEL_SELFTEST", dir / "pass.sh"}});
  CHECK_MESSAGE(pass.code == 0, pass.err);
  CHECK(contains(pass.out, "[rank1]: check handshake rank 1 of 2: ok"));  // 2 processes by default
  CHECK(contains(pass.out, "accel-run test: PASS"));
  Result fail = accel_run({"test", "--num_processes", "3", "--config_file", dir / "c.yaml"},
                          {{"ACCEL_SELFTEST", dir / "fail.sh"}});
  CHECK(fail.code == 4);
  CHECK(contains(fail.out, "accel-run test: FAIL (exit code 4)"));
  CHECK(contains(fail.err, "check allreduce: FAILED"));

  // Not found: a copy of accel-run in a directory without accel-selftest says where it looked.
  fs::create_directories(dir / "bin");
  fs::copy_file(kAccelRun, dir / "bin/accel-run");
  Proc lonely({"test"}, {{"HOME", dir.str()}}, "", dir / "bin/accel-run");
  Result nf = lonely.finish(10);
  CHECK(nf.code == 2);
  CHECK(contains(nf.err, "accel-selftest was not found"));
  CHECK(contains(nf.err, dir / "bin/accel-selftest"));

  if (!fs::exists(kSelftestBuilt)) {
    MESSAGE("skipping the real self test: " << kSelftestBuilt
                                            << " is not built (comm/tools/accel-selftest)");
    return;
  }
  Result real = accel_run(
      {"test", "--num_processes", "2", "--cpu", "--config_file", dir / "c.yaml"}, {}, "", 120);
  CHECK_MESSAGE(real.code == 0, real.out, real.err);
  CHECK(contains(real.out, "accel-run test: PASS"));
}

// ---------------------------------------------------------------- failure paths

TEST_CASE("console sink: never blocks on a full pipe, drops whole writes and reports how much") {
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  const int pipe_size = fcntl(p[1], F_SETPIPE_SZ, 4096);
  REQUIRE(pipe_size > 0);
  std::vector<std::string> lines;
  size_t written = 0;
  {
    al::ConsoleSink sink(p[1], /*capacity=*/1000);
    // Nobody reads: the pipe fills, then the sink's buffer; the rest is dropped. A blocking
    // write would hang this test here.
    for (int i = 0; i < 400; ++i) {
      lines.push_back("line " + std::to_string(i) + " " + std::string(40, 'a' + i % 26) + "\n");
      sink.write(lines.back());
      written += lines.back().size();
    }
    const size_t dropped = sink.dropped_bytes();
    CHECK(dropped > 0);
    CHECK(dropped < written);
    CHECK(sink.pending());
    CHECK(sink.poll_fd() >= 0);
    // The reader catches up; the next text comes after a notice with the exact count.
    std::string got;
    auto drain_pipe = [&] {
      fcntl(p[0], F_SETFL, O_NONBLOCK);
      char buf[8192];
      ssize_t n;
      while ((n = read(p[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
    };
    for (int i = 0; i < 100 && !sink.flush(); ++i) drain_pipe();
    drain_pipe();
    CHECK(!sink.pending());
    sink.write("after the gap\n");
    drain_pipe();
    const std::string notice =
        "[accel-run: " + std::to_string(dropped) + " bytes of output dropped]\nafter the gap\n";
    CHECK_MESSAGE(contains(got, notice), got.substr(got.size() > 300 ? got.size() - 300 : 0));
    // Every line that arrived arrived whole and in order.
    std::istringstream is(got);
    std::string line;
    size_t next = 0, whole = 0;
    while (std::getline(is, line)) {
      if (line.rfind("line ", 0) != 0) continue;
      while (next < lines.size() && lines[next] != line + "\n") ++next;
      CHECK_MESSAGE(next < lines.size(), "garbled or reordered line: ", line);
      whole += line.size() + 1;
    }
    CHECK(whole + dropped == written);
    // The sink wrote through a description of its own: the caller's (the shell's) stays blocking.
    CHECK((fcntl(p[1], F_GETFL) & O_NONBLOCK) == 0);
  }
  close(p[0]);
  close(p[1]);

  // A socket (stdout of a service manager) is written with MSG_DONTWAIT: no block either.
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  {
    al::ConsoleSink sink(sv[0], /*capacity=*/1000);
    const std::string line(100, 's');
    for (int i = 0; i < 20000; ++i)
      sink.write(line + "\n");  // ~2 MB: far more than the socket buffer
    CHECK(sink.dropped_bytes() > 0);
    CHECK((fcntl(sv[0], F_GETFL) & O_NONBLOCK) == 0);
  }
  close(sv[0]);
  close(sv[1]);
}

TEST_CASE("launch: SIGTERM is handled while accel-run's stdout is not being read") {
  // Before: accel-run blocked in write(1) on the full pipe and never read its signalfd again.
  TempDir dir;
  Proc p(launch_args({"--num_processes", "2", "--grace_period", "2"},
                     {"flood", "--dir", dir.str(), "--spawn_child"}));
  p.ignore_stdout();
  REQUIRE(wait_for([&] { return count_files(dir, "pid.") == 4; }, 20));
  std::this_thread::sleep_for(
      std::chrono::seconds(1));  // the workers print ~MB/s; the 64 KiB pipe is long full
  kill(p.pid(), SIGTERM);
  const auto sent = Clock::now();
  Result r = p.finish(40);
  const double took = since(sent);
  MESSAGE("accel-run exited ", took, " s after SIGTERM with its stdout blocked");
  CHECK(r.code == 128 + SIGTERM);
  CHECK(took < 15.0);  // grace period 2 s + 1 s to give up on the console, with a wide margin
  CHECK(contains(r.err, "received SIGTERM"));
  CHECK(contains(r.err, "bytes of stdout output were dropped (stdout was not being read)"));
  check_no_orphans(dir, 4);
}

TEST_CASE(
    "launch: a stopped worker is reported at once and fails the job after --stopped_timeout") {
  // Before: accel-run did not notice the stop; the job hung until the other rank gave up (60 s).
  TempDir dir;
  Result r = accel_run(
      launch_args({"--num_processes", "3", "--stopped_timeout", "1", "--grace_period", "1"},
                  {"sleep", "--dir", dir.str(), "--stop_rank", "1", "--spawn_child"}),
      {}, "", 40);
  const pid_t stopped = std::stoi(read_file(dir / "pid.1"));
  MESSAGE("a worker stopped by SIGSTOP (--stopped_timeout 1) ended the job after ", r.seconds,
          " s");
  CHECK(r.code == 128 + SIGSTOP);
  CHECK(contains(r.err, "rank 1 (pid " + std::to_string(stopped) + ") was stopped by SIGSTOP"));
  CHECK(contains(r.err, "is still stopped by SIGSTOP after"));
  CHECK(contains(r.err, "first failing worker: rank 1"));
  CHECK(contains(r.err, "2 were running at the failure"));
  CHECK(contains(r.err, "  rank 1 (local_rank 1) | host "));
  CHECK(r.seconds < 20.0);
  check_no_orphans(dir, 6);
}

TEST_CASE("launch: a stopped worker that is continued in time is reported, not failed") {
  TempDir dir;
  Proc p(launch_args({"--stopped_timeout", "60"},
                     {"sleep", "--dir", dir.str(), "--stop_rank", "0", "--exit_when_continued"}));
  REQUIRE(wait_for([&] { return count_files(dir, "pid.") == 1; }, 20));
  const pid_t w = std::stoi(read_file(dir / "pid.0"));
  auto state = [&] {
    std::string stat = read_file("/proc/" + std::to_string(w) + "/stat");
    auto close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
  };
  REQUIRE(wait_for([&] { return state() == 'T'; }, 20));
  // accel-run hears of the stop through SIGCHLD at once; 2 s leave it ample time on a busy machine.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(w, SIGCONT);
  Result r = p.finish(30);
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(contains(r.err, "rank 0 (pid " + std::to_string(w) + ") was stopped by SIGSTOP"));
  CHECK(contains(r.err, "rank 0 (pid " + std::to_string(w) + ") continued after "));
  CHECK(!contains(r.err, "failure summary"));
}

TEST_CASE(
    "launch: --log_dir writes per-rank stdout/stderr files; --tee picks what the console also "
    "gets") {
  struct Case {
    std::string tee;  // "" = flag absent
    bool out, err;
  };
  for (const Case& c : {Case{"", false, false}, Case{"stdout", true, false}, Case{"2", false, true},
                        Case{"all", true, true}}) {
    CAPTURE(c.tee);
    TempDir dir;
    std::vector<std::string> flags = {"--num_processes", "2", "--log_dir", dir / "logs"};
    if (!c.tee.empty()) flags.insert(flags.end(), {"--tee", c.tee});
    Result r = accel_run(launch_args(flags, {"env", "--dir", dir.str()}));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string rd = dir / ("logs/attempt_0/rank_" + std::to_string(rank));
      const std::string R = std::to_string(rank);
      CHECK(read_file(rd + "/stdout.log") ==
            "hello from rank " + R + " of 2\npartial line from rank " + R);
      CHECK(read_file(rd + "/stderr.log") == "note from rank " + R + "\n");
      CHECK(!fs::exists(rd + "/error.json"));  // it succeeded
      auto e = read_env_file(dir / ("env." + R));
      CHECK(e["ACCEL_ERROR_FILE"] == rd + "/error.json");
      CHECK(e["TORCHELASTIC_ERROR_FILE"] == rd + "/error.json");
      CHECK(contains(r.out, "[rank" + R + "]: hello from rank") == c.out);
      CHECK(contains(r.err, "[rank" + R + "]: note from rank") == c.err);
    }
  }
  {
    // A relative --log_dir: the workers get absolute error file paths.
    TempDir dir;
    const std::string rel = fs::relative(dir.path, fs::current_path()).string() + "/logs/";
    Result r = accel_run(launch_args({"--log_dir", rel}, {"env", "--dir", dir.str()}));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(read_env_file(dir / "env.0")["ACCEL_ERROR_FILE"] ==
          dir / "logs/attempt_0/rank_0/error.json");
  }
  Result no_dir = accel_run(launch_args({"--tee", "3"}, {"env"}));
  CHECK(no_dir.code == 1);
  CHECK(contains(no_dir.err, "pass --log_dir too"));
  TempDir dir;
  Result bad = accel_run(launch_args({"--log_dir", dir.str(), "--tee", "5"}, {"env"}));
  CHECK(bad.code == 1);
  CHECK(contains(bad.err, "--tee: expected 0-3"));
  CHECK(al::parse_tee("both") == (al::kTeeStdout | al::kTeeStderr));
  write_file(dir / "a-file", "x");
  Result not_dir =
      accel_run(launch_args({"--log_dir", dir / "a-file"}, {"env", "--dir", dir.str()}));
  CHECK(not_dir.code == 1);
  CHECK(contains(not_dir.err, "cannot create the directory '" + dir / "a-file/attempt_0/rank_0'"));
  CHECK(count_files(dir, "env.") == 0);  // nothing was started
  // Restarts get an attempt directory each.
  Result re =
      accel_run(launch_args({"--num_processes", "2", "--max_restarts", "1", "--grace_period", "1",
                             "--log_dir", dir / "logs"},
                            {"restart", "--dir", dir.str(), "--steps", "4", "--crash_times", "1"}));
  CHECK_MESSAGE(re.code == 0, re.err);
  CHECK(contains(read_file(dir / "logs/attempt_0/rank_0/stderr.log"),
                 "rank 0 crashing at step 2 on attempt 0"));
  CHECK(contains(read_file(dir / "logs/attempt_1/rank_0/stdout.log"),
                 "rank 0 attempt 1 resumes at step 2"));
  CHECK(fs::exists(dir / "logs/attempt_0/rank_0/error.json"));
  CHECK(!fs::exists(dir / "logs/attempt_1/rank_0/error.json"));
}

nlohmann::json read_json(const std::string& path) {
  auto j = nlohmann::json::parse(read_file(path), nullptr, false);
  CHECK_MESSAGE(j.is_object(), path, ": ", read_file(path));
  return j.is_object() ? j : nlohmann::json::object();
}

TEST_CASE("launch: a failed worker's error file and the failure summary") {
  SUBCASE("written by accel-run: exit code, last stderr lines") {
    TempDir dir;
    Result r = accel_run(
        launch_args({"--num_processes", "3", "--grace_period", "1", "--log_dir", dir / "logs"},
                    {"fail", "--fail_rank", "1", "--code", "7", "--dir", dir.str()}));
    CHECK(r.code == 7);
    const std::string ef = dir / "logs/attempt_0/rank_1/error.json";
    auto j = read_json(ef);
    CHECK(j["rank"] == 1);
    CHECK(j["local_rank"] == 1);
    CHECK(j["exitcode"] == 7);
    CHECK(j["signal"].is_null());
    CHECK(j["pid"] == std::stoi(read_file(dir / "pid.1")));
    CHECK(j["host"] == al::host_name());
    CHECK(j["timestamp"].is_number_integer());
    CHECK(j["written_by"] == "accel-run");
    CHECK(contains(j["traceback"].get<std::string>(), "detail 11 of rank 1\n"));
    CHECK(j["message"]["message"] == "detail 11 of rank 1");
    CHECK(!fs::exists(dir / "logs/attempt_0/rank_0/error.json"));  // torn down, not failed
    CHECK(contains(r.err, "failure summary: 1 failed rank(s)"));
    CHECK(
        contains(r.err, "  rank 1 (local_rank 1) | host " + al::host_name() + " | exit code 7 | "));
    CHECK(contains(r.err, "| error file: " + ef + " | first error: detail 11 of rank 1"));
  }
  SUBCASE("written by the worker: its content is kept and completed; killed by a signal") {
    TempDir dir;
    const std::string own =
        R"({"message": {"message": "RuntimeError: custom boom\nsecond line", "extraInfo": {"py_callstack": "frame 1"}}, "rank": 42})";
    Result r = accel_run(
        launch_args({"--num_processes", "2", "--grace_period", "1", "--log_dir", dir / "logs"},
                    {"fail", "--fail_rank", "0", "--signal", std::to_string(SIGSEGV), "--dir",
                     dir.str(), "--error_file", own, "--bad_utf8"}));
    CHECK(r.code == 128 + SIGSEGV);
    auto j = read_json(dir / "logs/attempt_0/rank_0/error.json");
    CHECK(j["message"]["message"] == "RuntimeError: custom boom\nsecond line");
    CHECK(j["message"]["extraInfo"]["py_callstack"] == "frame 1");
    CHECK(j["rank"] == 42);  // the worker's own value wins
    CHECK(j["exitcode"].is_null());
    CHECK(j["signal"] == "SIGSEGV");
    CHECK(j["written_by"] == "worker, completed by accel-run");
    // A stderr line that is not UTF-8 is kept with replacement characters (it made dump() throw).
    CHECK(contains(j["traceback"].get<std::string>(), "bytes that are not UTF-8: \xEF\xBF\xBD"));
    CHECK(contains(r.err, "killed by signal 11 (SIGSEGV)"));
    CHECK(contains(r.err, "first error: RuntimeError: custom boom\n"));
  }
  SUBCASE("without --log_dir: a temporary directory, kept only when a summary names it") {
    TempDir dir;
    Result ok = accel_run(launch_args({"--num_processes", "2"}, {"env", "--dir", dir.str()}));
    REQUIRE(ok.code == 0);
    const std::string ef = read_env_file(dir / "env.1")["ACCEL_ERROR_FILE"];
    CHECK(contains(ef, "/attempt_0/rank_1/error.json"));
    CHECK(ef.rfind(tmp_root(), 0) == 0);  // under $TMPDIR
    CHECK(!fs::exists(
        fs::path(ef).parent_path().parent_path().parent_path()));  // removed after success

    Result r = accel_run(launch_args({"--num_processes", "2", "--grace_period", "1"},
                                     {"fail", "--fail_rank", "0", "--code", "3", "--dir", dir.str(),
                                      "--error_file", "not json"}));
    CHECK(r.code == 3);
    const auto at = r.err.find("| error file: ");
    REQUIRE(at != std::string::npos);
    const std::string path = r.err.substr(at + 14, r.err.find(' ', at + 14) - at - 14);
    auto j = read_json(path);
    CHECK(j["worker_content"] == "not json");
    CHECK(j["exitcode"] == 3);
    fs::remove_all(fs::path(path).parent_path().parent_path().parent_path());
  }
}

TEST_CASE("launch: hostile error files and planted links (Note [safe file access])") {
  SUBCASE("an error file of 100,000 nested arrays: bounded, the exit status still reported") {
    // Before: accel-run re-indented it recursively, grew to 7.9 GB and died of SIGSEGV.
    TempDir dir;
    Result r = accel_run(
        launch_args({"--num_processes", "1", "--log_dir", dir / "logs"},
                    {"fail", "--code", "5", "--dir", dir.str(), "--error_nested", "100000"}));
    CHECK(r.code == 5);
    CHECK(contains(r.err, "exit code 5"));
    auto j = read_json(dir / "logs/attempt_0/rank_0/error.json");
    CHECK(j["exitcode"] == 5);
    CHECK(j["written_by"] == "worker, completed by accel-run");
    CHECK(contains(j["worker_content_note"].get<std::string>(),
                   "not parsed: JSON nested more than 64 levels deep; cut to its first 65536"));
    CHECK(j["worker_content"].get<std::string>().size() == 65536);
  }
  SUBCASE("a link at error.json.tmp, a FIFO at error.json: nothing followed, nothing blocks") {
    TempDir dir;
    write_file(dir / "outside", "precious");
    // The worker plants a link where accel-run wrote its temporary: the report went into the
    // link's target, and error.json became that link.
    Result r = accel_run(
        launch_args({"--num_processes", "1", "--log_dir", dir / "logs"},
                    {"fail", "--code", "4", "--dir", dir.str(), "--error_link", dir / "outside"}));
    CHECK(r.code == 4);
    CHECK(read_file(dir / "outside") == "precious");
    const std::string ef = dir / "logs/attempt_0/rank_0/error.json";
    CHECK(!fs::is_symlink(ef));
    CHECK(read_json(ef)["exitcode"] == 4);
    // error.json made a FIFO: opening it to read blocked accel-run (Proc::finish gives up after
    // 30 s). It is described instead, and replaced by the report.
    Result f = accel_run(launch_args({"--num_processes", "1", "--log_dir", dir / "logs"},
                                     {"fail", "--code", "6", "--dir", dir.str(), "--error_fifo"}));
    CHECK(f.code == 6);
    auto j = read_json(ef);
    CHECK(j["exitcode"] == 6);
    CHECK(contains(j["worker_content_note"].get<std::string>(), "is a FIFO"));
  }
  SUBCASE("a link planted in --log_dir: refused, its target untouched") {
    TempDir dir;
    write_file(dir / "outside", "precious");
    fs::create_directories(dir / "logs/attempt_0/rank_0");
    fs::create_symlink(dir / "outside", dir / "logs/attempt_0/rank_0/stdout.log");
    Result r = accel_run(launch_args({"--num_processes", "1", "--log_dir", dir / "logs"},
                                     {"env", "--dir", dir.str()}));
    CHECK(r.code == 1);
    CHECK(contains(r.err, dir / "logs/attempt_0/rank_0/stdout.log' already exists and is a "
                                "symbolic link"));
    CHECK(read_file(dir / "outside") == "precious");
    CHECK(count_files(dir, "env.") == 0);  // nothing was started
    // A --log_dir that anyone may rewrite is refused the same way.
    fs::create_directories(dir / "open");
    fs::permissions(dir / "open", fs::perms::all);
    Result o = accel_run(launch_args({"--num_processes", "1", "--log_dir", dir / "open/logs"},
                                     {"env", "--dir", dir.str()}));
    CHECK(o.code == 1);
    CHECK(contains(o.err, "world-writable without the sticky bit"));
  }
}

TEST_CASE("launch: floating flags refuse nan, inf and negative values (Note [floating options])") {
  // Before: --grace_period nan and --stopped_timeout nan were accepted and acted as 0.
  for (const std::string flag : {"--grace_period", "--stopped_timeout", "--monitor_interval"}) {
    for (const std::string bad : {"nan", "NaN", "inf", "-inf", "-1", "1e999"}) {
      CAPTURE(flag);
      CAPTURE(bad);
      Result r = accel_run(launch_args({flag, bad}, {"env"}));
      CHECK(r.code != 0);
      CHECK((contains(r.err, flag) || contains(r.err, "seconds")));
    }
  }
  Result nan = accel_run(launch_args({"--grace_period", "nan"}, {"env"}));
  CHECK(contains(nan.err, "expected a number in [0, 300], got nan"));
  CHECK(!al::check_number(0, 0, 300));
  CHECK(!al::check_number(300, 0, 300));
  CHECK(al::check_number(0, 0, 60, /*lo_open=*/true).has_value());
  CHECK(*al::check_number(std::nan(""), 0, 60) == "expected a number in [0, 60], got nan");
  CHECK(*al::check_number(HUGE_VAL, 0, 60) == "expected a finite number in [0, 60], got inf");
  CHECK(*al::check_number(-1, 0, 60) == "expected a number in [0, 60], got -1");
}

TEST_CASE("launch: SIGUSR1 is forwarded to the workers and does not stop the job") {
  // Before: SIGUSR1's default action killed accel-run (exit 138) and the workers with it.
  TempDir dir;
  Proc p(launch_args({"--num_processes", "2"}, {"usr1", "--dir", dir.str()}));
  REQUIRE(wait_for([&] { return count_files(dir, "pid.") == 2; }, 20));
  kill(p.pid(), SIGUSR1);
  Result r = p.finish(30);
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(contains(r.err, "received SIGUSR1: forwarded it to 2 worker(s)"));
  for (int rank = 0; rank < 2; ++rank)
    CHECK(read_file(dir / ("usr1." + std::to_string(rank))) == "checkpoint");

  CHECK(al::parse_forward_signals(" usr1, SIGUSR2,10") == std::vector<int>{SIGUSR1, SIGUSR2});
  CHECK(al::parse_forward_signals("none").empty());
  CHECK_THROWS_WITH_AS(al::parse_forward_signals("SIGKILL"),
                       doctest::Contains("cannot be forwarded"), al::ConfigError);
  CHECK_THROWS_WITH_AS(al::parse_forward_signals("SIGFOO"),
                       doctest::Contains("unknown signal 'SIGFOO'"), al::ConfigError);
  Result bad = accel_run(launch_args({"--forward_signals", "SIGSEGV"}, {"env"}));
  CHECK(bad.code == 1);
  CHECK(contains(bad.err, "SIGSEGV cannot be forwarded"));
}

TEST_CASE("accel-run never aborts: exceptions outside accel::Error end with a message and exit 1") {
  // A path component longer than NAME_MAX makes std::filesystem::exists throw filesystem_error,
  // which escaped main before (terminate, exit 134).
  const std::string long_name(300, 'a');
  Result r = accel_run(launch_args({"--config_file", long_name}, {"env"}));
  CHECK(r.code == 1);
  CHECK(contains(r.err, "accel-run: error: "));
  CHECK(contains(r.err, "File name too long"));
  Result d = accel_run({"launch", kWorker, "env"}, {{"ACCEL_CONFIG_FILE", long_name}});
  CHECK(d.code == 1);
  CHECK(!contains(d.err, "terminate called"));
}

TEST_CASE(
    "rendezvous token: generated on one machine, required across several, `accel-run token`") {
  al::LaunchConfig cfg;
  cfg.num_processes = 4;
  al::LaunchPlan one = al::resolve_plan(cfg, {}, {}, 0);
  al::resolve_rendezvous_token(one, {}, {});
  CHECK(one.rendezvous_token.size() == 32);
  CHECK(one.rendezvous_token.find_first_not_of("0123456789abcdef") == std::string::npos);

  al::LaunchFlags f;
  f.num_machines = 2;
  f.main_process_ip = "10.0.0.1";
  al::LaunchPlan two = al::resolve_plan(cfg, f, {}, 0);
  CHECK_THROWS_WITH_AS(al::resolve_rendezvous_token(two, f, {}),
                       doctest::Contains("accel-run token"), al::ConfigError);
  al::resolve_rendezvous_token(two, f, env_of({{"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
  CHECK(two.rendezvous_token == kToken);
  CHECK_THROWS_WITH_AS(
      al::resolve_rendezvous_token(two, f, env_of({{"ACCEL_RENDEZVOUS_TOKEN", "short"}})),
      doctest::Contains("at least 16"), al::ConfigError);
  f.rendezvous_token = "flag-token-flag-token";
  al::resolve_rendezvous_token(two, f, env_of({{"ACCEL_RENDEZVOUS_TOKEN", kToken}}));
  CHECK(two.rendezvous_token == "flag-token-flag-token");
  // One task per worker on one node: the tasks cannot agree on a random token either.
  al::EnvMap per_task = env_of({{"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "2"},
                                {"SLURM_NNODES", "1"},
                                {"SLURM_LOCALID", "0"},
                                {"SLURM_JOB_NODELIST", "n1"}});
  al::LaunchPlan task = al::resolve_plan(cfg, {}, per_task, 0);
  CHECK_THROWS_WITH_AS(al::resolve_rendezvous_token(task, {}, per_task),
                       doctest::Contains("2 separately launched tasks"), al::ConfigError);

  Result a = accel_run({"token"}), b = accel_run({"token"});
  CHECK(a.code == 0);
  CHECK(a.out.size() == 33);
  CHECK(a.out != b.out);
}

TEST_CASE("launch: mesh sizes reach the workers; sizes that do not fit the world start nothing") {
  TempDir dir;
  Result ok = accel_run(launch_args({"--num_processes", "2", "--cpu", "-q", "--tp-size", "2"},
                                    {"env", "--dir", dir.str()}));
  REQUIRE_MESSAGE(ok.code == 0, ok.err);
  for (const char* f : {"env.0", "env.1"}) {
    auto e = read_env_file(dir / f);
    CHECK(e["ACCEL_TP_SIZE"] == "2");
    CHECK(e.count("ACCEL_DP_SHARD_SIZE") == 0);  // inferred in the program (Note [mesh sizes])
    CHECK(e.count("ACCEL_DP_REPLICATE_SIZE") == 0);
  }
  TempDir bad;
  Result r = accel_run(launch_args({"--num_processes", "4", "--cpu", "--dp_replicate_size", "3"},
                                   {"env", "--dir", bad.str()}));
  CHECK(r.code == 1);
  CHECK_MESSAGE(
      contains(r.err, "dp_replicate_size 3, dp_shard_size unset, cp_size unset, tp_size unset"),
      r.err);
  CHECK_MESSAGE(contains(r.err, "does not fit 4 processes"), r.err);
  CHECK(count_files(bad, "env.") == 0);  // refused before any worker started
}

TEST_CASE("launch: what the workers would refuse starts nothing, naming flag, key or variable") {
  // --strategy zero1 --zero_stage 3: the Accelerator's refusal, before any worker.
  TempDir dir;
  Result r = accel_run(
      launch_args({"--num_processes", "2", "--cpu", "--strategy", "zero1", "--zero_stage", "3"},
                  {"env", "--dir", dir.str()}));
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.err, "strategy 'zero1' and zero_stage 3 contradict each other"), r.err);
  CHECK_MESSAGE(contains(r.err, "zero_stage 3 from --zero_stage"), r.err);
  CHECK(count_files(dir, "env.") == 0);
  // --tp_size 2 --zero_stage 2 starts (every strategy composes with tp).
  TempDir ok;
  Result tp_zero = accel_run(
      launch_args({"--num_processes", "2", "--cpu", "--tp_size", "2", "--zero_stage", "2"},
                  {"env", "--dir", ok.str()}));
  CHECK_MESSAGE(tp_zero.code == 0, tp_zero.err);
  CHECK(count_files(ok, "env.") == 2);
  // An ACCEL_TP_SIZE exported in the shell that does not fit the world about to start.
  Result inherited =
      accel_run(launch_args({"--num_processes", "2", "--cpu"}, {"env", "--dir", dir.str()}),
                {{"ACCEL_TP_SIZE", "4"}});
  CHECK(inherited.code == 1);
  CHECK_MESSAGE(contains(inherited.err, "does not fit 2 processes"), inherited.err);
  CHECK_MESSAGE(contains(inherited.err,
                         "tp_size 4 from ACCEL_TP_SIZE inherited from accel-run's "
                         "environment"),
                inherited.err);
  CHECK_MESSAGE(contains(inherited.err, "env -u ACCEL_TP_SIZE accel-run"), inherited.err);
  CHECK(count_files(dir, "env.") == 0);
  // One that fits reaches the workers as before.
  Result fits =
      accel_run(launch_args({"--num_processes", "2", "--cpu", "-q"}, {"env", "--dir", dir.str()}),
                {{"ACCEL_TP_SIZE", "2"}});
  REQUIRE_MESSAGE(fits.code == 0, fits.err);
  CHECK(read_env_file(dir / "env.0")["ACCEL_TP_SIZE"] == "2");
  // A key given twice in a nested mapping of the config file.
  write_file(dir / "dup.yaml", "zero_config:\n  zero_stage: 3\n  zero_stage: 1\n");
  Result dup =
      accel_run(launch_args({"--config_file", dir / "dup.yaml"}, {"env", "--dir", dir.str()}));
  CHECK(dup.code == 1);
  CHECK_MESSAGE(contains(dup.err, "dup.yaml:3: key 'zero_config.zero_stage': is given twice"),
                dup.err);
}
