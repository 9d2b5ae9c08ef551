// VGG (torchvision.models.vgg, torchvision 0.14): vgg11, vgg11_bn, vgg16, vgg16_bn with
// torchvision's `features` (numbered Sequential), `avgpool` (7x7) and `classifier` (numbered
// Sequential: 0 Linear, 1 ReLU, 2 Dropout, 3 Linear, 4 ReLU, 5 Dropout, 6 Linear), so a
// torchvision state dict loads strictly and `model->classifier->set(6, ...)` replaces the head as
// `model.classifier[6] = ...` does. fast_neural_style uses `vgg16()->features` alone.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/conv.h"

namespace accel::vision::models {

struct VGGOptions {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  // torchvision's init (Kaiming-normal fan_out convolutions, N(0, 0.01) Linear, zero biases);
  // false keeps the layers' default initialisation.
  bool init_weights = true;
  double dropout = 0.5;
};

// torchvision's make_layers(cfg, batch_norm): cfg entries are output channels (a 3x3 conv with
// padding 1, then BatchNorm2d when batch_norm, then ReLU(inplace)) or -1 for MaxPool2d(2, 2)
// (torchvision's "M").
std::shared_ptr<nn::Sequential> make_vgg_layers(const std::vector<int64_t>& cfg, bool batch_norm);

// torchvision.models.VGG(features, num_classes, init_weights, dropout). x (N, 3, H, W), H and W
// at least 32 (five 2x2 pools) -> (N, num_classes).
class VGG : public nn::Module {
 public:
  VGG(std::shared_ptr<nn::Sequential> features, const VGGOptions& options = {});
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::Sequential> features;
  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  nn::Child<nn::Sequential> classifier;
};

std::shared_ptr<VGG> vgg11(const VGGOptions& options = {});
std::shared_ptr<VGG> vgg11_bn(const VGGOptions& options = {});
std::shared_ptr<VGG> vgg16(const VGGOptions& options = {});
std::shared_ptr<VGG> vgg16_bn(const VGGOptions& options = {});

}  // namespace accel::vision::models
