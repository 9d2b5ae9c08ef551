// Sorting and sampling kernels (kernels/<backend>/sort*: sort.cc on the CPU; sort.cc, sort.cu on
// CUDA). The ops in autograd/ops/sort.cc check shapes, dtypes and the probabilities' values;
// kernels assume them.
#pragma once

#include "core/dispatch.h"

namespace accel {

// x: contiguous (rows, n) (the op moves the sorted dim last), any dtype but bool; values:
// contiguous (rows, k), x's dtype; indices: contiguous (rows, k) int64; 0 <= k <= n. Each row in
// ascending order (descending: reversed comparison), NaN above every number, equal elements in
// input order (stable); the first k of each row are written (sort: k = n; topk: k). One total
// order on every backend, so topk's ties resolve the same way everywhere.
ACCEL_DECLARE_STUB(sort_stub, void (*)(const Tensor& x, int64_t k, bool descending, Tensor& values,
                                       Tensor& indices));
// probs: contiguous (rows, n) floating, every row finite, >= 0, with a positive sum (checked by
// the op); uniforms: contiguous (rows, s) float64 in [0, 1); out: contiguous (rows, s) int64:
//   out[r, j] = the first c with cdf_r[c] > uniforms[r, j] * cdf_r[n - 1]
// (cdf_r: running sum of row r in float64, in index order; never a zero-probability category).
ACCEL_DECLARE_STUB(multinomial_stub,
                   void (*)(const Tensor& probs, const Tensor& uniforms, Tensor& out));

}  // namespace accel
