// The accumulation rule of acc_type.h at the level of DType, for the host code that allocates
// statistics (mean, rstd, lse of the nn ops) and reduction buffers. Host only: core/dtype.h is
// not for nvcc's device pass.
#pragma once

#include "core/dtype.h"

namespace accel {

// acc_t: float16/bfloat16/float32 -> float32, float64 -> float64; other dtypes unchanged.
constexpr DType acc_dtype(DType t) {
  return (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
}
// sum_acc_t: float64 -> float64, other floats -> float32, integers and bool -> int64.
constexpr DType sum_acc_dtype(DType t) {
  switch (t) {
    case DType::Float64: return DType::Float64;
    case DType::Float32:
    case DType::Float16:
    case DType::BFloat16: return DType::Float32;
    default: return DType::Int64;
  }
}

}  // namespace accel
