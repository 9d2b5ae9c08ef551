#include "nn/norm.h"

#include <limits>
#include <sstream>

#include "nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

namespace {
void check_shape(const Shape& s, const char* op) {
  ACCEL_CHECK(!s.empty(), ValueError, op, "normalized_shape must not be empty");
  for (int64_t d : s) {
    ACCEL_CHECK(d > 0, ValueError, op, "normalized_shape must be positive, got ", s);
  }
}

double machine_eps(DType t) {
  switch (t) {
    case kFloat64: return std::numeric_limits<double>::epsilon();
    case kFloat16: return 0x1.0p-10;  // 9.77e-4
    case kBFloat16: return 0x1.0p-7;  // 7.81e-3
    default: return double(std::numeric_limits<float>::epsilon());
  }
}
}  // namespace

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine, bool with_bias)
    : normalized_shape(std::move(shape)), eps(eps_) {
  check_shape(normalized_shape, "LayerNorm");
  if (affine) {
    weight = register_parameter("weight", empty(normalized_shape));
    bias =
        register_parameter("bias", with_bias ? empty(normalized_shape) : Tensor());  // None without
  }
  reset_parameters();
}

void LayerNorm::reset_parameters(Generator*) {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << normalized_shape << ", eps=" << eps
     << ", elementwise_affine=" << (weight.defined() ? "true" : "false");
  return os.str();
}

RMSNorm::RMSNorm(Shape shape, std::optional<double> eps_, bool affine)
    : normalized_shape(std::move(shape)), eps(eps_) {
  check_shape(normalized_shape, "RMSNorm");
  if (affine) weight = register_parameter("weight", empty(normalized_shape));
  reset_parameters();
}

void RMSNorm::reset_parameters(Generator*) {
  if (weight.defined()) init::ones_(weight);
}

Tensor RMSNorm::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, "RMSNorm", "input is undefined");
  return rms_norm(x, normalized_shape, weight, eps ? *eps : machine_eps(x.dtype()));
}

std::string RMSNorm::extra_repr() const {
  std::ostringstream os;
  os << normalized_shape << ", eps=";
  if (eps) {
    os << *eps;
  } else {
    os << "None";
  }
  os << ", elementwise_affine=" << (weight.defined() ? "true" : "false");
  return os.str();
}

// ---------------- GroupNorm / InstanceNorm2d ----------------

GroupNorm::GroupNorm(int64_t g, int64_t c, double eps_, bool affine_)
    : num_groups(g), num_channels(c), eps(eps_), affine(affine_) {
  ACCEL_CHECK(g > 0 && c > 0 && c % g == 0, ValueError, "GroupNorm", "num_groups (", g,
              ") must be positive and divide num_channels (", c, ")");
  if (affine) {
    weight = register_parameter("weight", empty({c}));
    bias = register_parameter("bias", empty({c}));
  }
  reset_parameters();
}

void GroupNorm::reset_parameters(Generator*) {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor GroupNorm::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined() && x.dim() >= 2 && x.size(1) == num_channels, ShapeError, "GroupNorm",
              "expected input (N, ", num_channels, ", *), got ", x.defined() ? x.sizes() : Shape{});
  return group_norm(x, num_groups, weight, bias, eps);
}

std::string GroupNorm::extra_repr() const {
  std::ostringstream os;
  os << num_groups << ", " << num_channels << ", eps=" << eps
     << ", affine=" << (affine ? "true" : "false");
  return os.str();
}

InstanceNorm2d::InstanceNorm2d(int64_t c, double eps_, double m, bool affine_, bool track)
    : num_features(c), eps(eps_), momentum(m), affine(affine_), track_running_stats(track) {
  ACCEL_CHECK(c > 0, ValueError, "InstanceNorm2d", "num_features must be positive, got ", c);
  ACCEL_CHECK(m >= 0 && m <= 1, ValueError, "InstanceNorm2d", "momentum must be in [0, 1], got ",
              m);
  if (affine) {
    weight = register_parameter("weight", empty({c}));
    bias = register_parameter("bias", empty({c}));
    reset_parameters();
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

void InstanceNorm2d::reset_parameters(Generator*) {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

void InstanceNorm2d::reset_running_stats() {
  if (!track_running_stats) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

Tensor InstanceNorm2d::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  const char* op = "InstanceNorm2d";
  ACCEL_CHECK(x.defined() && (x.dim() == 3 || x.dim() == 4), ShapeError, op,
              "expected input (N, C, H, W) or (C, H, W), got ", x.defined() ? x.sizes() : Shape{});
  const Tensor xb = x.dim() == 3 ? x.unsqueeze(0) : x;
  // torch only warns when C differs from num_features without affine; refuse it here.
  ACCEL_CHECK(xb.size(1) == num_features, ShapeError, op, "expected ", num_features,
              " channels, got input ", x.sizes());
  const bool use_input_stats = is_training() || !track_running_stats;
  if (is_training() && track_running_stats) {
    NoGradGuard ng;
    num_batches_tracked.add_(ones({}, kInt64));
  }
  const Tensor y = instance_norm(xb, track_running_stats ? running_mean : Tensor(),
                                 track_running_stats ? running_var : Tensor(), weight, bias,
                                 use_input_stats, momentum, eps);
  return x.dim() == 3 ? y.squeeze(0) : y;
}

std::string InstanceNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=" << momentum
     << ", affine=" << (affine ? "true" : "false")
     << ", track_running_stats=" << (track_running_stats ? "true" : "false");
  return os.str();
}

}  // namespace accel::nn
