// Op enums of the elementwise and reduction kernels, shared by the stubs (kernels/stubs/*.h), the
// CPU kernels and the CUDA .cu files, which include this header without seeing Tensor.
#pragma once

#include <cstdint>
#include <limits>

namespace accel {

enum class UnaryOp : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Tanh,
  Sigmoid,
  Relu,
  GeluErf,
  GeluTanh,
  Silu,
  Sin,
  Cos,
  Sign,
  Reciprocal,
  Square,
  Log1p,
  Expm1,
  Erf,
  LogicalNot,
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
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,  // out is bool
  LogicalAnd,
  LogicalOr,  // out is bool
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

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, Prod, ArgMax, ArgMin, Count };
constexpr bool has_identity(ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Mean || op == ReduceOp::Prod;
}
// The result of a reduction over no element: Sum 0, Mean NaN (0 / 0), Prod 1.
constexpr double reduce_identity(ReduceOp op) {
  return op == ReduceOp::Prod
             ? 1.0
             : (op == ReduceOp::Mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
}

// Names for the profiler's table (core/profiler.h): `workloads --profile` prints
// unary_stub:gelu_erf rather than one row for every unary kernel. Found by argument-dependent
// lookup from core/dispatch.h, which does not know these enums.
inline const char* profile_label(UnaryOp op) {
  static constexpr const char* kNames[] = {
      "neg",        "exp",         "log",         "sqrt",       "rsqrt",     "abs",
      "tanh",       "sigmoid",     "relu",        "gelu_erf",   "gelu_tanh", "silu",
      "sin",        "cos",         "sign",        "reciprocal", "square",    "log1p",
      "expm1",      "erf",         "logical_not", "pow_scalar", "clamp",     "add_scalar",
      "mul_scalar", "rsub_scalar", "rdiv_scalar"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(UnaryOp::Count));
  return op < UnaryOp::Count ? kNames[size_t(op)] : "?";
}
inline const char* profile_label(BinaryOp op) {
  static constexpr const char* kNames[] = {"add",
                                           "sub",
                                           "mul",
                                           "div",
                                           "pow",
                                           "maximum",
                                           "minimum",
                                           "eq",
                                           "ne",
                                           "lt",
                                           "le",
                                           "gt",
                                           "ge",
                                           "logical_and",
                                           "logical_or",
                                           "relu_grad",
                                           "gelu_erf_grad",
                                           "gelu_tanh_grad",
                                           "silu_grad",
                                           "sigmoid_grad",
                                           "tanh_grad"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(BinaryOp::Count));
  return op < BinaryOp::Count ? kNames[size_t(op)] : "?";
}
inline const char* profile_label(ReduceOp op) {
  static constexpr const char* kNames[] = {"sum", "mean", "max", "min", "prod", "argmax", "argmin"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(ReduceOp::Count));
  return op < ReduceOp::Count ? kNames[size_t(op)] : "?";
}

}  // namespace accel
