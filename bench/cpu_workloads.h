// CPU-threading workloads of build/bench/workloads (bench/cpu_workloads.cc).
#pragma once

namespace accel::bench {

// pytorch/examples time_sequence_prediction (LSTMCell(1, 51), LSTMCell(51, 51), Linear(51, 1)
// over 97 sine waves of 999 steps; about 5,000 tiny GEMMs an evaluation): ms per evaluation
// (forward + backward) with 1 thread and with the full team, alternating, f64 and f32.
void run_time_seq();
// GEMMs from 97x1x204 to 384^3 with 1 thread and with the full team, the GEMM grain off.
void run_gemm_grain();

}  // namespace accel::bench
