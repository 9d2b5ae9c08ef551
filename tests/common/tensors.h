// Tensor helpers shared by the tests and their worker programs (no doctest): differences between
// results and fresh leaves for gradient checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "autograd/ops.h"
#include "core/tensor.h"

namespace accel::test {

// t's values in row-major order, as doubles.
inline std::vector<double> values_of(const Tensor& t) { return t.contiguous().to_vector<double>(); }

// The element of t at coordinates idx, as a double.
inline double value_at(const Tensor& t, const std::vector<int64_t>& idx) {
  if (int64_t(idx.size()) != t.dim())
    throw std::invalid_argument("value_at: wrong number of indices");
  int64_t flat = 0;
  for (size_t d = 0; d < idx.size(); ++d) flat = flat * t.size(int64_t(d)) + idx[d];
  return t.contiguous().to_vector<double>()[size_t(flat)];
}

// max |a - b| in float64 over the elements where a and b are not both NaN; infinity when the
// shapes differ, NaN when only one of a pair is NaN (so a check `<= tol` fails on it).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  NoGradGuard no_grad;
  const std::vector<double> x = a.detach().to(kCPU).to(kFloat64).contiguous().to_vector<double>();
  const std::vector<double> y = b.detach().to(kCPU).to(kFloat64).contiguous().to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    const double d = std::abs(x[i] - y[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

// max |a - b| / max |b| (max |a - b| when b is all zeros).
inline double rel_max_diff(const Tensor& a, const Tensor& b) {
  const double scale = max(abs(b)).item<double>();
  return max(abs(sub(a, b))).item<double>() / (scale > 0 ? scale : 1.0);
}

// A copy of t that is a leaf requiring grad (so two graphs do not share gradients).
inline Tensor leaf(const Tensor& t) { return t.detach().clone().requires_grad_(true); }

inline std::vector<Tensor> leaves(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(leaf(x));
  return out;
}

}  // namespace accel::test
