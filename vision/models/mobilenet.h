// MobileNetV2 and MobileNetV3 (torchvision.models.mobilenetv2 / mobilenetv3, torchvision 0.14):
// mobilenet_v2, mobilenet_v3_small, mobilenet_v3_large with torchvision's `features` (numbered
// Sequential of Conv2dNormActivation and InvertedResidual blocks), `classifier` and parameter
// names, so a torchvision state dict loads strictly.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/conv.h"
#include "vision/ops/misc.h"

namespace accel::vision::models {

// torchvision's _make_divisible(v, divisor, min_value): v rounded to the nearest multiple of
// divisor, at least min_value (divisor when 0), and not below 0.9 v.
int64_t make_divisible(double v, int64_t divisor, int64_t min_value = 0);

// ---------------- MobileNetV2 ----------------

namespace mobilenetv2 {
// torchvision's mobilenetv2.InvertedResidual(inp, oup, stride, expand_ratio, norm_layer): `conv`
// is a Sequential of the 1x1 expansion (when expand_ratio != 1), the 3x3 depthwise
// Conv2dNormActivation (ReLU6), the 1x1 projection and its norm; x + conv(x) when stride is 1
// and inp == oup.
class InvertedResidual : public nn::Module {
 public:
  InvertedResidual(int64_t inp, int64_t oup, int64_t stride, double expand_ratio,
                   ops::NormLayer norm_layer = {});
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> conv;
  int64_t stride, out_channels;
  bool use_res_connect;
};
}  // namespace mobilenetv2

struct MobileNetV2Options {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  double width_mult = 1.0;
  // Rows {t (expansion), c (channels), n (blocks), s (stride of the first)}; empty: torchvision's.
  std::vector<std::array<int64_t, 4>> inverted_residual_setting = {};
  int64_t round_nearest = 8;
  ops::NormLayer norm_layer = {};  // empty: BatchNorm2d
  double dropout = 0.2;
};

// torchvision.models.MobileNetV2. x (N, 3, H, W) -> (N, num_classes).
class MobileNetV2 : public nn::Module {
 public:
  explicit MobileNetV2(const MobileNetV2Options& options = {});
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> features;
  nn::Child<nn::Sequential> classifier;  // 0 Dropout, 1 Linear(last_channel, num_classes)
  int64_t last_channel;
};

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& options = {});

// ---------------- MobileNetV3 ----------------

namespace mobilenetv3 {
// torchvision's InvertedResidualConfig(input_channels, kernel, expanded_channels, out_channels,
// use_se, activation "RE" | "HS", stride, dilation, width_mult): channels adjusted by width_mult
// (make_divisible(c * width_mult, 8)).
struct InvertedResidualConfig {
  InvertedResidualConfig(int64_t input_channels, int64_t kernel, int64_t expanded_channels,
                         int64_t out_channels, bool use_se, const std::string& activation,
                         int64_t stride, int64_t dilation, double width_mult);
  static int64_t adjust_channels(int64_t channels, double width_mult);
  int64_t input_channels, kernel, expanded_channels, out_channels;
  bool use_se, use_hs;
  int64_t stride, dilation;
};

// torchvision's mobilenetv3.InvertedResidual(cnf, norm_layer): `block` is a Sequential of the
// expansion (when the channels change), the depthwise conv, SqueezeExcitation (Hardsigmoid
// scale, when use_se) and the projection; plus the input when stride 1 and channels match.
class InvertedResidual : public nn::Module {
 public:
  InvertedResidual(const InvertedResidualConfig& cnf, ops::NormLayer norm_layer);
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> block;
  int64_t out_channels;
  bool use_res_connect;
};
}  // namespace mobilenetv3

struct MobileNetV3Options {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  double width_mult = 1.0;
  bool reduced_tail = false;       // halves the channels of the last blocks
  bool dilated = false;            // dilation 2 in the last blocks
  ops::NormLayer norm_layer = {};  // empty: BatchNorm2d(eps=0.001, momentum=0.01)
  double dropout = 0.2;
};

// torchvision.models.MobileNetV3(inverted_residual_setting, last_channel, num_classes,
// norm_layer, dropout). x (N, 3, H, W) -> (N, num_classes).
class MobileNetV3 : public nn::Module {
 public:
  MobileNetV3(const std::vector<mobilenetv3::InvertedResidualConfig>& inverted_residual_setting,
              int64_t last_channel, int64_t num_classes = 1000, ops::NormLayer norm_layer = {},
              double dropout = 0.2);
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> features;
  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  // 0 Linear, 1 Hardswish, 2 Dropout, 3 Linear(last_channel, num_classes)
  nn::Child<nn::Sequential> classifier;
};

std::shared_ptr<MobileNetV3> mobilenet_v3_large(const MobileNetV3Options& options = {});
std::shared_ptr<MobileNetV3> mobilenet_v3_small(const MobileNetV3Options& options = {});

}  // namespace accel::vision::models
