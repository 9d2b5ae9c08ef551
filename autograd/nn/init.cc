#include "autograd/nn/init.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace accel::nn::init {

namespace {

void check_float(const Tensor& t, const char* op) {
  ACCEL_CHECK(t.defined(), ValueError, op, "tensor is undefined");
  ACCEL_CHECK(t.is_floating_point(), DTypeError, op, "expected a floating tensor, got ", t.dtype(),
              " of shape ", t.sizes());
}

// Writes `values` (a CPU tensor of t's shape) into t without recording history.
Tensor assign(Tensor t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
  return t;
}

// A parameter built under nn::DeferredInit (or released by ZeRO-3) has no memory to fill.
bool unallocated(const Tensor& t) { return !t.storage()->allocated(); }

// Pulls from the generator exactly what filling `t` would (uniform and randn draw one value per
// element, in element order) and throws it away, in chunks so that no parameter-sized buffer
// is allocated. Keeps the generator stream of deferred construction equal to eager
// construction's (Note [deferred init] in autograd/nn/module.cc).
void discard_draws(const Tensor& t, bool normal, double lo, double hi, Generator* gen) {
  constexpr int64_t kChunk = 8192;
  for (int64_t done = 0; done < t.numel(); done += kChunk) {
    const int64_t n = std::min(kChunk, t.numel() - done);
    if (normal) {
      randn({n}, TensorOptions(kFloat64), gen);
    } else {
      uniform({n}, lo, hi, TensorOptions(t.dtype()), gen);
    }
  }
}

double fan(const Tensor& t, FanMode mode, const char* op) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t f = mode == FanMode::FanIn ? fan_in : fan_out;
  ACCEL_CHECK(f > 0, ValueError, op, "fan is zero for a tensor of shape ", t.sizes());
  return double(f);
}

}  // namespace

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  ACCEL_CHECK(t.defined() && t.dim() >= 2, ShapeError, "calculate_fan_in_and_fan_out",
              "fan in and fan out need a tensor with at least 2 dims, got shape ",
              t.defined() ? t.sizes() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const char* nonlinearity, double param) {
  const std::string n = nonlinearity;
  if (n == "linear" || n == "conv1d" || n == "conv2d" || n == "conv3d" || n == "sigmoid")
    return 1.0;
  if (n == "tanh") return 5.0 / 3.0;
  if (n == "relu") return std::sqrt(2.0);
  if (n == "leaky_relu") {
    const double slope = param < 0 ? 0.01 : param;
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (n == "selu") return 3.0 / 4.0;
  ACCEL_THROW(ValueError, "calculate_gain", "unsupported nonlinearity '", n, "'");
}

Tensor uniform_(Tensor t, double lo, double hi, Generator* gen) {
  check_float(t, "init.uniform_");
  ACCEL_CHECK(lo <= hi, ValueError, "init.uniform_", "lo ", lo, " > hi ", hi);
  if (unallocated(t)) {
    discard_draws(t, /*normal=*/false, lo, hi, gen);
    return t;
  }
  return assign(t, uniform(t.sizes(), lo, hi, TensorOptions(t.dtype()), gen));
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  check_float(t, "init.normal_");
  ACCEL_CHECK(std >= 0, ValueError, "init.normal_", "std must be >= 0, got ", std);
  if (unallocated(t)) {
    discard_draws(t, /*normal=*/true, 0.0, 1.0, gen);
    return t;
  }
  // Draw in float64 so the values do not depend on t's precision before the final rounding.
  Tensor v = randn(t.sizes(), TensorOptions(kFloat64), gen);
  if (std != 1.0 || mean != 0.0) {
    double* p = v.data<double>();
    for (int64_t i = 0; i < v.numel(); ++i) p[i] = mean + std * p[i];
  }
  return assign(t, v);
}

Tensor constant_(Tensor t, Scalar value) {
  ACCEL_CHECK(t.defined(), ValueError, "init.constant_", "tensor is undefined");
  if (unallocated(t)) return t;
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor zeros_(Tensor t) { return constant_(std::move(t), 0); }
Tensor ones_(Tensor t) { return constant_(std::move(t), 1); }

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, const char* nonlinearity,
                        Generator* gen) {
  check_float(t, "init.kaiming_uniform_");
  const double std =
      calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode, "init.kaiming_uniform_"));
  const double bound = std::sqrt(3.0) * std;  // uniform(-b, b) has std b / sqrt(3)
  return uniform_(std::move(t), -bound, bound, gen);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, const char* nonlinearity, Generator* gen) {
  check_float(t, "init.kaiming_normal_");
  const double std =
      calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode, "init.kaiming_normal_"));
  return normal_(std::move(t), 0.0, std, gen);
}

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  check_float(t, "init.xavier_uniform_");
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / double(fi + fo));
  return uniform_(std::move(t), -bound, bound, gen);
}

Tensor xavier_normal_(Tensor t, double gain, Generator* gen) {
  check_float(t, "init.xavier_normal_");
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  return normal_(std::move(t), 0.0, gain * std::sqrt(2.0 / double(fi + fo)), gen);
}

}  // namespace accel::nn::init
