// Matrix-multiply kernels (kernels/<backend>/matmul.*).
#pragma once

#include "core/dispatch.h"
#include "kernels/common/geometry.h"

namespace accel {

// out = a @ b (+ bias), batched:
//   a:    (B_0..B_{r-3}, M, K)  any strides: a transposed view (a.t()) is used without a copy
//   b:    (B_0..B_{r-3}, K, N)  any strides
//   bias: undefined, or (N), added to every output row
//   out:  (B_0..B_{r-3}, M, N)  contiguous, freshly allocated
// a, b and out have the same rank r, 2 <= r <= common::MatmulGeometry::kMaxBatch + 2, and, with
// bias, the same floating dtype, on one device. Each batch dim of a and b equals out's or is 1
// (broadcast); a batch dim with stride 0 counts as broadcast. The op layer
// (autograd/ops/linalg.cc) checks all of this before calling; kernels assert what is cheap.
// The batch geometry both backends derive from this is common::matmul_geometry.
// Note [16-bit GEMM into float32]: on the CPU only, out may also be float32 with a and b both
// bfloat16 or both float16 and no bias: out receives the float32 accumulator unrounded (autocast's
// gradients of float32 inputs, Note [autocast linear, native 16-bit] in autograd/ops/linalg.cc).
// The op layer never sends this case to another device.
ACCEL_DECLARE_STUB(matmul_stub,
                   void (*)(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out));

// Note [autocast linear in float32]: where a device's 16-bit GEMM is slower than its float32 one
// (the CPU: float16 always, bfloat16 unless Note [bf16 GEMM where it does not pay] in
// kernels/cpu/cpu_isa.h picks oneDNN's bf16 kernel), autocast's linear (and matmul / mm by a 2-D
// weight) computes in float32 on
// rounded operands in one step instead of casting its float32 operands to 16 bits first:
// matmul_lowp_stub rounds float32 operands as it converts blocks of them, and writes a float32
// gradient already rounded, so the cast nodes' passes over memory go away (autograd/ops/linalg.cc).
//
// matmul_lowp_preferred_stub(low): true where this device wants matmul_lowp_stub for autocast to
// `low` (kBFloat16 or kFloat16). Devices without it (CUDA) run their 16-bit GEMM.
ACCEL_DECLARE_STUB(matmul_lowp_preferred_stub, bool (*)(DType low));
// out = R(R(a) @ R(b) + R(bias)), 2-D only:
//   a: (M, K), b: (K, N), any strides; bias: undefined, or (N); out: (M, N) contiguous, fresh;
//   R(x) is x for an operand of dtype `low` and x rounded to `low` (to nearest even) for a
//   float32 one; b_exact: b is float32 that holds `low` values already (autocast's cached weight
//   image), used without rounding. The product accumulates in float32; out is `low`, or float32
//   receiving the value rounded to `low`. Every operand is `low` or float32, all on one device;
//   the op layer checks shapes and dtypes.
ACCEL_DECLARE_STUB(matmul_lowp_stub, void (*)(const Tensor& a, const Tensor& b, const Tensor& bias,
                                              Tensor& out, DType low, bool b_exact));
// dst = src rounded to `low` (to nearest even), both float32 and the same shape, dst contiguous
// and fresh: the float32 images of parameters that autocast caches for matmul_lowp_stub.
ACCEL_DECLARE_STUB(round_to_lowp_stub, void (*)(const Tensor& src, Tensor& dst, DType low));

// The batch geometry of a valid matmul_stub call whose matrices are row- or column-major (the
// backends copy others first), for both backends.
inline common::MatmulGeometry matmul_batch_geometry(const Tensor& a, const Tensor& b,
                                                    const Tensor& out) {
  common::MatmulGeometry g;
  const bool ok = common::matmul_geometry(a.sizes(), a.strides(), b.sizes(), b.strides(),
                                          out.sizes(), out.strides(), g);
  ACCEL_INTERNAL_ASSERT(ok);
  return g;
}

}  // namespace accel
