// Row primitives shared by the softmax and loss kernels: a vectorisable float exp and
// max / exp-sum passes over a contiguous row. T is the storage type, A = acc_t<T> the math type.
//
// Note [vectorised exp]: std::exp does not vectorise without -ffast-math, and softmax and
// cross-entropy spend most of their time in it. exp_f32 is the Cephes single-precision scheme
// (x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, 2^n from the exponent bits), written
// branch-free so that `omp simd` loops compile to AVX2/AVX-512 code. Relative error is below
// 2^-23 over [-86, 88.7] (measured max 8.4e-8 against double exp); results below ~1e-38 flush
// to 0 (softmax of a -inf mask gives exactly 0), overflow gives +inf and NaN stays NaN. Doubles
// use std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"

namespace accel::cpu {

template <typename A>
inline __attribute__((always_inline)) A exp_acc(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return exp_f32(x);
  } else {
    return std::exp(x);
  }
}

// always_inline: these are defined once, at the baseline target; inlined into a kernel of an ISA
// pass (Note [portable builds and ISA dispatch] in cpu_isa.h) their loops vectorise for that pass.

// Note [lane sums]: GCC 12 ends an `omp simd reduction(+ : s)` by storing the vector of partial
// sums and adding its lanes one after another: 16 dependent scalar adds for floats on AVX-512,
// about 60 cycles, which the next pass over the row waits for. A LayerNorm row of 128 floats spent
// about half its forward there (`perf annotate`, 2026-12-06). The row sums below keep kLanes
// partial sums in an array the loop vectorises into one register and add them as a tree
// (lane_tree: 4 levels). The loops are written out where they are used: a lambda from an ISA pass
// does not inline into a helper compiled for the baseline. The order of the additions differs
// from a sequential sum, as any vector reduction's.
template <typename A>
inline constexpr int kLanes = 64 / int(sizeof(A));
template <typename A>
inline __attribute__((always_inline)) A lane_tree(A* acc) {
  for (int w = kLanes<A> / 2; w > 0; w /= 2) {
#pragma omp simd
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_max(const T* x, int64_t n) {
  using A = acc_t<T>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  A acc[kLanes<A>];  // Note [lane sums]: the maxima lane by lane, then a tree
  for (A& a : acc) a = kNegInf;
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) {
      const A v = cast<A>(x[i + j]);
      acc[j] = v > acc[j] ? v : acc[j];
    }
  }
  A m = kNegInf;
  for (; i < n; ++i) {
    const A v = cast<A>(x[i]);
    m = v > m ? v : m;
  }
  for (int w = kLanes<A> / 2; w > 0; w /= 2) {
#pragma omp simd
    for (int j = 0; j < w; ++j) acc[j] = acc[j + w] > acc[j] ? acc[j + w] : acc[j];
  }
  // The max may skip a NaN, but x - m stays NaN at that element and poisons the row's sum, so
  // softmax of a row with a NaN is all NaN, as in PyTorch.
  return acc[0] > m ? acc[0] : m;
}

template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_sum(const T* x, int64_t n) {
  using A = acc_t<T>;
  A acc[kLanes<A>] = {};  // Note [lane sums]
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) acc[j] += cast<A>(x[i + j]);
  }
  A tail = A(0);
  for (; i < n; ++i) tail += cast<A>(x[i]);
  return lane_tree(acc) + tail;
}

// sum_i a[i] b[i].
template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_dot(const T* a, const T* b, int64_t n) {
  using A = acc_t<T>;
  A acc[kLanes<A>] = {};  // Note [lane sums]
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) acc[j] += cast<A>(a[i + j]) * cast<A>(b[i + j]);
  }
  A tail = A(0);
  for (; i < n; ++i) tail += cast<A>(a[i]) * cast<A>(b[i]);
  return lane_tree(acc) + tail;
}

// sum_i (x[i] - mu)^2.
template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_sum_sq_dev(const T* x, int64_t n, acc_t<T> mu) {
  using A = acc_t<T>;
  A acc[kLanes<A>] = {};  // Note [lane sums]
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) {
      const A d = cast<A>(x[i + j]) - mu;
      acc[j] += d * d;
    }
  }
  A tail = A(0);
  for (; i < n; ++i) {
    const A d = cast<A>(x[i]) - mu;
    tail += d * d;
  }
  return lane_tree(acc) + tail;
}

// sum_i exp(x[i] - m), without storing.
template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_sum_exp(const T* x, int64_t n, acc_t<T> m) {
  using A = acc_t<T>;
  A acc[kLanes<A>] = {};  // Note [lane sums]
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) acc[j] += exp_acc<A>(cast<A>(x[i + j]) - m);
  }
  A tail = A(0);
  for (; i < n; ++i) tail += exp_acc<A>(cast<A>(x[i]) - m);
  return lane_tree(acc) + tail;
}

// y[i] = exp(x[i] - m) (in A, into a scratch row), returns the sum.
template <typename T>
inline __attribute__((always_inline)) acc_t<T> row_exp_store(const T* x, int64_t n, acc_t<T> m,
                                                             acc_t<T>* y) {
  using A = acc_t<T>;
  A acc[kLanes<A>] = {};  // Note [lane sums]
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) {
      const A e = exp_acc<A>(cast<A>(x[i + j]) - m);
      y[i + j] = e;
      acc[j] += e;
    }
  }
  A tail = A(0);
  for (; i < n; ++i) {
    const A e = exp_acc<A>(cast<A>(x[i]) - m);
    y[i] = e;
    tail += e;
  }
  return lane_tree(acc) + tail;
}

}  // namespace accel::cpu
