// The training workloads of shared/WORKLOADS.md: mlp, cnn, gpt and ddp-mlp (see the header).
// The models are the ones the examples train (examples/models.h); the data are the real
// Fashion-MNIST train split and the fortunes text, batched by the DataLoader as the examples do.
#include "bench/model_workloads.h"
#include "bench/ranks.h"

#include "bench/interleave.h"
#include "bench/step_limit.h"

#include <netinet/in.h>
#include <omp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "data/data.h"
#include "parallel/ddp.h"
#include "comm/env.h"
#include "comm/process_group.h"
#include "examples/models.h"
#include "bench/median.h"
#include "kernels/cpu/threading.h"

namespace accel::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmupSteps = 5;
constexpr int kTimedSteps = 50;

int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  ACCEL_CHECK(*end == '\0' && n >= 0 && n <= 1000000, ValueError, "workloads", name,
              " must be a count, got '", v, "'");
  return int(n);
}

// Endless batches from a loader: a new epoch (reshuffled) starts when one ends.
class BatchStream {
 public:
  explicit BatchStream(std::shared_ptr<data::DataLoader> loader) : loader_(std::move(loader)) {}
  data::Batch next() {
    if (!started_ || it_ == loader_->end()) {
      it_ = loader_->begin();
      started_ = true;
      ACCEL_CHECK(it_ != loader_->end(), ValueError, "workloads", "the data loader is empty");
    }
    data::Batch b = std::move(*it_);
    ++it_;
    return b;
  }

 private:
  std::shared_ptr<data::DataLoader> loader_;
  data::DataLoader::Iterator it_;
  bool started_ = false;
};

std::shared_ptr<data::DataLoader> shuffled_loader(data::DatasetPtr ds, int64_t batch) {
  data::DataLoaderOptions o;
  o.batch_size = batch;
  o.shuffle = true;
  o.drop_last = true;  // every timed step has the full batch
  return std::make_shared<data::DataLoader>(std::move(ds), o);
}

optim::AdamWOptions adamw(double lr) {
  optim::AdamWOptions o;
  o.lr(lr);
  o.betas({0.9, 0.999});
  o.eps(1e-8);
  o.weight_decay(0.01);
  return o;
}

struct Timing {
  double ms_per_step = 0;
  double loss = 0;
  int steps = 0;
};

// warm-up + timed steps; step() does one full training step and returns its loss.
Timing time_steps(const std::function<Tensor()>& step) {
  const int warmup = env_count("ACCEL_BENCH_WARMUP", kWarmupSteps);
  const int steps = std::max(1, env_count("ACCEL_BENCH_STEPS", kTimedSteps));
  std::vector<double> ms;
  Timing t;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    const Tensor loss = step();
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    t.loss = loss.item();  // outside the timing; CPU work is synchronous
    if (i >= warmup) ms.push_back(dt);
  }
  t.ms_per_step = median(ms);
  t.steps = steps;
  return t;
}

// Two models in one process need the CPU cache's size classes of both, and under the default
// bound (Note [CPU caching allocator]: reserved <= H + max(64 MiB, H / 8)) the alternation made
// the allocator release and re-fault blocks every step: 737 releases over gpt's 46 timed steps,
// about 10 ms a step in both runs (2026-12-04: f32 154.9 -> 144.4 ms, bf16 98.3 -> 88.8 with the
// bound below), which one training program alone never pays (0 releases). So the pair runs with
// room for both (reserved <= 2 H), and the default bound is restored after.
struct TwoModelCache {
  CpuCacheLimits saved = cpu_cache_limits();
  TwoModelCache() {
    CpuCacheLimits two_models = saved;
    two_models.slack_fraction = std::max(saved.slack_fraction, 1.0);
    set_cpu_cache_limits(two_models);
  }
  ~TwoModelCache() { set_cpu_cache_limits(saved); }
};

