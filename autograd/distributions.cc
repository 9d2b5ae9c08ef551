#include "autograd/distributions.h"

#include <limits>

#include "autograd/ops.h"

namespace accel::distributions {

namespace {

// torch.finfo(dt).eps and .min.
double dtype_eps(DType dt) {
  switch (dt) {
    case kFloat64: return std::numeric_limits<double>::epsilon();
    case kFloat16: return 0x1.0p-10;
    case kBFloat16: return 0x1.0p-7;
    default: return double(std::numeric_limits<float>::epsilon());
  }
}
double dtype_lowest(DType dt) {
  switch (dt) {
    case kFloat64: return std::numeric_limits<double>::lowest();
    case kFloat16: return -65504.0;
    case kBFloat16: return -0x1.fep127;
    default: return double(std::numeric_limits<float>::lowest());
  }
}

void check_param(const Tensor& p, const char* what) {
  ACCEL_CHECK(p.defined(), ValueError, "Categorical", what, " is undefined");
  ACCEL_CHECK(p.is_floating_point(), DTypeError, "Categorical", what, " must be floating, got ",
              p.dtype(), " of shape ", p.sizes());
  ACCEL_CHECK(p.dim() >= 1 && p.size(p.dim() - 1) > 0, ShapeError, "Categorical", what,
              " must be (..., K) with K >= 1 categories, got shape ", p.sizes());
}

}  // namespace

Categorical Categorical::from_probs(const Tensor& probs) {
  check_param(probs, "probs");
  {
    // validate_args: non-negative, finite, every row with positive mass (NaN fails each test).
    NoGradGuard no_grad;
    if (probs.numel() > 0) {
      const double lo = amin(probs).item(), hi = amax(probs).item();
      ACCEL_CHECK(lo >= 0.0 && hi < std::numeric_limits<double>::infinity(), ValueError,
                  "Categorical", "probs must be finite and non-negative, got values in [", lo, ", ",
                  hi, "] (shape ", probs.sizes(), ")");
      const double row_min = amin(sum(probs, {-1})).item();
      ACCEL_CHECK(row_min > 0.0, ValueError, "Categorical",
                  "every row of probs needs a positive sum, got a row summing to ", row_min,
                  " (shape ", probs.sizes(), ")");
    }
  }
  Tensor p = div(probs, sum(probs, {-1}, /*keepdim=*/true));
  const double eps = dtype_eps(probs.dtype());
  Tensor l = log(clamp(p, Scalar(eps), Scalar(1.0 - eps)));
  return Categorical(std::move(p), std::move(l));
}

Categorical Categorical::from_logits(const Tensor& logits) {
  check_param(logits, "logits");
  if (logits.numel() > 0) {
    NoGradGuard no_grad;
    // validate_args: real (no NaN; -inf is a zero-probability category). +inf has no normalised
    // form.
    const double lo = amin(logits).item(), hi = amax(logits).item();
    ACCEL_CHECK(lo == lo && hi == hi && hi < std::numeric_limits<double>::infinity(), ValueError,
                "Categorical", "logits must be real numbers below +inf, got values in [", lo, ", ",
                hi, "] (shape ", logits.sizes(), ")");
  }
  Tensor l = log_softmax(logits, -1);
  Tensor p = softmax(logits, -1);
  return Categorical(std::move(p), std::move(l));
}

Shape Categorical::batch_shape() const {
  Shape s = probs_.sizes();
  s.pop_back();
  return s;
}

Tensor Categorical::sample(const Shape& sample_shape, Generator* gen) const {
  Shape out = sample_shape;
  for (int64_t d : batch_shape()) out.push_back(d);
  int64_t n = 1;
  for (int64_t d : sample_shape) {
    ACCEL_CHECK(d >= 0, ShapeError, "Categorical.sample", "negative size in sample_shape ",
                sample_shape);
    n *= d;
  }
  if (n == 0 || probs_.numel() == 0) return zeros(out, TensorOptions(kInt64, probs_.device()));
  NoGradGuard no_grad;
  // (rows, K) -> multinomial (rows, n) -> (n, rows) -> sample_shape + batch_shape, as torch.
  Tensor p2 = probs_.detach().reshape({-1, num_events()});
  Tensor s = multinomial(p2, n, /*replacement=*/true, gen);
  return s.t().contiguous().reshape(out);
}

Tensor Categorical::log_prob(const Tensor& value) const {
  const char* op = "Categorical.log_prob";
  ACCEL_CHECK(value.defined(), ValueError, op, "value is undefined");
  ACCEL_CHECK(!value.is_floating_point() && value.dtype() != kBool, DTypeError, op,
              "value must hold category indices (an integer dtype), got ", value.dtype(),
              " of shape ", value.sizes());
  ACCEL_CHECK(value.device() == logits_.device(), DeviceError, op, "value on ", value.device(),
              " but the distribution on ", logits_.device());
  const int64_t k = num_events();
  Tensor v = value.to(kInt64);
  if (v.numel() > 0) {
    const int64_t lo = amin(v).item<int64_t>(), hi = amax(v).item<int64_t>();
    ACCEL_CHECK(lo >= 0 && hi < k, ValueError, op, "value holds indices in [", lo, ", ", hi,
                "], outside the support [0, ", k, ") (value shape ", value.sizes(),
                ", batch shape ", batch_shape(), ")");
  }
  const Shape b = broadcast_shapes(v.sizes(), batch_shape(), op);
  Shape lb = b;
  lb.push_back(k);
  Tensor lp = logits_.sizes() == lb ? logits_ : logits_.expand(lb);
  Tensor idx = v.expand(b).unsqueeze(-1).contiguous();
  return gather(lp, -1, idx).squeeze(-1);
}

Tensor Categorical::entropy() const {
  // torch: logits clamped at the dtype's lowest finite value, so a zero-probability category
  // (logit -inf) adds 0 * lowest = 0 rather than 0 * -inf = NaN.
  Tensor l = clamp(logits_, Scalar(dtype_lowest(logits_.dtype())), std::nullopt);
  return neg(sum(mul(l, probs_), {-1}));
}

}  // namespace accel::distributions
