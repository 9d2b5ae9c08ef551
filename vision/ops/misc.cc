#include "vision/ops/misc.h"

#include <sstream>

#include "nn/batchnorm.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "autograd/ops.h"

namespace accel::vision::ops {

NormLayer batch_norm2d(double eps, std::optional<double> momentum) {
  return [eps, momentum](int64_t c) { return std::make_shared<nn::BatchNorm2d>(c, eps, momentum); };
}

NormLayer layer_norm(double eps) {
  return [eps](int64_t c) { return std::make_shared<nn::LayerNorm>(c, eps); };
}

Conv2dNormActivation::Conv2dNormActivation(int64_t in_channels, int64_t out_channels_,
                                           nn::Size2 kernel_size, nn::Size2 stride,
                                           std::optional<nn::Size2> padding, int64_t groups,
                                           NormLayer norm_layer, ActivationLayer activation_layer,
                                           nn::Size2 dilation, std::optional<bool> bias)
    : out_channels(out_channels_) {
  const nn::Size2 pad = padding.value_or(
      nn::Size2((kernel_size.h - 1) / 2 * dilation.h, (kernel_size.w - 1) / 2 * dilation.w));
  push_back(std::make_shared<nn::Conv2d>(in_channels, out_channels, kernel_size, stride, pad,
                                         dilation, groups, bias.value_or(!norm_layer)));
  if (norm_layer) push_back(norm_layer(out_channels));
  if (activation_layer) push_back(activation_layer());
}

SqueezeExcitation::SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels,
                                     ActivationLayer activation_,
                                     ActivationLayer scale_activation_) {
  ACCEL_CHECK(activation_ && scale_activation_, ValueError, "SqueezeExcitation",
              "activation and scale_activation are required");
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  fc1 = register_module("fc1", std::make_shared<nn::Conv2d>(input_channels, squeeze_channels, 1));
  fc2 = register_module("fc2", std::make_shared<nn::Conv2d>(squeeze_channels, input_channels, 1));
  activation = register_module("activation", activation_());
  scale_activation = register_module("scale_activation", scale_activation_());
}

Tensor SqueezeExcitation::forward(const Tensor& x) {
  Tensor scale = (*avgpool)(x);  // (N, C, 1, 1)
  scale = (*activation)((*fc1)(scale));
  scale = (*scale_activation)((*fc2)(scale));
  return mul(scale, x);
}

MLP::MLP(int64_t in_channels, const std::vector<int64_t>& hidden_channels, NormLayer norm_layer,
         ActivationLayer activation_layer, bool dropout_inplace, bool bias, double dropout) {
  ACCEL_CHECK(!hidden_channels.empty(), ValueError, "MLP", "hidden_channels is empty");
  ACCEL_CHECK(activation_layer || hidden_channels.size() == 1, ValueError, "MLP",
              "activation_layer is required between the layers");
  int64_t in_dim = in_channels;
  for (size_t i = 0; i + 1 < hidden_channels.size(); ++i) {
    push_back(std::make_shared<nn::Linear>(in_dim, hidden_channels[i], bias));
    if (norm_layer) push_back(norm_layer(hidden_channels[i]));
    push_back(activation_layer());
    push_back(std::make_shared<nn::Dropout>(dropout, dropout_inplace));
    in_dim = hidden_channels[i];
  }
  push_back(std::make_shared<nn::Linear>(in_dim, hidden_channels.back(), bias));
  push_back(std::make_shared<nn::Dropout>(dropout, dropout_inplace));
}

namespace {
void check_stochastic_depth(const char* op, double p, const std::string& mode) {
  ACCEL_CHECK(p >= 0.0 && p <= 1.0, ValueError, op,
              "drop probability has to be between 0 and 1, but got ", p);
  ACCEL_CHECK(mode == "batch" || mode == "row", ValueError, op,
              "mode has to be either 'batch' or 'row', but got '", mode, "'");
}
}  // namespace

Tensor stochastic_depth(const Tensor& input, double p, const std::string& mode, bool training,
                        Generator* gen) {
  const char* op = "stochastic_depth";
  check_stochastic_depth(op, p, mode);
  ACCEL_CHECK(input.defined(), ValueError, op, "input is undefined");
  if (!training || p == 0.0) return input;
  ACCEL_CHECK(input.dim() >= 1 || mode == "batch", ShapeError, op,
              "mode 'row' needs an input with a batch dim, got ", input.sizes());
  const double survival = 1.0 - p;
  // (N, 1, ..., 1) for "row", (1, ..., 1) for "batch": one keep draw per row or one in all.
  Shape size(size_t(input.dim()), 1);
  if (mode == "row") size[0] = input.size(0);
  Tensor noise;
  {
    NoGradGuard no_grad;
    noise = lt(rand(size, TensorOptions(kFloat64), gen), Scalar(survival)).to(input.dtype());
    if (survival > 0.0) noise = div(noise, survival);
    noise = noise.to(input.device());
  }
  return mul(input, noise);
}

StochasticDepth::StochasticDepth(double p_, std::string mode_, Generator* gen)
    : p(p_), mode(std::move(mode_)), gen_(gen) {
  check_stochastic_depth("StochasticDepth", p, mode);
}

Tensor StochasticDepth::forward(const Tensor& x) {
  return stochastic_depth(x, p, mode, is_training(), gen_);
}

std::string StochasticDepth::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p << ", mode=" << mode;
  return os.str();
}

}  // namespace accel::vision::ops