// The timed steps of one or two training runs (float32, then the autocast one, alternating step
// by step so that load from other processes hits both alike), in limit_rounds() chunks, each
// followed by a replay of every run's step limit (Note [interleaved limit], bench/step_limit.cc).
// Each run gets the median of all its timed steps and its Interleaved spreads.
struct Measured {
  Timing t;
  StepLimit last;  // the last replay (compute / memory split, copy bandwidth)
  Interleaved rounds;
};

std::vector<Measured> time_steps_with_limits(const std::vector<std::function<Tensor()>>& steps) {
  const size_t runs = steps.size();
  const int warmup = env_count("ACCEL_BENCH_WARMUP", kWarmupSteps);
  const int timed = std::max(1, env_count("ACCEL_BENCH_STEPS", kTimedSteps));
  std::vector<Measured> m(runs);
  for (int i = 0; i < warmup; ++i)
    for (size_t k = 0; k < runs; ++k) m[k].t.loss = steps[k]().item();
  // Captured after the warm-up (primitives made, caches warm): one more step per run.
  std::vector<std::unique_ptr<StepLimitProbe>> probes;
  for (size_t k = 0; k < runs; ++k)
    probes.push_back(std::make_unique<StepLimitProbe>([&, k] { steps[k](); }));
  std::vector<std::vector<double>> all(runs), chunk_med(runs), limits(runs);
  for (const int n : round_sizes(timed, limit_rounds())) {
    std::vector<std::vector<double>> chunk(runs);
    for (int i = 0; i < n; ++i) {
      for (size_t k = 0; k < runs; ++k) {
        const auto t0 = Clock::now();
        const Tensor loss = steps[k]();
        const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        m[k].t.loss = loss.item();  // outside the timing; CPU work is synchronous
        chunk[k].push_back(dt);
        all[k].push_back(dt);
      }
    }
    for (size_t k = 0; k < runs; ++k) {
      chunk_med[k].push_back(median(chunk[k]));
      m[k].last = probes[k]->replay();
      limits[k].push_back(m[k].last.limit_ms);
    }
  }
  for (size_t k = 0; k < runs; ++k) {
    m[k].t.ms_per_step = median(all[k]);
    m[k].t.steps = timed;
    m[k].rounds = summarize(chunk_med[k], limits[k]);
  }
  return m;
}

// Ends a result line: the team this thread ran (Note [team under load]: how often a busy machine
// shrank it, and its size at the end), the wait state, " busy=N" under --busy N (as bench/line.h
// does), then the newline.
void print_busy() {
  const cpu::TeamStats ts = cpu::team_stats();
  std::printf(" team=%s team_shrinks=%lld team_probes=%lld team_end=%d", cpu::team_mode_name(),
              static_cast<long long>(ts.shrinks), static_cast<long long>(ts.probes),
              ts.team > 0 ? ts.team : omp_get_max_threads());
  // The adaptive wait (Note [OpenMP wait default]): its state at the end and its changes.
  const cpu::WaitStats ws = cpu::wait_stats();
  std::printf(" wait_now=%s wait_switches=%lld", ws.now, static_cast<long long>(ws.switches));
  if (const char* b = std::getenv("ACCEL_BENCH_BUSY"); b != nullptr && std::atoi(b) > 0)
    std::printf(" busy=%s", b);
  std::printf("\n");
  std::fflush(stdout);
}

void print_pair(const char* name, DType low, const Timing& t32, const Timing& t16, double gflop,
                const char* extra = "") {
  const std::string p = precision_name(low);
  std::printf(
      "workload=%s precision=%s threads=%d steps=%d ms_per_step=%.3f %s_ms=%.3f "
      "fp32_ms=%.3f speedup=%.3f gflop_per_step=%.3f %s_gflops=%.1f fp32_gflops=%.1f "
      "%s_loss=%.4f fp32_loss=%.4f%s",
      name, p.c_str(), omp_get_max_threads(), t16.steps, t16.ms_per_step, p.c_str(),
      t16.ms_per_step, t32.ms_per_step, t32.ms_per_step / t16.ms_per_step, gflop, p.c_str(),
      gflop / (t16.ms_per_step * 1e-3), gflop / (t32.ms_per_step * 1e-3), p.c_str(), t16.loss,
      t32.loss, extra);
  print_busy();
}

