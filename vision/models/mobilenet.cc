#include "vision/models/mobilenet.h"

#include <cmath>

#include "nn/activation.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "vision/models/model_init.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

int64_t make_divisible(double v, int64_t divisor, int64_t min_value) {
  if (min_value == 0) min_value = divisor;
  // int(v + divisor / 2) // divisor * divisor: truncation, v > 0.
  int64_t new_v = std::max(min_value, int64_t(v + double(divisor) / 2.0) / divisor * divisor);
  if (double(new_v) < 0.9 * v) new_v += divisor;  // never round down by more than 10%
  return new_v;
}

namespace {
void check_input(const char* model, const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, model,
              "expected an input (N, 3, H, W), got ", x.defined() ? x.sizes() : Shape{});
}
}  // namespace

// ---------------- MobileNetV2 ----------------

namespace mobilenetv2 {

InvertedResidual::InvertedResidual(int64_t inp, int64_t oup, int64_t stride_, double expand_ratio,
                                   ops::NormLayer norm_layer)
    : stride(stride_), out_channels(oup) {
  ACCEL_CHECK(stride == 1 || stride == 2, ValueError, "InvertedResidual",
              "stride should be 1 or 2 instead of ", stride);
  if (!norm_layer) norm_layer = ops::batch_norm2d();
  // int(round(inp * expand_ratio)): Python rounds half to even, as nearbyint does.
  const int64_t hidden_dim = int64_t(std::nearbyint(double(inp) * expand_ratio));
  use_res_connect = stride == 1 && inp == oup;
  auto layers = std::make_shared<nn::Sequential>();
  const auto relu6 = ops::activation<nn::ReLU6>(true);
  if (expand_ratio != 1.0) {
    layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
        inp, hidden_dim, 1, 1, std::nullopt, 1, norm_layer, relu6));
  }
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      hidden_dim, hidden_dim, 3, stride, std::nullopt, hidden_dim, norm_layer, relu6));
  layers->push_back(std::make_shared<nn::Conv2d>(hidden_dim, oup, 1, 1, 0, 1, 1, false));
  layers->push_back(norm_layer(oup));
  conv = register_module("conv", layers);
}

Tensor InvertedResidual::forward(const Tensor& x) {
  return use_res_connect ? add(x, (*conv)(x)) : (*conv)(x);
}

}  // namespace mobilenetv2

MobileNetV2::MobileNetV2(const MobileNetV2Options& o) {
  const char* op = "MobileNetV2";
  ACCEL_CHECK(o.num_classes >= 1, ValueError, op, "num_classes must be positive, got ",
              o.num_classes);
  ops::NormLayer norm_layer = o.norm_layer ? o.norm_layer : ops::batch_norm2d();
  std::vector<std::array<int64_t, 4>> setting = o.inverted_residual_setting;
  if (setting.empty()) {
    setting = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
               {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  }
  int64_t input_channel = make_divisible(32 * o.width_mult, o.round_nearest);
  last_channel = make_divisible(1280 * std::max(1.0, o.width_mult), o.round_nearest);
  const auto relu6 = ops::activation<nn::ReLU6>(true);
  auto feats = std::make_shared<nn::Sequential>();
  feats->push_back(std::make_shared<ops::Conv2dNormActivation>(3, input_channel, 3, 2, std::nullopt,
                                                               1, norm_layer, relu6));
  for (const auto& [t, c, n, s] : setting) {
    const int64_t output_channel = make_divisible(double(c) * o.width_mult, o.round_nearest);
    for (int64_t i = 0; i < n; ++i) {
      feats->push_back(std::make_shared<mobilenetv2::InvertedResidual>(
          input_channel, output_channel, i == 0 ? s : 1, double(t), norm_layer));
      input_channel = output_channel;
    }
  }
  feats->push_back(std::make_shared<ops::Conv2dNormActivation>(input_channel, last_channel, 1, 1,
                                                               std::nullopt, 1, norm_layer, relu6));
  features = register_module("features", feats);
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Dropout>(o.dropout),
                                       std::make_shared<nn::Linear>(last_channel, o.num_classes)));
  detail::init_convs_kaiming_fan_out(*this);
  detail::init_norms(*this);
  detail::init_linears_normal(*this, 0.01);
}

