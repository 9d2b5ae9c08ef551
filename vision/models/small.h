// AlexNet and SqueezeNet (torchvision.models.alexnet / squeezenet, torchvision 0.14): alexnet,
// squeezenet1_0, squeezenet1_1 with torchvision's `features` / `classifier` Sequentials,
// parameter names and initialisation, so a torchvision state dict loads strictly.
#pragma once

#include <memory>
#include <string>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"

namespace accel::vision::models {

struct AlexNetOptions {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  double dropout = 0.5;
};

// torchvision.models.AlexNet(num_classes, dropout): features (0 Conv 11x11/4, 1 ReLU, 2 MaxPool,
// 3 Conv 5x5, 4 ReLU, 5 MaxPool, 6 / 8 / 10 Conv 3x3, 12 MaxPool), avgpool to 6x6, classifier
// (0 Dropout, 1 Linear(9216, 4096), 2 ReLU, 3 Dropout, 4 Linear, 5 ReLU, 6 Linear). The layers'
// default initialisation, as torchvision. x (N, 3, H, W), H, W >= 63 -> (N, num_classes).
class AlexNet : public nn::Module {
 public:
  explicit AlexNet(const AlexNetOptions& options = {});
  Tensor forward(const Tensor& x) override;
  nn::Child<nn::Sequential> features;
  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  nn::Child<nn::Sequential> classifier;
};

std::shared_ptr<AlexNet> alexnet(const AlexNetOptions& options = {});

// torchvision's Fire(inplanes, squeeze_planes, expand1x1_planes, expand3x3_planes):
// s = relu(squeeze(x)); cat([relu(expand1x1(s)), relu(expand3x3(s))], channels).
class Fire : public nn::Module {
 public:
  Fire(int64_t inplanes, int64_t squeeze_planes, int64_t expand1x1_planes,
       int64_t expand3x3_planes);
  Tensor forward(const Tensor& x) override;
  int64_t inplanes;
  nn::Child<nn::Conv2d> squeeze;
  nn::Child<nn::ReLU> squeeze_activation;
  nn::Child<nn::Conv2d> expand1x1;
  nn::Child<nn::ReLU> expand1x1_activation;
  nn::Child<nn::Conv2d> expand3x3;
  nn::Child<nn::ReLU> expand3x3_activation;
};

struct SqueezeNetOptions {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  double dropout = 0.5;
};

// torchvision.models.SqueezeNet(version "1_0" | "1_1", num_classes, dropout): features (convs,
// ceil-mode max pools, Fire modules), classifier (0 Dropout, 1 final 1x1 Conv to num_classes,
// 2 ReLU, 3 AdaptiveAvgPool2d(1)). Convolutions Kaiming-uniform (the final one N(0, 0.01)),
// zero biases. x (N, 3, H, W) -> (N, num_classes).
class SqueezeNet : public nn::Module {
 public:
  explicit SqueezeNet(const std::string& version = "1_0", const SqueezeNetOptions& options = {});
  Tensor forward(const Tensor& x) override;
  int64_t num_classes;
  nn::Child<nn::Sequential> features;
  nn::Child<nn::Sequential> classifier;
};

std::shared_ptr<SqueezeNet> squeezenet1_0(const SqueezeNetOptions& options = {});
std::shared_ptr<SqueezeNet> squeezenet1_1(const SqueezeNetOptions& options = {});

}  // namespace accel::vision::models