void print_line(const char* name, const Timing& t, double gflop, const char* extra = "") {
  std::printf(
      "workload=%s threads=%d steps=%d ms_per_step=%.3f gflop_per_step=%.3f gflops=%.1f "
      "loss=%.4f%s",
      name, omp_get_max_threads(), t.steps, t.ms_per_step, gflop, gflop / (t.ms_per_step * 1e-3),
      t.loss, extra);
  print_busy();
}

// ---- FLOP counts (multiply-add = 2 FLOP; backward = 2x forward, minus the input gradient of
// the first layer, which nothing needs) ----

double gemm(double m, double k, double n) { return 2.0 * m * k * n; }

double mlp_gflop(int64_t batch) {
  const double f1 = gemm(batch, 784, 1024), f2 = gemm(batch, 1024, 1024),
               f3 = gemm(batch, 1024, 10);
  return (3 * (f1 + f2 + f3) - f1) / 1e9;
}

double cnn_gflop(int64_t batch) {
  const double c1 = 2.0 * batch * 32 * 28 * 28 * (1 * 9);   // conv1: (B, 1, 28, 28) -> 32
  const double c2 = 2.0 * batch * 64 * 14 * 14 * (32 * 9);  // conv2: (B, 32, 14, 14) -> 64
  const double l1 = gemm(batch, 3136, 128), l2 = gemm(batch, 128, 10);
  return (2 * c1 + 3 * (c2 + l1 + l2)) / 1e9;
}

double gpt_gflop(int64_t batch, const models::GptConfig& c) {
  const double tokens = double(batch) * c.context, C = double(c.d_model), T = double(c.context);
  const double per_layer = gemm(tokens, C, 3 * C) + gemm(tokens, C, C) + 2 * gemm(tokens, C, 4 * C);
  // q k^T and att v over full (B, H, T, T) scores: 2 * 2 * B * T * T * C.
  const double attention = 4.0 * batch * T * T * C;
  const double head = gemm(tokens, C, double(c.vocab));
  return 3 * (c.layers * (per_layer + attention) + head) / 1e9;
}

}  // namespace

namespace {
// One training step of `model` on the next batch: forward (under autocast to `low` unless it is
// kFloat32), loss, backward, AdamW step, zero grads.
struct Trainer {
  Trainer(std::shared_ptr<nn::Module> m, double lr, std::shared_ptr<data::DataLoader> loader,
          DType dt, std::function<Tensor(const Tensor&, const Tensor&)> loss)
      : model(std::move(m)),
        opt(model->parameters(), adamw(lr)),
        batches(std::move(loader)),
        low(dt),
        loss_of(std::move(loss)) {}
  std::shared_ptr<nn::Module> model;
  optim::AdamW opt;
  BatchStream batches;
  DType low;
  std::function<Tensor(const Tensor&, const Tensor&)> loss_of;  // (model output, target)

