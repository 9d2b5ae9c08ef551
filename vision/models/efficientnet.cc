#include "vision/models/efficientnet.h"

#include <cmath>

#include "nn/activation.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "vision/models/mobilenet.h"
#include "vision/models/model_init.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

MBConvConfig::MBConvConfig(double expand_ratio_, int64_t kernel_, int64_t stride_,
                           int64_t input_channels_, int64_t out_channels_, int64_t num_layers_,
                           double width_mult, double depth_mult)
    : expand_ratio(expand_ratio_),
      kernel(kernel_),
      stride(stride_),
      input_channels(adjust_channels(input_channels_, width_mult)),
      out_channels(adjust_channels(out_channels_, width_mult)),
      num_layers(int64_t(std::ceil(double(num_layers_) * depth_mult))) {}

int64_t MBConvConfig::adjust_channels(int64_t channels, double width_mult, int64_t min_value) {
  return make_divisible(double(channels) * width_mult, 8, min_value);
}

MBConv::MBConv(const MBConvConfig& cnf, double stochastic_depth_prob, ops::NormLayer norm_layer)
    : out_channels(cnf.out_channels) {
  ACCEL_CHECK(cnf.stride == 1 || cnf.stride == 2, ValueError, "MBConv", "illegal stride value ",
              cnf.stride);
  use_res_connect = cnf.stride == 1 && cnf.input_channels == cnf.out_channels;
  const auto silu = ops::activation<nn::SiLU>(true);
  auto layers = std::make_shared<nn::Sequential>();
  const int64_t expanded = MBConvConfig::adjust_channels(cnf.input_channels, cnf.expand_ratio);
  if (expanded != cnf.input_channels) {
    layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
        cnf.input_channels, expanded, 1, 1, std::nullopt, 1, norm_layer, silu));
  }
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      expanded, expanded, cnf.kernel, cnf.stride, std::nullopt, expanded, norm_layer, silu));
  const int64_t squeeze_channels = std::max<int64_t>(1, cnf.input_channels / 4);
  layers->push_back(std::make_shared<ops::SqueezeExcitation>(
      expanded, squeeze_channels, silu, ops::activation_without_inplace<nn::Sigmoid>()));
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      expanded, cnf.out_channels, 1, 1, std::nullopt, 1, norm_layer, nullptr));
  block = register_module("block", layers);
  stochastic_depth = register_module(
      "stochastic_depth", std::make_shared<ops::StochasticDepth>(stochastic_depth_prob, "row"));
}

Tensor MBConv::forward(const Tensor& x) {
  Tensor result = (*block)(x);
  if (use_res_connect) result = add((*stochastic_depth)(result), x);
  return result;
}

EfficientNet::EfficientNet(const std::vector<MBConvConfig>& setting, double dropout,
                           double stochastic_depth_prob, int64_t num_classes,
                           ops::NormLayer norm_layer, int64_t last_channel) {
  const char* op = "EfficientNet";
  ACCEL_CHECK(!setting.empty(), ValueError, op,
              "the inverted_residual_setting should not be empty");
  ACCEL_CHECK(num_classes >= 1, ValueError, op, "num_classes must be positive, got ", num_classes);
  if (!norm_layer) norm_layer = ops::batch_norm2d();
  const auto silu = ops::activation<nn::SiLU>(true);
  auto layers = std::make_shared<nn::Sequential>();
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      3, setting.front().input_channels, 3, 2, std::nullopt, 1, norm_layer, silu));
  int64_t total_stage_blocks = 0;
  for (const auto& cnf : setting) total_stage_blocks += cnf.num_layers;
  int64_t stage_block_id = 0;
  for (const auto& cnf : setting) {
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < cnf.num_layers; ++i) {
      MBConvConfig block_cnf = cnf;
      if (!stage->empty()) {  // later blocks of a stage keep its output channels and stride 1
        block_cnf.input_channels = block_cnf.out_channels;
        block_cnf.stride = 1;
      }
      const double sd_prob =
          stochastic_depth_prob * double(stage_block_id) / double(total_stage_blocks);
      stage->push_back(std::make_shared<MBConv>(block_cnf, sd_prob, norm_layer));
      ++stage_block_id;
    }
    layers->push_back(stage);
  }
  const int64_t lastconv_input = setting.back().out_channels;
  const int64_t lastconv_output = last_channel > 0 ? last_channel : 4 * lastconv_input;
  layers->push_back(std::make_shared<ops::Conv2dNormActivation>(
      lastconv_input, lastconv_output, 1, 1, std::nullopt, 1, norm_layer, silu));
  features = register_module("features", layers);
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Dropout>(dropout, /*inplace=*/true),
                                       std::make_shared<nn::Linear>(lastconv_output, num_classes)));
  detail::init_convs_kaiming_fan_out(*this);
  detail::init_norms(*this);
  // Linear: U(-1/sqrt(out_features), 1/sqrt(out_features)), zero bias.
  for (auto& [name, m] : named_modules()) {
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      const double range = 1.0 / std::sqrt(double(lin->out_features));
      nn::init::uniform_(lin->weight, -range, range);
      nn::init::zeros_(lin->bias);
    }
  }
}

Tensor EfficientNet::forward(const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, "EfficientNet",
              "expected an input (N, 3, H, W), got ", x.defined() ? x.sizes() : Shape{});
  Tensor h = (*avgpool)((*features)(x)).flatten(1);
  return (*classifier)(h);
}

std::shared_ptr<EfficientNet> efficientnet_b0(const EfficientNetOptions& o) {
  // _efficientnet_conf("efficientnet_b0", width_mult=1.0, depth_mult=1.0), dropout 0.2.
  const double w = 1.0, d = 1.0;
  const std::vector<MBConvConfig> setting = {
      MBConvConfig(1, 3, 1, 32, 16, 1, w, d),  MBConvConfig(6, 3, 2, 16, 24, 2, w, d),
      MBConvConfig(6, 5, 2, 24, 40, 2, w, d),  MBConvConfig(6, 3, 2, 40, 80, 3, w, d),
      MBConvConfig(6, 5, 1, 80, 112, 3, w, d), MBConvConfig(6, 5, 2, 112, 192, 4, w, d),
      MBConvConfig(6, 3, 1, 192, 320, 1, w, d)};
  return detail::build_as<EfficientNet>(o.weights, [&] {
    return std::make_shared<EfficientNet>(setting, 0.2, o.stochastic_depth_prob, o.num_classes,
                                          o.norm_layer);
  });
}

}  // namespace accel::vision::models
