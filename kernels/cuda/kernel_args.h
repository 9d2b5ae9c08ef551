// Plain argument structs shared by the host side (.cc, g++) and the kernels (.cu, nvcc).
//
// Note [CUDA host/device split]: the .cc files of this folder see Tensor, check dtypes and
// shapes and pick a kernel; the .cu files see only the PODs below and raw pointers. nvcc thus
// never parses core/tensor.h (keeps nvcc time down, and keeps core/half.h's host intrinsics away
// from the device pass), and each .cu exports a few `launch_*` functions declared in launch.h.
#pragma once

#include <cstdint>

#include "kernels/common/macros.h"
#include "kernels/common/ops.h"

namespace accel::cuda {

// Element type codes; values equal accel::DType's (checked with static_assert in common.h).
enum class Code : uint8_t {
  F32 = 0,
  F64 = 1,
  F16 = 2,
  BF16 = 3,
  I32 = 4,
  I64 = 5,
  U8 = 6,
  Bool = 7
};

// Rank limit after coalescing contiguous dims; training tensors use at most 5.
constexpr int kMaxElemDims = 10;

// n / d for 32-bit n < 2^31 with a multiply-high and a shift instead of a division (integer
// division is ~20 instructions on the GPU). Precomputed on the host per divisor.
struct IntDivider {
  uint32_t divisor = 1;
  uint32_t m1 = 1;
  uint32_t shift = 0;

  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t(1) << shift) < d) ++shift;
    m1 = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  ACCEL_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, m1);
#else
    const uint32_t t = uint32_t((uint64_t(n) * m1) >> 32);
#endif
    return (t + n) >> shift;
  }
};

// Offsets (in elements) of N broadcast operands for a linear index of the output. Dims are
// stored innermost first. Operand 0 is the output.
template <int N>
struct OffsetCalc {
  int ndim = 0;
  IntDivider sizes[kMaxElemDims];
  int64_t strides[kMaxElemDims][N];

  ACCEL_HD void get(uint32_t linear, int64_t* off) const {
    ACCEL_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    ACCEL_UNROLL
    for (int d = 0; d < kMaxElemDims; ++d) {
      if (d == ndim) break;
      const uint32_t q = sizes[d].div(linear);
      const uint32_t r = linear - q * sizes[d].divisor;
      ACCEL_UNROLL
      for (int k = 0; k < N; ++k) off[k] += int64_t(r) * strides[d][k];
      linear = q;
    }
  }
};

// The op enums of kernels/common/ops.h, under the short names the kernels use.
using UOp = UnaryOp;
using BOp = BinaryOp;
using ROp = ReduceOp;

// How an elementwise kernel walks its operands.
enum class Layout : uint8_t {
  Contiguous,  // every operand contiguous with the output's shape
  ScalarB,     // like Contiguous, but operand 2 (binary `b`) is a single element
  Strided,     // general: OffsetCalc (output numel < 2^31)
};

}  // namespace accel::cuda