  Tensor step() {
    data::Batch b = batches.next();
    Tensor loss;
    {
      AutocastGuard ac(low != kFloat32, low == kFloat32 ? kBFloat16 : low);
      loss = loss_of(model->forward(b[0]), b[1]);
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  }
};

// The training workloads: float32 alone, or float32 and autocast alternating (the header).
// make_model is called after manual_seed(0), so both copies start from the same weights.
void run_training(const char* name, const std::function<std::shared_ptr<nn::Module>()>& make_model,
                  const std::function<std::shared_ptr<data::DataLoader>()>& make_loader,
                  const std::function<Tensor(const Tensor&, const Tensor&)>& loss_of, double lr,
                  double gflop, const char* extra = "") {
  const DType low = bench_precision();
  auto make = [&](DType dt) {
    manual_seed(0);
    auto model = make_model();
    return std::make_unique<Trainer>(model, lr, make_loader(), dt, loss_of);
  };
  auto t32 = make(kFloat32);
  auto step32 = [&] { t32->step(); };
  if (low == kFloat32) {
    const std::vector<Measured> m = time_steps_with_limits({[&] { return t32->step(); }});
    print_line(name, m[0].t, gflop,
               (extra + limit_fields(m[0].last, m[0].t.ms_per_step, "", &m[0].rounds)).c_str());
    if (profile_requested()) print_profile(name, "fp32", step32);
    return;
  }
  auto t16 = make(low);
  auto step16 = [&] { t16->step(); };
  const TwoModelCache room;
  const std::vector<Measured> m =
      time_steps_with_limits({[&] { return t32->step(); }, [&] { return t16->step(); }});
  const std::string p = precision_name(low);
  print_pair(name, low, m[0].t, m[1].t, gflop,
             (extra + limit_fields(m[1].last, m[1].t.ms_per_step, p + "_", &m[1].rounds) +
              limit_fields(m[0].last, m[0].t.ms_per_step, "fp32_", &m[0].rounds))
                 .c_str());
  if (profile_requested()) {
    print_profile(name, "fp32", step32);
    print_profile(name, p, step16);
  }
}

Tensor classifier_loss(const Tensor& out, const Tensor& target) {
  return cross_entropy(out, target);
}

void run_classifier(const char* name,
                    const std::function<std::shared_ptr<nn::Module>()>& make_model,
                    data::MnistOptions mo, int64_t batch, double gflop_per_step) {
  mo.train = true;
  const data::DatasetPtr ds = data::load_mnist(data::kFashionMnistDir, mo);
  run_training(
      name, make_model, [&] { return shuffled_loader(ds, batch); }, classifier_loss, 1e-3,
      gflop_per_step);
}
}  // namespace

DType bench_precision() {
  const char* v = std::getenv("ACCEL_BENCH_PRECISION");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "fp32") return kFloat32;
  if (s == "bf16") return kBFloat16;
  if (s == "fp16") return kFloat16;
  ACCEL_THROW(ValueError, "workloads", "ACCEL_BENCH_PRECISION must be fp32, bf16 or fp16, got '", s,
              "'");
}

std::string precision_name(DType dt) {
  return dt == kBFloat16 ? "bf16" : dt == kFloat16 ? "fp16" : "fp32";
}

void run_mlp() {
  data::MnistOptions mo;
  mo.flatten = true;
  run_classifier(
      "mlp", [] { return std::make_shared<models::Mlp>(); }, mo, 256, mlp_gflop(256));
}

void run_cnn() {
  data::MnistOptions mo;
  mo.channel = true;
  run_classifier(
      "cnn", [] { return std::make_shared<models::Cnn>(); }, mo, 128, cnn_gflop(128));
}

void run_gpt() {
  constexpr int64_t kBatch = 32;
  const models::GptConfig cfg;
  // Windows at every byte offset (stride 1), shuffled: 32 random windows per step, as the
  // libtorch peer draws them.
  auto text =
      data::TokenFile::from_bytes(data::read_fortunes_corpus(), data::TokenType::UInt8, "fortunes");
  auto windows = std::make_shared<data::TokenWindowDataset>(text, cfg.context, 1);
  int64_t params = 0;
  auto make_model = [&]() -> std::shared_ptr<nn::Module> {
    auto m = std::make_shared<models::Gpt>(cfg);  // checks the 875,264 parameters
    params = m->num_parameters();
    return m;
  };
  manual_seed(0);
  params = make_model()->num_parameters();
  char extra[64];
  std::snprintf(extra, sizeof extra, " params=%lld", static_cast<long long>(params));
  run_training(
      "gpt", make_model, [&] { return shuffled_loader(windows, kBatch); },
      [](const Tensor& out, const Tensor& target) { return models::lm_loss(out, target); }, 3e-4,
      gpt_gflop(kBatch, cfg), extra);
}

