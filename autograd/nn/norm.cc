#include "autograd/nn/norm.h"

#include <limits>
#include <sstream>

#include "autograd/nn/init.h"
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
    if (with_bias) bias = register_parameter("bias", empty(normalized_shape));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters(Generator*) {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
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

}  // namespace accel::nn
