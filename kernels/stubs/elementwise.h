// Elementwise kernels (kernels/<backend>/unary.*, binary.*): op enums and stubs.
#pragma once

#include <cstdint>

#include "core/dispatch.h"

namespace accel {

enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Silu,
  Sin, Cos, Sign, Reciprocal, Square, Log1p, Expm1, Erf, LogicalNot,
  PowScalar,   // x ^ p0
  Clamp,       // min(max(x, p0), p1)
  AddScalar,   // x + p0
  MulScalar,   // x * p0
  RSubScalar,  // p0 - x
  RDivScalar,  // p0 / x
  Count
};
struct UnaryParams {
  double p0 = 0, p1 = 0;
};

enum class BinaryOp : uint8_t {
  Add,  // a + alpha * b
  Sub,  // a - alpha * b
  Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge,  // out is bool
  LogicalAnd, LogicalOr,   // out is bool
  // Backward helpers, out = f(grad=a, x=b): not differentiable themselves.
  ReluGrad,      // a * (b > 0)
  GeluErfGrad,   // a * gelu_erf'(b)
  GeluTanhGrad,  // a * gelu_tanh'(b)
  SiluGrad,      // a * silu'(b)
  SigmoidGrad,   // a * b * (1 - b), b = sigmoid output
  TanhGrad,      // a * (1 - b^2), b = tanh output
  Count
};
constexpr bool is_comparison(BinaryOp op) {
  return op >= BinaryOp::Eq && op <= BinaryOp::LogicalOr;
}

// out = op(in). `in` and `out` have the same shape; dtypes may differ only for ops with a bool
// result (LogicalNot). `in` may be strided; `out` is freshly allocated (contiguous) or a view.
ACCEL_DECLARE_STUB(unary_stub, void (*)(UnaryOp op, const Tensor& in, Tensor& out,
                                        const UnaryParams& p));
// out = op(a, b). a and b share a dtype and broadcast to out's shape (the kernel computes the
// broadcast strides itself, so no expanded views are built on the hot path).
ACCEL_DECLARE_STUB(binary_stub, void (*)(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out,
                                         double alpha));
// out = cond ? a : b; cond bool, a/b same dtype as out, all broadcast to out.
ACCEL_DECLARE_STUB(where_stub, void (*)(const Tensor& cond, const Tensor& a, const Tensor& b,
                                        Tensor& out));
}  // namespace accel