// word_language_model's medium LSTM (pytorch/examples: 2 layers, 650 hidden, 650-wide inputs,
// batch 20, bptt 35): one step = the LSTM's forward over (35, 20, 650) random inputs from zero
// states, loss = sum(output), backward, zero grads. The embedding, decoder and optimizer are left
// out: the figure is the recurrent layer's. FLOPs: per layer 2 * T * B * (in + H) * 4H forward,
// twice that backward.
void run_lstm() {
  constexpr int64_t kT = 35, kB = 20, kH = 650, kLayers = 2;
  manual_seed(0);
  nn::LSTM lstm(kH, kH, kLayers);
  const Tensor x = randn({kT, kB, kH});
  const double gflop = 3.0 * kLayers * 2.0 * kT * kB * (kH + kH) * 4 * kH * 1e-9;
  const Timing t = time_steps([&] {
    auto [out, state] = lstm.forward(x);
    Tensor loss = sum(out);
    loss.backward();
    lstm.zero_grad();
    return loss;
  });
  print_line("lstm", t, gflop);
}

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ACCEL_CHECK(fd >= 0, DistError, "workloads", "socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  ACCEL_CHECK(ok, DistError, "workloads", "cannot bind a loopback port");
  return ntohs(a.sin_port);
}

namespace {

// Parent side of ddp-mlp: two copies of this program as ranks 0 and 1 on loopback, 1 thread
// each; rank 0's stdout is ours, rank 1's goes to /dev/null.
void spawn_ddp_ranks(int world) {
  const int port = free_loopback_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    ACCEL_CHECK(pid >= 0, DistError, "workloads", "fork failed for rank ", r);
    if (pid == 0) {
      set_rank_env(r, world, port);
      if (r != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) _exit(126);
      char self[] = "workloads";
      char name[] = "ddp-mlp";
      char* argv[] = {self, name, nullptr};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (const pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  ACCEL_CHECK(ok, DistError, "workloads", "a ddp-mlp rank failed (see its stderr)");
}

}  // namespace

void run_ddp_mlp() {
  constexpr int kWorld = 2;
  constexpr int64_t kGlobalBatch = 256;
  const dist::DistEnv env = dist::read_dist_env();
  if (!env.distributed) {
    spawn_ddp_ranks(kWorld);
    return;
  }
  auto pg = dist::init_process_group();
  manual_seed(0);
  data::MnistOptions mo;
  mo.train = true;
  mo.flatten = true;
  auto model = std::make_shared<models::Mlp>();
  dist::DistributedDataParallel ddp(model, pg);  // rank 0's initial weights everywhere
  optim::AdamW opt(model->parameters(), adamw(1e-3));
  // The loader shards each global batch of 256 into 128 rows per rank (RANK/WORLD_SIZE).
  BatchStream batches(
      shuffled_loader(data::load_mnist(data::kFashionMnistDir, mo), kGlobalBatch / pg->size()));
  const Timing t = time_steps([&] {
    data::Batch b = batches.next();
    Tensor loss = cross_entropy(ddp.forward(b[0]), b[1]);
    ddp.backward(loss);
    opt.step();
    opt.zero_grad();
    return loss;
  });
  char extra[96];
  std::snprintf(extra, sizeof extra, " world_size=%d batch_per_rank=%lld", pg->size(),
                static_cast<long long>(kGlobalBatch / pg->size()));
  if (pg->rank() == 0) print_line("ddp-mlp", t, mlp_gflop(kGlobalBatch), extra);
  dist::destroy_process_group();
}

}  // namespace accel::bench
