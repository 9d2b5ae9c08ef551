#include "autograd/nn/utils.h"

#include <cmath>

#include "autograd/ops.h"

namespace accel::nn {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p,
                       bool error_if_nonfinite) {
  ACCEL_CHECK(max_norm >= 0, ValueError, "clip_grad_norm_", "max_norm must be >= 0, got ",
              max_norm);
  ACCEL_CHECK(p > 0, ValueError, "clip_grad_norm_", "norm type must be > 0, got ", p);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& t : params) {
    if (t.defined() && t.grad().defined()) grads.push_back(t.grad());
  }
  if (grads.empty()) return 0.0;
  // Per-tensor norms stay on the device and are combined there; one item() at the end keeps
  // this at a single host sync on an accelerator. Accumulate in float64 on the host side only.
  const bool inf = std::isinf(p);
  Tensor total;
  for (const Tensor& g : grads) {
    Tensor n = inf        ? amax(abs(g)).to(kFloat64)
               : p == 2.0 ? sum(mul(g, g)).to(kFloat64)
                          : pow(norm(g, p).to(kFloat64), p);
    total = total.defined() ? (inf ? maximum(total, n) : total + n) : n;
  }
  const double total_norm = inf ? total.item<double>() : std::pow(total.item<double>(), 1.0 / p);
  ACCEL_CHECK(!error_if_nonfinite || std::isfinite(total_norm), ValueError, "clip_grad_norm_",
              "the total norm of order ", p, " of ", grads.size(), " gradients is non-finite (",
              total_norm, "), so it cannot be clipped");
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef >= 1.0)) {  // NaN coef (NaN norm) propagates into the gradients
    for (Tensor& g : grads) g.mul_(coef);
  }
  return total_norm;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  ACCEL_CHECK(clip_value >= 0, ValueError, "clip_grad_value_", "clip_value must be >= 0, got ",
              clip_value);
  NoGradGuard no_grad;
  for (const Tensor& t : params) {
    if (!t.defined()) continue;
    Tensor g = t.grad();
    if (g.defined()) g.clamp_(-clip_value, clip_value);
  }
}

}  // namespace accel::nn
