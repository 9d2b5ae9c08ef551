// The training workloads of shared/WORKLOADS.md (mlp, cnn, gpt, ddp-mlp) for
// build/bench/workloads. Each prints one key=value line:
//   workload=mlp threads=2 steps=50 ms_per_step=15.1 gflop_per_step=2.449 gflops=162.1 loss=0.52
// A step is: fetch batch, forward, cross-entropy, backward, AdamW step, zero grads; the figure is
// the median over kTimedSteps steps after kWarmupSteps (both overridable with the environment
// variables ACCEL_BENCH_STEPS / ACCEL_BENCH_WARMUP, e.g. for profiling runs).
#pragma once

namespace accel::bench {

void run_mlp();
void run_cnn();
void run_gpt();
// Two processes x 1 thread on loopback (Gloo), 128 samples per rank. Without RANK/WORLD_SIZE
// in the environment it spawns two copies of this program (`<self> ddp-mlp`) with the env
// contract and prints rank 0's line.
void run_ddp_mlp();

}  // namespace accel::bench
