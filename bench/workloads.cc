// The reference workloads of shared/WORKLOADS.md:  build/bench/workloads [options] NAME
//
// Each workload prints one line per figure as key=value pairs, for example
//   workload=op mode=grad us_per_op=0.21
//   workload=matmul n=1024 accel_gflops=160.2 dnnl_sgemm_gflops=165.0 ratio=0.971
// Where a direct-library peer exists, it is measured in the same run (alternating with the
// framework, medians over rounds), because absolute figures drift on shared machines: the ratio
// is what counts. With --vs libtorch (and in `all`, whenever the peer is built) op, mlp, cnn and
// gpt run next to bench/peers/torch_workloads, alternating process by process, and print
//   workload=mlp accel_ms_per_step=20.1 libtorch_ms_per_step=41.0 ratio=2.040 threads=2 ...
// where ratio > 1 means ours is faster. The contract is in docs/bench.md.
//
// The first line names the CPU features found (cpu_features avx2=1 avx512f=1 avx512_bf16=1 ...),
// so that every figure says what machine made it; on CPUs without bf16 instructions it adds
// bf16_targets=unmeasurable. --precision bf16|fp16 trains mlp/cnn/gpt in float32 and under
// autocast alternating in one run (bench/model_workloads.h) and adds the autocast matmul line.
//
// Adding a workload: write `void run_<name>()` (the single-op ones are in op_workloads.cc, the
// training ones in model_workloads.cc and the files it names) and add it to registry(). `all` runs
// every registered workload in registry order, except those registered with in_all = false
// (zero-memory: minutes of multi-process runs, reported in a section of its own).
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accel.h"
#include "bench/cpu_workloads.h"
#include "bench/model_workloads.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/threading.h"
#include "bench/line.h"
#include "bench/median.h"
#include "bench/op_workloads.h"
#include "bench/timing.h"

using namespace accel;
using bench::Clock;
using bench::Line;
using bench::median;
using bench::seconds_since;

