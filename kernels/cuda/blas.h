// cuBLAS / cuBLASLt handles and math-mode switches of the CUDA backend.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "kernels/cuda/device.h"

namespace accel::cuda {

// "[cublas] <call> failed: <status> (file:line)".
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line);
#define ACCEL_CUBLAS_CHECK(expr)                                                      \
  do {                                                                                \
    const cublasStatus_t accel_cublas_st_ = (expr);                                   \
    if (ACCEL_UNLIKELY(accel_cublas_st_ != CUBLAS_STATUS_SUCCESS)) {                  \
      ::accel::cuda::throw_cublas_error(accel_cublas_st_, #expr, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)

// f32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulate). Off by
// default, like PyTorch; the environment variable ACCEL_ALLOW_TF32=1 turns it on at start.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Per thread and device, bound to the current stream of the current device on every call.
cublasHandle_t cublas_handle();
cublasLtHandle_t cublaslt_handle();
// Scratch memory for cuBLAS(Lt) on the current stream of the current device; kept for the
// process (held in the caching allocator's "in use" bytes).
void* blas_workspace(size_t* nbytes);

}  // namespace accel::cuda
