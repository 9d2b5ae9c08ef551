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
ACCEL_DECLARE_STUB(matmul_stub,
                   void (*)(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out));

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