namespace {

// ---------------- subprocesses: bench/allreduce, the libtorch peer, our runs in --vs mode
// ----------------

// The directory of this program, where its siblings live (bench/allreduce,
// bench/peers/torch_workloads): dirname(argv[0]), or that of /proc/self/exe when argv[0] has
// no directory part (found through PATH).
std::string g_argv0 = "workloads";
std::string g_self_dir = ".";

std::string self_dir(const std::string& argv0) {
  std::string path = argv0;
  if (path.find('/') == std::string::npos) {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    path = n > 0 ? std::string(buf, size_t(n)) : std::string("./") + argv0;
  }
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

struct Captured {
  int status = 0;   // exit code; 128 + signal number when the child was killed
  std::string out;  // its stdout (its stderr is ours)
};

// Runs `exe` with `argv` (argv[0] included) and extra environment variables; returns the
// child's stdout and exit status.
Captured run_capture(const std::string& exe, const std::vector<std::string>& argv,
                     const std::vector<std::pair<std::string, std::string>>& env = {}) {
  int fds[2];
  ACCEL_CHECK(pipe(fds) == 0, Error, "workloads", "pipe() failed: ", std::strerror(errno));
  std::fflush(stdout);  // or the child would inherit (and print) our buffered lines
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    ACCEL_THROW(Error, "workloads", "fork() failed for ", exe, ": ", std::strerror(errno));
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(exe.c_str(), args.data());
    std::fprintf(stderr, "workloads: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  Captured c;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0)
      c.out.append(buf, size_t(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return c;
}

// A result line split into its key=value pairs, in order.
using Fields = std::vector<std::pair<std::string, std::string>>;

Fields parse_fields(const std::string& line) {
  Fields f;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t j = line.find(' ', i);
    if (j == std::string::npos) j = line.size();
    const std::string tok = line.substr(i, j - i);
    const size_t eq = tok.find('=');
    if (eq != std::string::npos && eq > 0) f.emplace_back(tok.substr(0, eq), tok.substr(eq + 1));
    i = j;
  }
  return f;
}

std::string field(const Fields& f, const std::string& key) {
  for (const auto& [k, v] : f)
    if (k == key) return v;
  return "";
}

// The lines of `out` whose first pair is workload=<name>.
std::vector<Fields> result_lines(const std::string& out, const std::string& name) {
  std::vector<Fields> lines;
  size_t i = 0;
  while (i < out.size()) {
    size_t j = out.find('\n', i);
    if (j == std::string::npos) j = out.size();
    Fields f = parse_fields(out.substr(i, j - i));
    if (!f.empty() && f[0].first == "workload" && f[0].second == name)
      lines.push_back(std::move(f));
    i = j + 1;
  }
  return lines;
}

// ---------------- allreduce: bench/allreduce, a separate program (it links Gloo directly)
// ----------------

// Runs build/bench/allreduce --json (2 processes on loopback; our all-reduce next to raw Gloo's
// ring in the same processes) and prints its figures as one key=value line.
void run_allreduce() {
  const std::string exe = g_self_dir + "/allreduce";
  ACCEL_CHECK(is_executable(exe), IoError, "workloads", "the allreduce bench is not built: ", exe,
              " is missing (ninja -C build bench/allreduce)");
  const Captured c = run_capture(exe, {exe, "--json"});
  ACCEL_CHECK(c.status == 0, DistError, "workloads", exe, " exited with status ", c.status,
              c.status == 1 ? " (a rank failed, or the results differ from raw Gloo's)" : "");
  // One flat JSON object of numbers and booleans: {"workload":"allreduce","mib":64,...}.
  const size_t open = c.out.find('{'), close_at = c.out.rfind('}');
  ACCEL_CHECK(open != std::string::npos && close_at != std::string::npos && open < close_at,
              ValueError, "workloads", "no JSON object in the output of ", exe, ": '", c.out, "'");
  Fields json;
  const std::string body = c.out.substr(open + 1, close_at - open - 1);
  size_t i = 0;
  while (i < body.size()) {
    size_t j = body.find(',', i);
    if (j == std::string::npos) j = body.size();
    std::string item = body.substr(i, j - i);
    item.erase(std::remove(item.begin(), item.end(), '"'), item.end());
    const size_t colon = item.find(':');
    if (colon != std::string::npos)
      json.emplace_back(item.substr(0, colon), item.substr(colon + 1));
    i = j + 1;
  }
  // The figure, its peer and the ratio first, as in the other lines; then the rest.
  const char* const first[] = {"mib", "procs", "accel_gbps", "raw_gloo_ring_gbps", "ratio"};
  Line line;
  line.kv("workload", "allreduce");
  for (const char* k : first) {
    const std::string v = field(json, k);
    ACCEL_CHECK(!v.empty(), ValueError, "workloads", "the output of ", exe, " has no '", k, "'");
    line.kv(k, v);
  }
  for (const auto& [k, v] : json) {
    if (k == "workload" || std::find_if(std::begin(first), std::end(first),
                                        [&](const char* f) { return k == f; }) != std::end(first))
      continue;
    line.kv(k.c_str(), v);
  }
}

// ---------------- registry ----------------

struct Workload {
  const char* name;
  const char* what;
  std::function<void()> run;
  bool in_all = true;  // false: only by name (a long run with its own report section)
};

const std::vector<Workload>& registry() {
  static const std::vector<Workload> r = {
      {"op", "c = a + b on 16 f32 elements, with grad and no-grad: us per op", run_op},
      {"matmul", "f32 matmul 256^3 and 1024^3 vs direct dnnl_sgemm: GFLOP/s", run_matmul},
      {"mlp", "784-1024-1024-10 on Fashion-MNIST, batch 256, AdamW: ms per step", bench::run_mlp},
      {"cnn", "2-conv CNN on Fashion-MNIST, batch 128, AdamW: ms per step", bench::run_cnn},
      {"gpt", "byte GPT (875,264 params) on fortunes, 32 x 128, AdamW: ms per step",
       bench::run_gpt},
      {"sdpa",
       "scaled_dot_product_attention B=1 H=8 T=S=2048 D=64 f32: fused vs materialised (T, S) "
       "path, ms, GFLOP/s and allocator peak MB",
       run_sdpa},
      {"sdpa-gpt",
       "fused attention at the gpt shape (packed qkv 32 x 128 x 384, 4 heads, causal): f32 vs "
       "bf16 forward and forward + backward ms",
       run_sdpa_gpt},
      {"lstm",
       "word_language_model medium LSTM (2 x 650, batch 20, 35 steps): forward + backward ms "
       "per step",
       bench::run_lstm},
      {"time-seq",
       "time_sequence_prediction (2 LSTMCells of 51 units, 97 x 999 steps: tiny GEMMs): ms per "
       "forward + backward, 1 thread vs the team, f64 and f32",
       bench::run_time_seq},
      {"gemm-grain",
       "GEMMs 97x1x204 .. 384^3, 1 thread vs the team with the GEMM grain off: us per product "
       "(Note [GEMM grain]; not in `all`)",
       bench::run_gemm_grain, false},
      {"allreduce",
       "64 MiB f32 sum-allreduce, 2 processes, vs raw Gloo ring: GB/s (bench/allreduce)",
       run_allreduce},
      {"ddp-mlp", "mlp, 2 processes x 1 thread (Gloo), 128 per rank: ms per step",
       bench::run_ddp_mlp},
      {"zero-memory",
       "GPT 49.6M params via the Accelerator, ZeRO stages 0-3 x 1,2,4 processes: peak RSS, "
       "allocator peak, ms per step per rank (not in `all`; about 5 minutes)",
       bench::run_zero_memory, false},
      {"zero-checkpoint",
       "GPT 49.6M params, ZeRO-3: save_state at 4 processes, load_state at 4 and 2 (re-sharded): "
       "load peak and time against training's (not in `all`; a few minutes)",
       bench::run_zero_checkpoint, false},
      {"tp-memory",
       "GPT 49.6M params via the Accelerator at tp 1, 2, 4 (with and without sequence "
       "parallelism): per-rank parameter + gradient + optimizer bytes, activation peak, ms per "
       "step, tp bytes per step (not in `all`; a few minutes)",
       bench::run_tp_memory, false},
      {"cp-memory",
       "GPT (d_model 128, 2 layers) via the Accelerator on one sequence of 4096 and 8192 tokens "
       "at cp 1, 2, 4: per-rank activation peak, ms per step (not in `all`; a few minutes)",
       bench::run_cp_memory, false},
      {"pp-bubble",
       "pipeline schedules (GPipe, 1F1B, interleaved 1F1B) over 2 and 4 processes, 8 "
       "microbatches: measured idle fraction against (p-1)/(m+p-1) (not in `all`; a minute)",
       bench::run_pp_bubble, false},
  };
  return r;
}

// ---------------- --vs libtorch: our workload and the libtorch peer, alternating ----------------

// The workloads bench/peers/torch_workloads implements.
bool has_libtorch_peer(const std::string& name) {
  return name == "op" || name == "mlp" || name == "cnn" || name == "gpt" || name == "lstm";
}

struct PeerOptions {
  bool compare = false;      // run the libtorch peer next to ours
  bool required = false;     // --vs libtorch given: a missing or failing peer is an error
  int rounds = 2;            // (ours, peer) rounds per workload
  int round_budget_s = 60;   // seconds; no new round starts after this long on one workload
  std::vector<int> threads;  // peer thread counts; empty: 1 and our OpenMP team size
};

// The figure of a result line: ms_per_step (training) or us_per_op (op); lower is better.
bool figure_of(const Fields& f, std::string* key, double* value) {
  for (const char* k : {"ms_per_step", "us_per_op"}) {
    const std::string v = field(f, k);
    if (v.empty()) continue;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(d > 0)) return false;
    *key = k;
    *value = d;
    return true;
  }
  return false;
}

// Best (lowest) figure per line (per `mode`) over the runs of one side.
struct Side {
  std::vector<std::string> modes;  // in first-seen order
  std::vector<Fields> best;        // parallel to modes
  std::vector<double> value;
  std::string key;  // ms_per_step or us_per_op

  // Returns the line's index when it is the best so far of its mode, else -1.
  int add(const Fields& f, const std::string& who) {
    std::string k;
    double v = 0;
    ACCEL_CHECK(figure_of(f, &k, &v), ValueError, "workloads", who,
                " printed a line without a positive ms_per_step / us_per_op");
    key = k;
    const std::string mode = field(f, "mode");
    int i = find(mode);
    if (i < 0) {
      modes.push_back(mode);
      best.push_back(f);
      value.push_back(v);
      return int(modes.size()) - 1;
    }
    if (v >= value[size_t(i)]) return -1;
    best[size_t(i)] = f;
    value[size_t(i)] = v;
    return i;
  }
  int find(const std::string& mode) const {
    const auto it = std::find(modes.begin(), modes.end(), mode);
    return it == modes.end() ? -1 : int(it - modes.begin());
  }
};

void echo_lines(const char* who, const std::string& out) {
  size_t i = 0;
  while (i < out.size()) {
    size_t j = out.find('\n', i);
    if (j == std::string::npos) j = out.size();
    if (j > i) std::fprintf(stderr, "# %s: %s\n", who, out.substr(i, j - i).c_str());
    i = j + 1;
  }
}

// The step counts of this run, for the peer's flags: ACCEL_BENCH_STEPS / ACCEL_BENCH_WARMUP
// (set by --steps / --warmup, or by the caller) apply to both sides alike.
std::vector<std::string> peer_step_flags() {
  std::vector<std::string> flags;
  for (const auto& [env, flag] :
       {std::pair<const char*, const char*>{"ACCEL_BENCH_STEPS", "--steps"},
        {"ACCEL_BENCH_WARMUP", "--warmup"}}) {
    const char* v = std::getenv(env);
    if (v != nullptr && *v != '\0') {
      flags.push_back(flag);
      flags.push_back(v);
    }
  }
  return flags;
}

// Runs workload `name` (ours: this program with --vs none, in a child process, as the peer
// is) and the libtorch peer in alternating rounds: ours, peer, peer, ours, ours, peer, ... so
// that drift on a shared machine hits both sides alike. Each run's figure is already a median
// over its steps; each side keeps its best run (the peer: over rounds and thread counts, as
// WORKLOADS.md quotes PyTorch). Prints one line per figure:
//   workload=mlp accel_ms_per_step=20.1 libtorch_ms_per_step=41.0 ratio=2.040 threads=2 ...
// Returns false when the peer is missing or gave no figure (ours is printed then, with
// libtorch=unavailable or libtorch=failed).
bool run_vs_libtorch(const std::string& name, const PeerOptions& opt) {
  const std::string peer = g_self_dir + "/peers/torch_workloads";
  const bool have_peer = is_executable(peer);
  if (!have_peer) {
    static bool told = false;
    if (!told)
      std::fprintf(stderr,
                   "workloads: libtorch peer not built: %s is missing (apt-get install "
                   "libtorch-dev libopenblas0, then ninja -C build bench/peers/torch_workloads); "
                   "printing our figures only\n",
                   peer.c_str());
    told = true;
  }
  std::vector<int> threads = opt.threads;
  if (threads.empty()) {
    threads = {1, omp_get_max_threads()};
    if (name == "op") threads = {1};  // one 16-element add: more threads only add overhead
  }
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());

  Side ours, theirs;
  std::vector<std::string> peer_threads_of_best;  // parallel to theirs.modes
  std::string peer_error;
  const auto run_ours = [&] {
    const Captured c = run_capture("/proc/self/exe", {g_argv0, "--vs", "none", name});
    echo_lines("accel", c.out);
    ACCEL_CHECK(c.status == 0, Error, "workloads", name, ": our run exited with status ", c.status);
    const std::vector<Fields> lines = result_lines(c.out, name);
    ACCEL_CHECK(!lines.empty(), ValueError, "workloads", name, ": our run printed no result line");
    for (const Fields& f : lines) ours.add(f, "accel " + name);
  };
  const auto run_peer = [&] {
    for (const int t : threads) {
      std::vector<std::string> argv = {peer, name, "--threads", std::to_string(t)};
      for (const std::string& s : peer_step_flags()) argv.push_back(s);
      const Captured c = run_capture(peer, argv);
      echo_lines("libtorch", c.out);
      const std::vector<Fields> lines = result_lines(c.out, name);
      if (c.status != 0 || lines.empty()) {
        peer_error = "torch_workloads " + name + " --threads " + std::to_string(t) +
                     " exited with status " + std::to_string(c.status);
        std::fprintf(stderr, "workloads: %s\n", peer_error.c_str());
        continue;
      }
      for (const Fields& f : lines) {
        const int i = theirs.add(f, "torch_workloads " + name);
        if (i < 0) continue;
        if (peer_threads_of_best.size() <= size_t(i)) peer_threads_of_best.resize(size_t(i) + 1);
        peer_threads_of_best[size_t(i)] = std::to_string(t);
      }
    }
  };
  const auto t0 = Clock::now();
  int rounds = 0;
  for (int r = 0; r < std::max(1, opt.rounds); ++r) {
    if (r > 0 && (!have_peer || seconds_since(t0) > opt.round_budget_s)) break;
    if (r % 2 == 0) {
      run_ours();
      if (have_peer) run_peer();
    } else {
      run_peer();
      run_ours();
    }
    ++rounds;
  }

  bool complete = have_peer;
  for (size_t i = 0; i < ours.modes.size(); ++i) {
    const int j = theirs.find(ours.modes[i]);
    if (j < 0) {
      // Our line as printed, marked: the reader sees which figures have no peer.
      Line line;
      for (const auto& [k, v] : ours.best[i]) line.kv(k.c_str(), v);
      line.kv("libtorch", have_peer ? "failed" : "unavailable");
      complete = false;
      continue;
    }
    const std::string& key = ours.key;
    const double speed = theirs.value[size_t(j)] / ours.value[i];  // > 1: ours faster
    Line line;
    line.kv("workload", name);
    if (!ours.modes[i].empty()) line.kv("mode", ours.modes[i]);
    line.kv(("accel_" + key).c_str(), field(ours.best[i], key))
        .kv(("libtorch_" + key).c_str(), field(theirs.best[size_t(j)], key))
        .kv("ratio", speed, 3);
    if (const std::string t = field(ours.best[i], "threads"); !t.empty()) line.kv("threads", t);
    line.kv("libtorch_threads", peer_threads_of_best[size_t(j)]);
    if (const std::string s = field(ours.best[i], "steps"); !s.empty()) line.kv("steps", s);
    line.kv("rounds", int64_t(rounds));
  }
  return complete;
}

// One flag of /proc/cpuinfo's first "flags" line (what the kernel says the CPU has).
bool cpu_flag(const std::string& flags, const char* name) {
  const std::string f = std::string(" ") + name + " ";
  return (" " + flags + " ").find(f) != std::string::npos;
}

// The first output line: the CPU features that decide which kernels run (once per bench, not
// in the child processes it starts, which inherit ACCEL_BENCH_FEATURES_SHOWN).
void print_cpu_features() {
  if (std::getenv("ACCEL_BENCH_FEATURES_SHOWN") != nullptr) return;
  setenv("ACCEL_BENCH_FEATURES_SHOWN", "1", 1);
  std::string flags;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') == std::string::npos ? 0 : line.find(':') + 1);
      break;
    }
  }
  const bool bf16 = cpu_flag(flags, "avx512_bf16") || cpu_flag(flags, "amx_bf16");
  Line l;
  l.kv("cpu_features", std::string(flags.empty() ? "unknown" : "x86"))
      .kv("avx2", int64_t(cpu_flag(flags, "avx2")))
      .kv("avx512f", int64_t(cpu_flag(flags, "avx512f")))
      .kv("avx512_bf16", int64_t(cpu_flag(flags, "avx512_bf16")))
      .kv("avx512_fp16", int64_t(cpu_flag(flags, "avx512_fp16")))
      .kv("amx_bf16", int64_t(cpu_flag(flags, "amx_bf16")))
      .kv("amx_fp16", int64_t(cpu_flag(flags, "amx_fp16")));
  // The bf16 speed targets (docs/bench.md) need bf16 instructions; elsewhere autocast only has
  // to stay within 10 % of float32.
  // Which kernel a bf16 matmul/conv runs (Note [bf16 GEMM where it does not pay]): where the
  // bf16 instruction is slower than float32 FMAs, no bf16 speed-up is there to measure.
  const char* onednn_cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  l.kv("accel_isa", std::string(accel::cpu::cpu_isa_name()))
      .kv("onednn_max_isa", std::string(onednn_cap != nullptr ? onednn_cap : "default"));
  l.kv("bf16_gemm", std::string(accel::cpu::bf16_gemm_name()))
      .kv("bf16_gemm_why", std::string(accel::cpu::bf16_gemm_reason()));
  const bool capped =
      onednn_cap != nullptr && std::string(onednn_cap).find("AVX512") == std::string::npos &&
      std::string(onednn_cap).find("AMX") == std::string::npos && std::string(onednn_cap) != "ALL";
  if (capped) {
    l.kv("bf16_targets", std::string("unmeasurable_onednn_capped_below_avx512"));
  } else if (!bf16) {
    l.kv("bf16_targets", std::string("unmeasurable_without_bf16_instructions"));
  } else if (accel::cpu::bf16_gemm() == accel::cpu::Bf16Gemm::F32) {
    l.kv("bf16_targets", std::string("unmeasurable_bf16_gemm_slower_than_f32_here"));
  }
  // How the OpenMP team waits (Note [OpenMP wait default]) and the GEMM grain: both change the
  // figures on a shared machine.
  l.kv("omp_wait", accel::cpu::wait_default_name()).kv("gemm_grain", accel::cpu::gemm_grain());
  l.kv("cpu_team", std::string(accel::cpu::team_mode_name()));
  std::fprintf(stderr, "# cpu: accel_isa=%s (ACCEL_CPU_ISA forces a lower one)\n",
               accel::cpu::cpu_isa_name());
}