Tensor MobileNetV2::forward(const Tensor& x) {
  check_input("MobileNetV2", x);
  Tensor h = adaptive_avg_pool2d((*features)(x), {1, 1}).flatten(1);  // (N, last_channel)
  return (*classifier)(h);
}

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& o) {
  return detail::build_as<MobileNetV2>(o.weights, [&] { return std::make_shared<MobileNetV2>(o); });
}

// ---------------- MobileNetV3 ----------------

namespace mobilenetv3 {

InvertedResidualConfig::InvertedResidualConfig(int64_t input_channels_, int64_t kernel_,
                                               int64_t expanded_channels_, int64_t out_channels_,
                                               bool use_se_, const std::string& activation,
                                               int64_t stride_, int64_t dilation_,
                                               double width_mult)
    : input_channels(adjust_channels(input_channels_, width_mult)),
      kernel(kernel_),
      expanded_channels(adjust_channels(expanded_channels_, width_mult)),
      out_channels(adjust_channels(out_channels_, width_mult)),
      use_se(use_se_),
      use_hs(activation == "HS"),
      stride(stride_),
      dilation(dilation_) {
  ACCEL_CHECK(activation == "HS" || activation == "RE", ValueError, "InvertedResidualConfig",
              "activation is \"RE\" (ReLU) or \"HS\" (Hardswish), got \"", activation, "\"");
}

int64_t InvertedResidualConfig::adjust_channels(int64_t channels, double width_mult) {
  return make_divisible(double(channels) * width_mult, 8);
}

InvertedResidual::InvertedResidual(const InvertedResidualConfig& cnf, ops::NormLayer norm_layer)
    : out_channels(cnf.out_channels) {
  ACCEL_CHECK(cnf.stride == 1 || cnf.stride == 2, ValueError, "InvertedResidual",
              "illegal stride value ", cnf.stride);
  use_res_connect = cnf.stride == 1 && cnf.input_channels == cnf.out_channels;
  const ops::ActivationLayer act =
      cnf.use_hs ? ops::activation<nn::Hardswish>(true) : ops::activation<nn::ReLU>(true);
  auto layers = std::make_shared<nn::Sequential>();
  if (cnf.expanded_channels != cnf.input_channels) {
    layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
        cnf.input_channels, cnf.expanded_channels, 1, 1, std::nullopt, 1, norm_layer, act));
  }
  const int64_t stride = cnf.dilation > 1 ? 1 : cnf.stride;
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      cnf.expanded_channels, cnf.expanded_channels, cnf.kernel, stride, std::nullopt,
      cnf.expanded_channels, norm_layer, act, cnf.dilation));
  if (cnf.use_se) {
    const int64_t squeeze_channels = make_divisible(double(cnf.expanded_channels / 4), 8);
    layers->push_back(std::make_shared<ops::SqueezeExcitation>(
        cnf.expanded_channels, squeeze_channels, ops::activation<nn::ReLU>(),
        ops::activation<nn::Hardsigmoid>()));
  }
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      cnf.expanded_channels, cnf.out_channels, 1, 1, std::nullopt, 1, norm_layer, nullptr));
  block = register_module("block", layers);
}

Tensor InvertedResidual::forward(const Tensor& x) {
  Tensor result = (*block)(x);
  return use_res_connect ? add(result, x) : result;
}

}  // namespace mobilenetv3

MobileNetV3::MobileNetV3(const std::vector<mobilenetv3::InvertedResidualConfig>& setting,
                         int64_t last_channel, int64_t num_classes, ops::NormLayer norm_layer,
                         double dropout) {
  const char* op = "MobileNetV3";
  ACCEL_CHECK(!setting.empty(), ValueError, op,
              "the inverted_residual_setting should not be empty");
  ACCEL_CHECK(num_classes >= 1, ValueError, op, "num_classes must be positive, got ", num_classes);
  if (!norm_layer) norm_layer = ops::batch_norm2d(0.001, 0.01);
  const auto hardswish = ops::activation<nn::Hardswish>(true);
  auto layers = std::make_shared<nn::Sequential>();
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      3, setting.front().input_channels, 3, 2, std::nullopt, 1, norm_layer, hardswish));
  for (const auto& cnf : setting)
    layers->push_back(std::make_shared<mobilenetv3::InvertedResidual>(cnf, norm_layer));
  const int64_t lastconv_input = setting.back().out_channels, lastconv_output = 6 * lastconv_input;
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      lastconv_input, lastconv_output, 1, 1, std::nullopt, 1, norm_layer, hardswish));
  features = register_module("features", layers);
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(lastconv_output, last_channel),
                                       std::make_shared<nn::Hardswish>(true),
                                       std::make_shared<nn::Dropout>(dropout, /*inplace=*/true),
                                       std::make_shared<nn::Linear>(last_channel, num_classes)));
  detail::init_convs_kaiming_fan_out(*this);
  detail::init_norms(*this);
  detail::init_linears_normal(*this, 0.01);
}

