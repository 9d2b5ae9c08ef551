#include "nn/utils.h"

#include <cmath>

#include "autograd/ops.h"

namespace accel::nn::utils {

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

Tensor parameters_to_vector(const std::vector<Tensor>& params) {
  const char* op = "parameters_to_vector";
  std::vector<Tensor> flat;
  flat.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& t = params[i];
    ACCEL_CHECK(t.defined(), ValueError, op, "parameter ", i, " is undefined");
    if (!flat.empty()) {
      const Tensor& first = params[0];
      ACCEL_CHECK(t.device() == first.device(), DeviceError, op, "parameter ", i, " is on ",
                  t.device(), " but parameter 0 is on ", first.device(), " (shapes ", t.sizes(),
                  " and ", first.sizes(), ")");
      ACCEL_CHECK(t.dtype() == first.dtype(), DTypeError, op, "parameter ", i, " has dtype ",
                  t.dtype(), " but parameter 0 has ", first.dtype(), " (shapes ", t.sizes(),
                  " and ", first.sizes(), ")");
    }
    flat.push_back(t.reshape({-1}));
  }
  ACCEL_CHECK(!flat.empty(), ValueError, op, "no parameters given");
  return cat(flat, 0);
}

void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& params) {
  const char* op = "vector_to_parameters";
  ACCEL_CHECK(vec.defined() && vec.dim() == 1, ShapeError, op, "expected a 1-D vector, got ",
              vec.defined() ? shape_str(vec.sizes()) : std::string("an undefined tensor"));
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ACCEL_CHECK(params[i].defined(), ValueError, op, "parameter ", i, " is undefined");
    total += params[i].numel();
  }
  ACCEL_CHECK(total == vec.numel(), ShapeError, op, "the vector has ", vec.numel(),
              " elements but the ", params.size(), " parameters hold ", total);
  NoGradGuard no_grad;
  int64_t at = 0;
  for (const Tensor& p : params) {
    Tensor dst = p;  // the parameter's own impl: copied into, not rebound
    dst.copy_(vec.narrow(0, at, p.numel()).reshape(p.sizes()));
    at += p.numel();
  }
}

}  // namespace accel::nn::utils
