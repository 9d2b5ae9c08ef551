// build/bench/workloads tp-memory: what tensor parallelism saves per rank, for the 49.6M GPT of
// zero-memory (examples/models.h Gpt, d_model 640, 10 layers, vocab 256, context 64; 8 heads of
// 80 so that tp 4 divides them) trained through the Accelerator with tp_plan =
// models::gpt_tp_plan(): tp 1 (one process), tp 2 and tp 4 (the whole world one tp group, dp 1),
// each without and with sequence parallelism; AdamW, 2 windows of 64 tokens per step, the same
// on every rank. Each rank measures (Note [tp-memory figures]):
//   state_mb       its parameters + gradients + AdamW state (param_mb, grad_mb, optim_mb)
//   act_peak_mb    the allocator's peak over forward + backward above what was in use before the
//                  forward, minus the gradients backward allocates: the activations and temporaries
//   ms_step        median step time
//   tp_mb_step     MB this rank handed to collectives on its tp group per step
// One line per configuration (the maximum over ranks), then the checks, PASS or FAIL:
//   workload=tp-memory check=state_ratio tp=2 state_ratio=0.50 target=0.5+-5% result=PASS
//   workload=tp-memory check=sp_activations tp=2 sp_over_no_sp=0.6 target_max=1 result=PASS
//   workload=tp-memory check=estimate_state tp=2 ... est_over_state=1.00 target=1+-10% result=PASS
//     (accel::estimate, accelerate/memory_estimate.h, against state_mb)
//
// Note [tp-memory figures]
// Byte counts are exact (tensor sizes), not RSS: the saving tp makes in state is what the issue
// asks about, and RSS would add the allocator's cache and the process's fixed cost. The
// replicated parameters (LayerNorms, the position embedding, the row-parallel biases: 0.1 % of
// this model) are held whole by every rank, so the ratio sits a little above 1/tp. The activation
// peak counts the allocator's live bytes, so a cached block reused is not counted twice.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "accelerate/accelerator.h"
#include "accelerate/memory_estimate.h"
#include "bench/median.h"
#include "bench/model_workloads.h"
#include "bench/ranks.h"
#include "core/storage.h"
#include "data/data.h"
#include "examples/models.h"

namespace accel::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kOp = "tp-memory";
constexpr const char* kOutEnv = "ACCEL_TP_MEMORY_OUT";
constexpr const char* kTpEnv = "ACCEL_TP_MEMORY_TP";
constexpr const char* kSpEnv = "ACCEL_TP_MEMORY_SP";
constexpr int64_t kBatch = 2, kContext = 64;
constexpr int kRankTimeoutS = 3600;

int env_int(const char* name, int fallback) { return env_count(name, fallback, kOp); }

models::GptConfig gpt_config() {
  models::GptConfig c;
  c.vocab = 256;
  c.context = kContext;
  c.layers = env_int("ACCEL_BENCH_LAYERS", 10);
  c.d_model = env_int("ACCEL_BENCH_D_MODEL", 640);
  c.heads = c.d_model % 8 == 0 ? 8 : 1;
  return c;
}

int64_t bytes_of(const Tensor& t) {
  return t.defined() ? t.numel() * int64_t(dtype_size(t.dtype())) : 0;
}

void run_rank() {
  const int tp = env_int(kTpEnv, 1);
  const bool sp = env_int(kSpEnv, 0) == 1;
  const int warmup = env_int("ACCEL_BENCH_WARMUP", 1),
            steps = std::max(1, env_int("ACCEL_BENCH_STEPS", 3));
  AcceleratorConfig ac;
  ac.cpu = true;
  ac.read_env = false;
  ac.log_with = {};
  if (tp > 1) ac.parallelism.tp_size = tp;
  ac.tp_plan = models::gpt_tp_plan({.sequence_parallel = sp});
  Accelerator acc(ac);
  const models::GptConfig cfg = gpt_config();
  Generator gen(7);
  auto model = std::make_shared<models::Gpt>(cfg, &gen);
  const int64_t params = model->num_parameters();
  // What accel::estimate (accelerate/memory_estimate.h) says this rank keeps: tp ranks, no dp.
  estimate::Setup es;
  es.world = tp;
  es.mesh.tp_size = tp;
  const int64_t est_state =
      estimate::estimate(estimate::model_from_module(*model, "gpt"), es).state();
  optim::AdamWOptions ao;
  ao.lr(3e-4);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  int64_t param_bytes = 0;
  for (const Tensor& p : m->parameters()) param_bytes += bytes_of(p);

  Generator data(11);
  const Tensor tokens = randint(0, cfg.vocab, {kBatch, kContext + 1}, TensorOptions(kInt64), &data);
  const Tensor x = tokens.narrow(1, 0, kContext).contiguous();
  const Tensor y = tokens.narrow(1, 1, kContext).contiguous();
  Allocator* alloc = get_allocator(kCPU);
  const dist::ProcessGroupPtr& tpg = acc.mesh().group("tp");
  std::vector<double> ms;
  int64_t grad_bytes = 0, optim_bytes = 0, act_peak = 0;
  uint64_t sent0 = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) sent0 = tpg ? tpg->bytes_sent() : 0;
    const auto t0 = Clock::now();
    const int64_t before = int64_t(alloc->stats().bytes_in_use);
    alloc->reset_peak_stats();
    const Tensor loss = models::lm_loss(m->forward(x), y);
    acc.backward(loss);
    const int64_t peak = int64_t(alloc->stats().peak_bytes_in_use);
    grad_bytes = 0;
    for (const Tensor& p : m->parameters()) grad_bytes += bytes_of(p.grad());
    act_peak = std::max<int64_t>(act_peak, peak - before - grad_bytes);
    o->step();
    o->zero_grad();
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= warmup) ms.push_back(dt);
  }
  const double tp_mb_step = tpg ? double(tpg->bytes_sent() - sent0) / double(steps) / 1e6 : 0.0;
  for (const auto& [k, t] : opt->state_dict())
    if (k.rfind("state.", 0) == 0) optim_bytes += bytes_of(t);
  const int64_t state = param_bytes + grad_bytes + optim_bytes;

  const std::string path =
      std::string(std::getenv(kOutEnv)) + "/rank" + std::to_string(acc.process_index()) + ".txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ACCEL_CHECK(f != nullptr, IoError, kOp, "cannot write ", path);
  std::fprintf(f,
               "params=%lld param_mb=%.3f grad_mb=%.3f optim_mb=%.3f state_mb=%.3f "
               "act_peak_mb=%.3f ms_step=%.2f tp_mb_step=%.3f threads=%d est_state_mb=%.3f\n",
               static_cast<long long>(params), double(param_bytes) / 1e6, double(grad_bytes) / 1e6,
               double(optim_bytes) / 1e6, double(state) / 1e6, double(act_peak) / 1e6, median(ms),
               tp_mb_step, omp_get_max_threads(), double(est_state) / 1e6);
  ACCEL_CHECK(std::fclose(f) == 0, IoError, kOp, "cannot write ", path);
}