// --busy N: N processes beside the workload, each one thread spinning at our nice level, for as
// long as this program runs (issue 40: "no collapse on a shared machine"). Started once, by the
// first program (ACCEL_BENCH_BUSY_RUNNING keeps the children of --vs mode from starting more);
// every result line says busy=N (bench/line.h, ACCEL_BENCH_BUSY).
std::vector<pid_t> g_busy;

void stop_busy() {
  for (const pid_t p : g_busy) kill(p, SIGKILL);
  for (const pid_t p : g_busy) waitpid(p, nullptr, 0);
  g_busy.clear();
}

void start_busy(int n) {
  if (n <= 0 || std::getenv("ACCEL_BENCH_BUSY_RUNNING") != nullptr) return;
  setenv("ACCEL_BENCH_BUSY_RUNNING", "1", 1);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    ACCEL_CHECK(pid >= 0, Error, "workloads",
                "fork() failed for a busy process: ", std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
      if (getppid() != parent) _exit(0);
      volatile uint64_t x = 0;
      for (;;) x = x + 1;
    }
    g_busy.push_back(pid);
  }
  std::atexit(stop_busy);
  std::fprintf(stderr, "# busy: %d spinning processes beside the workloads (pids", n);
  for (const pid_t p : g_busy) std::fprintf(stderr, " %d", int(p));
  std::fprintf(stderr, ")\n");
}

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [options] NAME\n"
               "  all       every workload below, in order; with the libtorch peer whenever it "
               "is built\n",
               argv0);
  for (const Workload& w : registry()) std::fprintf(stderr, "  %-11s %s\n", w.name, w.what);
  std::fprintf(
      stderr,
      "options:\n"
      "  --vs libtorch       op, mlp, cnn, gpt, lstm next to bench/peers/torch_workloads, "
      "alternating\n"
      "                      in the same run; exit 1 when the peer is not built\n"
      "  --vs none           no libtorch peer (the default for a single NAME)\n"
      "  --rounds N          (ours, peer) rounds per workload (default 2)\n"
      "  --round-budget S    no new round after S seconds on one workload (default 60)\n"
      "  --peer-threads L    peer thread counts, comma-separated (default: 1 and "
      "OMP_NUM_THREADS)\n"
      "  --steps N           timed training steps (default 50, WORKLOADS.md's minimum)\n"
      "  --warmup N          warm-up steps before them (default 5)\n"
      "  --busy N            N busy processes (one spinning thread each, same nice) beside\n"
      "                      the workloads; every line says busy=N\n"
      "  --limit-rounds K    mlp, cnn, gpt: the limit replayed K times between chunks of the\n"
      "                      timed steps (default 5; median and spread printed)\n"
      "  --profile           mlp, cnn, gpt: after the timing, the top ops by self time over\n"
      "                      10 steps and the time outside kernels (bench/step_limit.h)\n"
      "  --precision P       fp32 (default), bf16 or fp16: mlp, cnn, gpt also train under\n"
      "                      autocast, alternating with fp32; matmul adds the autocast "
      "line\n"
      "zero-memory options:\n"
      "  --worlds L          process counts, comma-separated (default 1,2,4)\n"
      "  --stages L          ZeRO stages 0-3, comma-separated (default 0,1,2,3)\n"
      "  --d-model N         GPT width (default 640; heads of 64 where it divides)\n"
      "  --eager-init        zero-memory: build the ZeRO-3 model whole, not deferred\n"
      "  --layers N          GPT blocks (default 10)\n"
      "  (--steps / --warmup default to 5 / 2 there)\n"
      "zero-checkpoint options: as zero-memory; --worlds S,L...: save at S ranks, load at each\n"
      "  (default 4,2), --stages (default 3)\n");
}

