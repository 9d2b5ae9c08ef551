// Scalar activation math written once for the CPU kernels, the CUDA kernels and the references
// in tests: the forward formulas whose inputs are x, and the gradients the fused backward ops
// (BinaryOp::*Grad) compute from (grad, x) or (grad, y). A is the arithmetic type (float or
// double, acc_type.h); M is the backend's math policy, a struct of static functions
//   M::exp(A), M::erf(A), M::tanh(A)
// (kernels/cpu/vec_math.h CpuMath: branch-free float polynomials that `omp simd` vectorises,
// libm for double; kernels/cuda/common.cuh CudaMath: the CUDA math library). Everything here is
// ACCEL_HD: inlined on the host (the vectoriser needs it), __host__ __device__ under nvcc.
#pragma once

#include "kernels/common/macros.h"

namespace accel::common {

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluTanhCoef = 0.044715;

// ---- forward ----
template <typename A>
ACCEL_HD A relu(A x) {
  return x > A(0) ? x : A(0);
}
template <typename A>
ACCEL_HD A sign(A x) {
  return A((x > A(0)) - (x < A(0)));
}
// min(max(x, lo), hi); NaN stays NaN (both comparisons are false).
template <typename A, typename B>
ACCEL_HD A clamp(A x, B lo, B hi) {
  return x < lo ? A(lo) : (x > hi ? A(hi) : x);
}
template <typename M, typename A>
ACCEL_HD A sigmoid(A x) {
  return A(1) / (A(1) + M::exp(-x));
}
template <typename M, typename A>
ACCEL_HD A silu(A x) {
  return x / (A(1) + M::exp(-x));
}
// x * Phi(x), Phi the standard normal CDF.
template <typename M, typename A>
ACCEL_HD A gelu_erf(A x) {
  return A(0.5) * x * (A(1) + M::erf(x * A(kSqrt1_2)));
}
// The tanh approximation (GPT-2's "gelu_new").
template <typename M, typename A>
ACCEL_HD A gelu_tanh(A x) {
  return A(0.5) * x * (A(1) + M::tanh(A(kSqrt2OverPi) * (x + A(kGeluTanhCoef) * x * x * x)));
}

// ---- gradients: g * f'(.), the product with g last (the CPU's 16-bit tables keep f' alone:
// Note [16-bit tables for polynomial ops] in kernels/cpu/elementwise.h) ----
template <typename A>
ACCEL_HD A relu_grad(A g, A x) {
  return x > A(0) ? g : A(0);
}
// y = sigmoid(x), the saved output.
template <typename A>
ACCEL_HD A sigmoid_grad(A g, A y) {
  return g * y * (A(1) - y);
}
// y = tanh(x), the saved output.
template <typename A>
ACCEL_HD A tanh_grad(A g, A y) {
  return g * (A(1) - y * y);
}
template <typename M, typename A>
ACCEL_HD A silu_grad(A g, A x) {
  const A s = sigmoid<M>(x);
  return g * (s * (A(1) + x * (A(1) - s)));
}
// d/dx x Phi(x) = Phi(x) + x phi(x).
template <typename M, typename A>
ACCEL_HD A gelu_erf_grad(A g, A x) {
  const A cdf = A(0.5) * (A(1) + M::erf(x * A(kSqrt1_2)));
  const A pdf = A(kInvSqrt2Pi) * M::exp(A(-0.5) * x * x);
  return g * (cdf + x * pdf);
}
template <typename M, typename A>
ACCEL_HD A gelu_tanh_grad(A g, A x) {
  const A k = A(kSqrt2OverPi);
  const A inner = k * (x + A(kGeluTanhCoef) * x * x * x);
  const A t = M::tanh(inner);
  const A dinner = k * (A(1) + A(3 * kGeluTanhCoef) * x * x);
  return g * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner);
}

}  // namespace accel::common