struct Config {
  int tp = 1;
  bool sp = false;
  double state = 0, act = 0, est_state = 0;
};

void run_parent() {
  std::vector<Config> runs = {{1, false}, {2, false}, {2, true}, {4, false}, {4, true}};
  std::printf("# tp-memory: GPT d_model %lld, %lld layers, %lld windows x %lld tokens per step\n",
              static_cast<long long>(gpt_config().d_model),
              static_cast<long long>(gpt_config().layers), static_cast<long long>(kBatch),
              static_cast<long long>(kContext));
  for (Config& c : runs) {
    const std::vector<Fields> ranks =
        run_ranks(kOp, c.tp, {{kTpEnv, std::to_string(c.tp)}, {kSpEnv, c.sp ? "1" : "0"}}, kOutEnv,
                  kRankTimeoutS, "tp " + std::to_string(c.tp));
    std::map<std::string, double> mx;
    for (size_t r = 0; r < ranks.size(); ++r)
      for (const char* k : {"param_mb", "grad_mb", "optim_mb", "state_mb", "act_peak_mb", "ms_step",
                            "tp_mb_step", "est_state_mb"})
        mx[k] = std::max(mx[k], number(ranks[r], k, "rank " + std::to_string(r), kOp));
    c.state = mx["state_mb"];
    c.act = mx["act_peak_mb"];
    c.est_state = mx["est_state_mb"];
    std::printf(
        "workload=tp-memory tp=%d sequence_parallel=%s params=%lld param_mb=%.1f grad_mb=%.1f "
        "optim_mb=%.1f state_mb=%.1f act_peak_mb=%.1f ms_step=%.1f tp_mb_step=%.2f\n",
        c.tp, c.sp ? "yes" : "no",
        static_cast<long long>(number(ranks[0], "params", "rank 0", kOp)), mx["param_mb"],
        mx["grad_mb"], mx["optim_mb"], mx["state_mb"], mx["act_peak_mb"], mx["ms_step"],
        mx["tp_mb_step"]);
    std::fflush(stdout);
  }
  const Config& one = runs[0];
  for (const Config& c : runs) {
    // The estimate against the measured state (issue 41: within 10 %).
    const double ratio = c.est_state / c.state;
    std::printf(
        "workload=tp-memory check=estimate_state tp=%d sequence_parallel=%s state_mb=%.1f "
        "est_state_mb=%.1f est_over_state=%.3f target=1+-10%% result=%s\n",
        c.tp, c.sp ? "yes" : "no", c.state, c.est_state, ratio,
        std::abs(ratio - 1.0) <= 0.10 ? "PASS" : "FAIL");
  }
  for (const Config& c : runs) {
    if (c.tp == 1) continue;
    if (!c.sp) {
      const double ratio = c.state / one.state, want = 1.0 / c.tp;
      std::printf(
          "workload=tp-memory check=state_ratio tp=%d state_ratio=%.4f target=%.4f+-5%% "
          "result=%s\n",
          c.tp, ratio, want, std::abs(ratio - want) <= 0.05 * want ? "PASS" : "FAIL");
    } else {
      double without = 0;
      for (const Config& d : runs)
        if (d.tp == c.tp && !d.sp) without = d.act;
      const double r = c.act / without;
      std::printf(
          "workload=tp-memory check=sp_activations tp=%d sp_over_no_sp=%.3f target_max=1 "
          "result=%s\n",
          c.tp, r, r < 1.0 ? "PASS" : "FAIL");
    }
  }
}

}  // namespace

void run_tp_memory() {
  if (std::getenv(kOutEnv) != nullptr) {
    run_rank();
  } else {
    run_parent();
  }
}

}  // namespace accel::bench
