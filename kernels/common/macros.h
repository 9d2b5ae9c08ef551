// Function qualifiers for code that both g++ (CPU kernels, CUDA host .cc) and nvcc (.cu device
// code) compile. Only this folder and kernels/cuda use them.
#pragma once

#if defined(__CUDACC__)
// Callable on host and device; inlined.
#define ACCEL_HD __host__ __device__ __forceinline__
#define ACCEL_UNROLL _Pragma("unroll")
#else
// always_inline on the host: the CPU `omp simd` loops vectorise only what is inlined into them
// (a scalar call per element made GELU's backward 28 % of a gpt step, kernels/cpu binary rows).
#define ACCEL_HD inline __attribute__((always_inline))
#define ACCEL_UNROLL
#endif