// A positive integer option value, or -1.
int parse_count(const char* s, int lo) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return (end != s && *end == '\0' && v >= lo && v <= 1000000) ? int(v) : -1;
}

}  // namespace

// Exit status: 0 when every figure was printed; 1 when a workload failed (the others still
// run) or --vs libtorch was asked and the peer is missing or failed; 2 on bad usage.
int main(int argc, char** argv) {
  // ACCEL_CPU_ISA=avx2 / baseline model a CPU without AVX-512 (docs/performance.md): accel's own
  // kernels obey it, and here oneDNN is capped the same way (ONEDNN_MAX_CPU_ISA, read at its first
  // primitive; children inherit it) unless the caller chose a cap, so the GEMMs, convolutions
  // and the limit's replays run what such a CPU would run.
  if (const char* isa = std::getenv("ACCEL_CPU_ISA");
      isa != nullptr && std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {
    const std::string s = isa;
    if (s == "avx2") setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
    if (s == "baseline") setenv("ONEDNN_MAX_CPU_ISA", "SSE41", 1);
  }
  g_argv0 = argv[0];
  g_self_dir = self_dir(argv[0]);
  std::string name, vs = "auto";
  PeerOptions peer;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--vs" && has_value) {
      vs = argv[++i];
      if (vs != "libtorch" && vs != "none") {
        std::fprintf(stderr, "--vs takes libtorch or none, got '%s'\n", vs.c_str());
        return 2;
      }
    } else if ((arg == "--rounds" || arg == "--round-budget") && has_value) {
      const int n = parse_count(argv[++i], arg == "--rounds" ? 1 : 0);
      if (n < 0) {
        std::fprintf(stderr, "%s takes a count, got '%s'\n", arg.c_str(), argv[i]);
        return 2;
      }
      (arg == "--rounds" ? peer.rounds : peer.round_budget_s) = n;
    } else if (arg == "--peer-threads" && has_value) {
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        const int t = parse_count(list.substr(p, q - p).c_str(), 1);
        if (t < 0) {
          std::fprintf(stderr, "--peer-threads takes thread counts like 1,2, got '%s'\n",
                       list.c_str());
          return 2;
        }
        peer.threads.push_back(t);
        p = q + 1;
      }
    } else if ((arg == "--steps" || arg == "--warmup") && has_value) {
      const int n = parse_count(argv[++i], arg == "--steps" ? 1 : 0);
      if (n < 0) {
        std::fprintf(stderr, "%s takes a count, got '%s'\n", arg.c_str(), argv[i]);
        return 2;
      }
      // Read by the training workloads (bench/model_workloads.h), here and in the children.
      setenv(arg == "--steps" ? "ACCEL_BENCH_STEPS" : "ACCEL_BENCH_WARMUP",
             std::to_string(n).c_str(), 1);
    } else if (arg == "--precision" && has_value) {
      const std::string p = argv[++i];
      if (p != "fp32" && p != "bf16" && p != "fp16") {
        std::fprintf(stderr, "--precision takes fp32, bf16 or fp16, got '%s'\n", p.c_str());
        return 2;
      }
      setenv("ACCEL_BENCH_PRECISION", p.c_str(), 1);  // read by the workloads, here and in children
    } else if ((arg == "--worlds" || arg == "--stages") && has_value) {
      const std::string list = argv[++i];
      const bool worlds = arg == "--worlds";
      if (bench::parse_int_list(list, worlds ? 1 : 0, worlds ? 64 : 3).empty()) {
        std::fprintf(stderr, "%s takes a comma-separated list of %s, got '%s'\n", arg.c_str(),
                     worlds ? "process counts 1-64" : "stages 0-3", list.c_str());
        return 2;
      }
      // Read by zero-memory (bench/zero_memory.cc), here and in its ranks.
      setenv(worlds ? "ACCEL_BENCH_WORLDS" : "ACCEL_BENCH_STAGES", list.c_str(), 1);
    } else if ((arg == "--d-model" || arg == "--layers") && has_value) {
      const int n = parse_count(argv[++i], 1);
      if (n < 0 || n > (arg == "--d-model" ? 65536 : 1000)) {
        std::fprintf(stderr, "%s takes a count, got '%s'\n", arg.c_str(), argv[i]);
        return 2;
      }
      setenv(arg == "--d-model" ? "ACCEL_BENCH_D_MODEL" : "ACCEL_BENCH_LAYERS",
             std::to_string(n).c_str(), 1);
    } else if ((arg == "--busy" || arg == "--limit-rounds") && has_value) {
      const int n = parse_count(argv[++i], arg == "--busy" ? 0 : 1);
      if (n < 0 || (arg == "--busy" && n > 64)) {
        std::fprintf(stderr, "%s takes a count, got '%s'\n", arg.c_str(), argv[i]);
        return 2;
      }
      setenv(arg == "--busy" ? "ACCEL_BENCH_BUSY" : "ACCEL_BENCH_LIMIT_ROUNDS",
             std::to_string(n).c_str(), 1);
    } else if (arg == "--profile") {
      setenv("ACCEL_BENCH_PROFILE", "1",
             1);  // mlp, cnn, gpt: the per-op table (bench/step_limit.h)
    } else if (arg == "--eager-init") {
      setenv("ACCEL_BENCH_EAGER_INIT", "1", 1);  // zero-memory: ZeRO-3 builds the model whole
    } else if (!arg.empty() && arg[0] != '-' && name.empty()) {
      name = arg;
    } else {
      std::fprintf(stderr, "bad argument '%s'\n", arg.c_str());
      usage(argv[0]);
      return 2;
    }
  }
  if (name.empty()) {
    usage(argv[0]);
    return 2;
  }
  // `all` compares with libtorch whenever the peer is built; a single NAME only when asked. The
  // 16-bit runs compare with our own float32 run instead.
  const bool low = bench::bench_precision() != kFloat32;
  peer.required = vs == "libtorch" && !low;
  peer.compare = peer.required || (vs == "auto" && name == "all" && !low);

  std::vector<const Workload*> todo;
  for (const Workload& w : registry())
    if ((name == "all" && w.in_all) || name == w.name) todo.push_back(&w);
  if (todo.empty()) {
    std::fprintf(stderr, "unknown workload '%s'\n", name.c_str());
    usage(argv[0]);
    return 2;
  }
  if (const char* b = std::getenv("ACCEL_BENCH_BUSY"); b != nullptr) start_busy(std::atoi(b));
  print_cpu_features();
  if (peer.required && name != "all" && !has_libtorch_peer(name))
    std::fprintf(stderr, "workloads: %s has no libtorch peer; running ours alone\n", name.c_str());
  int rc = 0;
  for (const Workload* w : todo) {
    try {
      if (peer.compare && has_libtorch_peer(w->name)) {
        if (!run_vs_libtorch(w->name, peer) && peer.required) rc = 1;
      } else {
        w->run();
      }
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "workload %s failed: %s\n", w->name, e.what());
      rc = 1;
    }
  }
  return rc;
}