Tensor MobileNetV3::forward(const Tensor& x) {
  check_input("MobileNetV3", x);
  Tensor h = (*avgpool)((*features)(x)).flatten(1);
  return (*classifier)(h);
}

namespace {
// torchvision's _mobilenet_v3_conf(arch, width_mult, reduced_tail, dilated).
std::shared_ptr<MobileNetV3> build_v3(bool large, const MobileNetV3Options& o) {
  using Cnf = mobilenetv3::InvertedResidualConfig;
  const int64_t rd = o.reduced_tail ? 2 : 1, dil = o.dilated ? 2 : 1;
  const double w = o.width_mult;
  std::vector<Cnf> s;
  int64_t last_channel;
  if (large) {
    s = {Cnf(16, 3, 16, 16, false, "RE", 1, 1, w),
         Cnf(16, 3, 64, 24, false, "RE", 2, 1, w),  // C1
         Cnf(24, 3, 72, 24, false, "RE", 1, 1, w),
         Cnf(24, 5, 72, 40, true, "RE", 2, 1, w),  // C2
         Cnf(40, 5, 120, 40, true, "RE", 1, 1, w),
         Cnf(40, 5, 120, 40, true, "RE", 1, 1, w),
         Cnf(40, 3, 240, 80, false, "HS", 2, 1, w),  // C3
         Cnf(80, 3, 200, 80, false, "HS", 1, 1, w),
         Cnf(80, 3, 184, 80, false, "HS", 1, 1, w),
         Cnf(80, 3, 184, 80, false, "HS", 1, 1, w),
         Cnf(80, 3, 480, 112, true, "HS", 1, 1, w),
         Cnf(112, 3, 672, 112, true, "HS", 1, 1, w),
         Cnf(112, 5, 672, 160 / rd, true, "HS", 2, dil, w),  // C4
         Cnf(160 / rd, 5, 960 / rd, 160 / rd, true, "HS", 1, dil, w),
         Cnf(160 / rd, 5, 960 / rd, 160 / rd, true, "HS", 1, dil, w)};
    last_channel = Cnf::adjust_channels(1280 / rd, w);  // C5
  } else {
    s = {Cnf(16, 3, 16, 16, true, "RE", 2, 1, w),   // C1
         Cnf(16, 3, 72, 24, false, "RE", 2, 1, w),  // C2
         Cnf(24, 3, 88, 24, false, "RE", 1, 1, w),
         Cnf(24, 5, 96, 40, true, "HS", 2, 1, w),  // C3
         Cnf(40, 5, 240, 40, true, "HS", 1, 1, w),
         Cnf(40, 5, 240, 40, true, "HS", 1, 1, w),
         Cnf(40, 5, 120, 48, true, "HS", 1, 1, w),
         Cnf(48, 5, 144, 48, true, "HS", 1, 1, w),
         Cnf(48, 5, 288, 96 / rd, true, "HS", 2, dil, w),  // C4
         Cnf(96 / rd, 5, 576 / rd, 96 / rd, true, "HS", 1, dil, w),
         Cnf(96 / rd, 5, 576 / rd, 96 / rd, true, "HS", 1, dil, w)};
    last_channel = Cnf::adjust_channels(1024 / rd, w);  // C5
  }
  return detail::build_as<MobileNetV3>(o.weights, [&] {
    return std::make_shared<MobileNetV3>(s, last_channel, o.num_classes, o.norm_layer, o.dropout);
  });
}
}  // namespace

std::shared_ptr<MobileNetV3> mobilenet_v3_large(const MobileNetV3Options& o) {
  return build_v3(true, o);
}
std::shared_ptr<MobileNetV3> mobilenet_v3_small(const MobileNetV3Options& o) {
  return build_v3(false, o);
}

}  // namespace accel::vision::models
