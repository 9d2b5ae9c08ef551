// Branch-free float math that `omp simd` loops turn into AVX2/AVX-512 code. std::exp and
// std::erf do not vectorise without -ffast-math, and a scalar erf call made GELU 50x slower than
// oneDNN's (bench/kernels gelu rows). Doubles keep using libm.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace accel::cpu {

// Note [vectorised exp] in softmax_rows.h describes the scheme and its accuracy.
inline __attribute__((always_inline)) float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMin = -86.0f;         // 2^(n-1) below stays a normal number
  constexpr float kMax = 88.7228394f;    // log(FLT_MAX)
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = x < kMin ? kMin : x;
  xc = xc > kMax ? kMax : xc;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^(n-1) (n in [-124, 128], so the biased exponent n + 126 is in [2, 254]), times 2.
  const float half_scale = std::bit_cast<float>((int32_t(n) + 126) << 23);
  float res = p * half_scale * 2.0f;
  res = x < kMin ? 0.0f : res;
  res = x > kMax ? std::numeric_limits<float>::infinity() : res;
  return x != x ? x : res;
}

// erf by Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 in exact arithmetic, 5e-7 measured in float
// (a few float ulps near 1). Float64, which gradcheck uses, keeps std::erf.
// erf(|z|) from |z| and exp(-z^2) (gelu_erf_grad_f32 reuses the exp).
inline __attribute__((always_inline)) float erf_abs_f32(float az, float gauss) {
  const float t = 1.0f / (1.0f + 0.3275911f * az);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  return 1.0f - p * t * gauss;
}
inline __attribute__((always_inline)) float erf_f32(float x) {
  const float ax = std::fabs(x);
  return std::copysign(erf_abs_f32(ax, exp_f32(-ax * ax)), x);
}

// GELU's erf-form gradient g * (Phi(x) + x phi(x)) with one exp: A & S 7.1.26 writes
// erf(z) = 1 - poly(t) t exp(-z^2), and at z = x / sqrt(2) that exp(-z^2) = exp(-x^2 / 2) is the
// Gaussian phi(x) needs (times 1 / sqrt(2 pi)). The generic formula (common::gelu_erf_grad) calls
// exp twice; sharing it cuts the gradient's cost by about a third (bench/kernels gelu_backward,
// `workloads gpt --profile`: binary_stub:gelu_erf_grad). Same accuracy as erf_f32 above.
inline __attribute__((always_inline)) float gelu_erf_grad_f32(float g, float x) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const float gauss = exp_f32(-0.5f * x * x);  // exp(-z^2)
  const float erf_z = std::copysign(erf_abs_f32(std::fabs(x) * kSqrtHalf, gauss), x);
  return g * (0.5f * (1.0f + erf_z) + x * (kInvSqrt2Pi * gauss));
}

// tanh without libm, so GELU's tanh form (GPT-2's "gelu_new") vectorises: std::tanh made it
// 20-40x slower than the erf form. Two branches, both evaluated (select, no jump):
//   |x| < 0.4: the odd Taylor series to x^13 (the x^15 term is < 1.6e-9 there, 4e-9 relative);
//   else:      sign(x) (1 - 2 / (e^{2|x|} + 1)) on exp_f32 (e^{2|x|} = inf past 44 gives 1).
// Measured against double tanh over [-20, 20] (tests/autograd/test_nn_ops.cc): a few float ulps.
inline __attribute__((always_inline)) float tanh_f32(float x) {
  const float x2 = x * x;
  float p = 21844.0f / 6081075.0f;
  p = p * x2 - 1382.0f / 155925.0f;
  p = p * x2 + 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const float small = std::copysign(x + x * x2 * p, x);  // keeps tanh(-0) = -0
  const float ax = std::fabs(x);
  const float e = exp_f32(2.0f * ax);
  const float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return ax < 0.4f ? small : big;  // NaN fails the test and takes `big`, which is NaN
}

template <typename A>
inline __attribute__((always_inline)) A fast_exp(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return exp_f32(x);
  } else {
    return std::exp(x);
  }
}
template <typename A>
inline __attribute__((always_inline)) A fast_tanh(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return tanh_f32(x);
  } else {
    return std::tanh(x);
  }
}
template <typename A>
inline __attribute__((always_inline)) A fast_erf(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return erf_f32(x);
  } else {
    return std::erf(x);
  }
}

// The math policy of kernels/common/scalar_math.h on the CPU: the formulas there (GELU, SiLU,
// sigmoid and their gradients) run on these, so every ISA pass, the scalar tails and the f64
// path evaluate the same expression; only exp/erf/tanh of float are the polynomials above.
// (kernels/common/optim.h's Adam update uses sqrt.)
struct CpuMath {
  template <typename A>
  static inline __attribute__((always_inline)) A exp(A x) {
    return fast_exp(x);
  }
  template <typename A>
  static inline __attribute__((always_inline)) A erf(A x) {
    return fast_erf(x);
  }
  template <typename A>
  static inline __attribute__((always_inline)) A tanh(A x) {
    return fast_tanh(x);
  }
  template <typename A>
  static inline __attribute__((always_inline)) A sqrt(A x) {
    return std::sqrt(x);
  }
};

}  // namespace accel::cpu
