// ResNet (torchvision.models.resnet, torchvision 0.14): resnet18 / 34 / 50 / 101 with torchvision's
// architecture, parameter and buffer names (conv1, bn1, layer1.0.conv1, ..., fc) and
// initialisation, so a torchvision state dict loads strictly:
//
//   auto net = vision::models::resnet18({.num_classes = 10});
//   auto pre = vision::models::resnet18({.weights = "resnet18.safetensors"});   // 1000 classes
//   pre->fc = std::make_shared<nn::Linear>(512, 2);   // torchvision's model.fc = nn.Linear(512, 2)
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "vision/ops/misc.h"

namespace accel::vision::models {

// torchvision's resnet builders' arguments: weights, then ResNet's keyword arguments.
struct ResNetOptions {
  // A state-dict file loaded strictly after construction (vision/models/weights.h); empty: none,
  // torchvision's initialisation.
  std::string weights = {};
  int64_t num_classes = 1000;
  // The last BatchNorm of each residual branch starts at zero (bn2 / bn3 weight).
  bool zero_init_residual = false;
  int64_t groups = 1;
  int64_t width_per_group = 64;
  // Layers 2-4 with dilation instead of stride (Bottleneck only, as torchvision).
  std::array<bool, 3> replace_stride_with_dilation = {false, false, false};
  ops::NormLayer norm_layer = {};  // empty: nn::BatchNorm2d
};

// torchvision's BasicBlock (resnet18 / 34): relu(bn2(conv2(relu(bn1(conv1(x))))) + identity),
// identity = downsample(x) when set. expansion 1.
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride = 1,
             std::shared_ptr<nn::Module> downsample = nullptr, int64_t groups = 1,
             int64_t base_width = 64, int64_t dilation = 1, ops::NormLayer norm_layer = {});
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::Conv2d> conv1;
  nn::Child<nn::Module> bn1;
  nn::Child<nn::ReLU> relu;
  nn::Child<nn::Conv2d> conv2;
  nn::Child<nn::Module> bn2;
  nn::Child<nn::Module> downsample;  // None when the shapes match
  int64_t stride;
};

// torchvision's Bottleneck (resnet50 / 101): 1x1 -> 3x3 (stride, groups, dilation) -> 1x1 to
// planes * 4, each with its norm, plus the identity. expansion 4.
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride = 1,
             std::shared_ptr<nn::Module> downsample = nullptr, int64_t groups = 1,
             int64_t base_width = 64, int64_t dilation = 1, ops::NormLayer norm_layer = {});
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::Conv2d> conv1;
  nn::Child<nn::Module> bn1;
  nn::Child<nn::Conv2d> conv2;
  nn::Child<nn::Module> bn2;
  nn::Child<nn::Conv2d> conv3;
  nn::Child<nn::Module> bn3;
  nn::Child<nn::ReLU> relu;
  nn::Child<nn::Module> downsample;
  int64_t stride;
};

enum class ResNetBlock { Basic, Bottleneck };

// torchvision.models.ResNet(block, layers, num_classes, zero_init_residual, groups,
// width_per_group, replace_stride_with_dilation, norm_layer). x (N, 3, H, W) -> (N, num_classes);
// any H, W >= 1 (the stem and the four stages divide them by 32, rounding up, then average).
class ResNet : public nn::Module {
 public:
  ResNet(ResNetBlock block, const std::vector<int64_t>& layers, const ResNetOptions& options = {});
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::Conv2d> conv1;
  nn::Child<nn::Module> bn1;
  nn::Child<nn::ReLU> relu;
  nn::Child<nn::MaxPool2d> maxpool;
  nn::Child<nn::Sequential> layer1, layer2, layer3, layer4;
  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  // nn.Linear(512 * expansion, num_classes); any module may replace it (a Sequential head).
  nn::Child<nn::Module> fc;

 private:
  std::shared_ptr<nn::Sequential> make_layer(ResNetBlock block, int64_t planes, int64_t blocks,
                                             int64_t stride, bool dilate);
  ops::NormLayer norm_layer_;
  int64_t inplanes_ = 64, dilation_ = 1, groups_, base_width_;
};

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options = {});

}  // namespace accel::vision::models
