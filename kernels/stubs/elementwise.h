// Elementwise kernels (kernels/<backend>/elementwise*): stubs. The op enums live in
// kernels/common/ops.h, the activation formulas in kernels/common/scalar_math.h.
//
// The ops (autograd/ops/unary.cc, binary.cc) check devices, promote dtypes and broadcast shapes
// before calling; every operand is on one device. Kernels throw DTypeError only for an op that
// is not defined on an integer dtype.
#pragma once

#include "core/dispatch.h"
#include "kernels/common/ops.h"  // UnaryOp, UnaryParams, BinaryOp (shared with the .cu files)

namespace accel {

// out = op(in). `in` and `out` have the same shape; dtypes may differ only for ops with a bool
// result (LogicalNot). `in` may be strided; `out` is freshly allocated (contiguous) or a view.
ACCEL_DECLARE_STUB(unary_stub,
                   void (*)(UnaryOp op, const Tensor& in, Tensor& out, const UnaryParams& p));
// out = op(a, b). a and b share a dtype and broadcast to out's shape (the kernel computes the
// broadcast strides itself, so no expanded views are built on the hot path).
ACCEL_DECLARE_STUB(binary_stub, void (*)(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out,
                                         double alpha));
// out = cond ? a : b; cond bool, a/b same dtype as out, all broadcast to out.
ACCEL_DECLARE_STUB(where_stub,
                   void (*)(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out));
}  // namespace accel
