// The training workloads of shared/WORKLOADS.md (mlp, cnn, gpt, ddp-mlp) for
// build/bench/workloads. Each prints one key=value line:
//   workload=mlp threads=2 steps=50 ms_per_step=15.1 gflop_per_step=2.449 gflops=162.1 loss=0.52
// A step is: fetch batch, forward, cross-entropy, backward, AdamW step, zero grads; the figure is
// the median over kTimedSteps steps after kWarmupSteps (both overridable with the environment
// variables ACCEL_BENCH_STEPS / ACCEL_BENCH_WARMUP, e.g. for profiling runs).
//
// With ACCEL_BENCH_PRECISION=bf16 or fp16 (workloads --precision), mlp, cnn and gpt train two
// copies of the model from the same seed, one in float32 and one under autocast, alternating step
// by step in the same run, and print both figures:
//   workload=mlp precision=bf16 ... ms_per_step=9.8 bf16_ms=9.8 fp32_ms=15.1 speedup=1.541 ...
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"

namespace accel::bench {

// The autocast dtype asked for by ACCEL_BENCH_PRECISION: kFloat32 (unset or "fp32"), kBFloat16
// ("bf16") or kFloat16 ("fp16"); ValueError otherwise.
DType bench_precision();
// "fp32", "bf16", "fp16".
std::string precision_name(DType dt);

void run_mlp();
void run_cnn();
void run_gpt();
// word_language_model's medium LSTM (2 x 650, batch 20, 35 steps): forward + backward ms per step.
void run_lstm();
// Two processes x 1 thread on loopback (Gloo), 128 samples per rank. Without RANK/WORLD_SIZE
// in the environment it spawns two copies of this program (`<self> ddp-mlp`) with the env
// contract and prints rank 0's line.
void run_ddp_mlp();
// zero-memory (bench/zero_memory.cc): per-rank peak RSS, allocator peak and ms/step of a GPT
// (49.6M parameters by default) trained through the Accelerator at ZeRO stages x world sizes;
// it starts the ranks itself. ACCEL_BENCH_WORLDS / _STAGES / _D_MODEL / _LAYERS (workloads
// --worlds, --stages, --d-model, --layers) and ACCEL_BENCH_STEPS / _WARMUP size the run.
void run_zero_memory();
// build/bench/workloads zero-checkpoint (bench/zero_memory.cc, Note [zero-checkpoint figures]).
void run_zero_checkpoint();
// tp-memory (bench/tp_memory.cc): per-rank state and activation bytes at tp 1, 2, 4.
void run_tp_memory();
// cp-memory (bench/cp_memory.cc): per-rank activation peak at cp 1, 2, 4 on T = 4096 and 8192.
void run_cp_memory();
// pp-bubble (bench/pp_bubble.cc): the idle fraction of each pipeline schedule against its theory.
void run_pp_bubble();

// A loopback port that was free a moment ago (bind to port 0 and read it back). Another process
// could take it before rank 0 binds; that surfaces as a store error, never a hang.
int free_loopback_port();
// "1,2,4" -> {1, 2, 4}; empty when an item is not an integer in [lo, hi] or the list is empty.
std::vector<int> parse_int_list(const std::string& s, int lo, int hi);

}  // namespace accel::bench
