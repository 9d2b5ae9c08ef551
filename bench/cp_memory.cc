// build/bench/workloads cp-memory: what context parallelism saves per rank on long sequences. A
// GPT (examples/models.h; d_model 128, 2 layers, 4 heads, vocab 256, context = T) trained through
// the Accelerator with cp_plan = models::gpt_cp_plan() on one sequence of T = 4096 and 8192 tokens
// per step: cp 1 (one process), cp 2 and cp 4 (the whole world one cp group). Each rank measures
// the allocator's peak over forward + backward above what was in use before the forward, minus the
// gradients backward allocates (the activations and temporaries, as tp-memory does), and the
// median ms per step. One line per configuration (the maximum over ranks), then the check:
//   workload=cp-memory check=activations T=4096 cp=4 act_over_cp1=0.27 target_max=0.35 result=PASS
// Ring attention keeps O(T / cp) per rank (Note [ring attention] in parallel/context_parallel.cc):
// the q, k, v, out and lse of its tokens and two blocks of keys and values in flight; everything
// else in the model is per token. ACCEL_BENCH_STEPS / _WARMUP size the run (default 2 and 1).
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
#include "bench/median.h"
#include "bench/model_workloads.h"
#include "bench/ranks.h"
#include "core/storage.h"
#include "examples/models.h"

namespace accel::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kOp = "cp-memory";
constexpr const char* kOutEnv = "ACCEL_CP_MEMORY_OUT";
constexpr const char* kCpEnv = "ACCEL_CP_MEMORY_CP";
constexpr const char* kTEnv = "ACCEL_CP_MEMORY_T";
constexpr int kRankTimeoutS = 3600;

int env_int(const char* name, int fallback) { return env_count(name, fallback, kOp); }

int64_t bytes_of(const Tensor& t) {
  return t.defined() ? t.numel() * int64_t(dtype_size(t.dtype())) : 0;
}

void run_rank() {
  const int cp = env_int(kCpEnv, 1);
  const int64_t T = env_int(kTEnv, 4096);
  const int warmup = env_int("ACCEL_BENCH_WARMUP", 1),
            steps = std::max(1, env_int("ACCEL_BENCH_STEPS", 2));
  AcceleratorConfig ac;
  ac.cpu = true;
  ac.read_env = false;
  ac.log_with = {};
  if (cp > 1) ac.parallelism.cp_size = cp;
  ac.cp_plan = models::gpt_cp_plan();
  Accelerator acc(ac);
  models::GptConfig cfg;
  cfg.context = T;
  cfg.layers = 2;
  Generator gen(7);
  auto model = std::make_shared<models::Gpt>(cfg, &gen);
  optim::AdamWOptions ao;
  ao.lr(3e-4);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  Generator data(11);
  const Tensor tokens = randint(0, cfg.vocab, {1, T + 1}, TensorOptions(kInt64), &data);
  const dist::SequenceSplit seq = dist::sequence_split(acc.mesh());
  const Tensor x = dist::cp_shard_sequence(tokens.narrow(1, 0, T), 1, seq.rank, seq.size);
  const Tensor y = dist::cp_shard_sequence(tokens.narrow(1, 1, T), 1, seq.rank, seq.size);
  Allocator* alloc = get_allocator(kCPU);
  std::vector<double> ms;
  int64_t act_peak = 0;
  double loss_value = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto t0 = Clock::now();
    const int64_t before = int64_t(alloc->stats().bytes_in_use);
    alloc->reset_peak_stats();
    const Tensor loss = models::lm_loss(m->forward(x.contiguous()), y.contiguous());
    acc.backward(loss);
    const int64_t peak = int64_t(alloc->stats().peak_bytes_in_use);
    int64_t grad_bytes = 0;
    for (const Tensor& p : m->parameters()) grad_bytes += bytes_of(p.grad());
    act_peak = std::max<int64_t>(act_peak, peak - before - grad_bytes);
    o->step();
    o->zero_grad();
    loss_value = acc.reduce(full({1}, loss.item(), TensorOptions(kFloat64)), "mean").item();
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= warmup) ms.push_back(dt);
  }
  const std::string path =
      std::string(std::getenv(kOutEnv)) + "/rank" + std::to_string(acc.process_index()) + ".txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ACCEL_CHECK(f != nullptr, IoError, kOp, "cannot write ", path);
  std::fprintf(f, "act_peak_mb=%.3f ms_step=%.2f loss=%.6f threads=%d\n", double(act_peak) / 1e6,
               median(ms), loss_value, omp_get_max_threads());
  ACCEL_CHECK(std::fclose(f) == 0, IoError, kOp, "cannot write ", path);
}

void run_parent() {
  std::printf(
      "# cp-memory: GPT d_model 128, 2 layers, 4 heads, one sequence of T tokens per "
      "step; each cp rank holds T / cp of them\n");
  std::map<std::pair<int, int>, double> act;  // (T, cp) -> activation peak
  for (int T : {4096, 8192}) {
    for (int cp : {1, 2, 4}) {
      const std::vector<Fields> ranks =
          run_ranks(kOp, cp, {{kCpEnv, std::to_string(cp)}, {kTEnv, std::to_string(T)}}, kOutEnv,
                    kRankTimeoutS, "cp " + std::to_string(cp) + " T " + std::to_string(T));
      double peak = 0, msv = 0;
      for (size_t r = 0; r < ranks.size(); ++r) {
        const std::string who = "rank " + std::to_string(r);
        peak = std::max(peak, number(ranks[r], "act_peak_mb", who, kOp));
        msv = std::max(msv, number(ranks[r], "ms_step", who, kOp));
      }
      act[{T, cp}] = peak;
      std::printf(
          "workload=cp-memory T=%d cp=%d act_peak_mb=%.1f act_over_cp1=%.3f ms_step=%.1f "
          "loss=%.4f\n",
          T, cp, peak, peak / act[{T, 1}], msv, number(ranks[0], "loss", "rank 0", kOp));
      std::fflush(stdout);
    }
  }
  for (int T : {4096, 8192}) {
    const double r = act[{T, 4}] / act[{T, 1}];
    std::printf(
        "workload=cp-memory check=activations T=%d cp=4 act_over_cp1=%.3f "
        "target_max=0.35 result=%s\n",
        T, r, r <= 0.35 ? "PASS" : "FAIL");
  }
}

}  // namespace

void run_cp_memory() {
  if (std::getenv(kOutEnv) != nullptr) {
    run_rank();
  } else {
    run_parent();
  }
}

}  // namespace accel::bench
