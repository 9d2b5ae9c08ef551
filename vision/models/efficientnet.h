// EfficientNet (torchvision.models.efficientnet, torchvision 0.14): efficientnet_b0 with
// torchvision's `features` (stem, seven stages of MBConv blocks, head conv), `avgpool`,
// `classifier` (0 Dropout, 1 Linear), parameter names and initialisation, so a torchvision state
// dict loads strictly. Stochastic depth on the residual branches in training, as torchvision's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/conv.h"
#include "vision/ops/misc.h"

namespace accel::vision::models {

// torchvision's MBConvConfig(expand_ratio, kernel, stride, input_channels, out_channels,
// num_layers, width_mult, depth_mult): channels make_divisible(c * width_mult, 8), layers
// ceil(n * depth_mult).
struct MBConvConfig {
  MBConvConfig(double expand_ratio, int64_t kernel, int64_t stride, int64_t input_channels,
               int64_t out_channels, int64_t num_layers, double width_mult = 1.0,
               double depth_mult = 1.0);
  static int64_t adjust_channels(int64_t channels, double width_mult, int64_t min_value = 0);
  double expand_ratio;
  int64_t kernel, stride, input_channels, out_channels, num_layers;
};

// torchvision's MBConv(cnf, stochastic_depth_prob, norm_layer): `block` is a Sequential of the
// 1x1 expansion (SiLU, when the expanded channels differ), the depthwise conv (SiLU), a
// SqueezeExcitation (SiLU, Sigmoid; squeeze max(1, input_channels / 4)) and the 1x1 projection;
// with a residual (stride 1, equal channels): stochastic_depth(block(x)) + x.
class MBConv : public nn::Module {
 public:
  MBConv(const MBConvConfig& cnf, double stochastic_depth_prob, ops::NormLayer norm_layer);
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> block;
  nn::Child<ops::StochasticDepth> stochastic_depth;
  int64_t out_channels;
  bool use_res_connect;
};

struct EfficientNetOptions {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  // Block i of all n drops its branch with probability stochastic_depth_prob * i / n in training.
  double stochastic_depth_prob = 0.2;
  ops::NormLayer norm_layer = {};  // empty: BatchNorm2d
};

// torchvision.models.EfficientNet(inverted_residual_setting, dropout, stochastic_depth_prob,
// num_classes, norm_layer, last_channel). x (N, 3, H, W) -> (N, num_classes).
class EfficientNet : public nn::Module {
 public:
  EfficientNet(const std::vector<MBConvConfig>& inverted_residual_setting, double dropout,
               double stochastic_depth_prob = 0.2, int64_t num_classes = 1000,
               ops::NormLayer norm_layer = {}, int64_t last_channel = 0 /* 4x the last stage */);
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> features;
  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  nn::Child<nn::Sequential> classifier;
};

std::shared_ptr<EfficientNet> efficientnet_b0(const EfficientNetOptions& options = {});

}  // namespace accel::vision::models
