// The single-op workloads of build/bench/workloads (op_workloads.cc), run from its registry.
#pragma once

void run_op();        // c = a + b on 16 f32 elements, with grad and no-grad: us per op
void run_matmul();    // f32 matmul vs direct dnnl_sgemm (and under autocast with --precision)
void run_sdpa();      // fused attention vs the materialised (T, S) scores
void run_sdpa_gpt();  // the fused kernel at the gpt workload's shape, f32 vs bf16
