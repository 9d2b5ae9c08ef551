// torchvision.ops' building blocks of the model zoo (torchvision 0.14, ops/misc.py and
// ops/stochastic_depth.py): the same classes, arguments, defaults and child names, so the models
// built from them have torchvision's parameter names.
//
// torchvision passes layers as callables (`norm_layer=partial(nn.BatchNorm2d, eps=0.001)`,
// `activation_layer=nn.Hardswish`); here they are factories: a NormLayer makes the norm of a
// given channel count, an ActivationLayer makes an activation. An empty factory is torchvision's
// None (no such layer).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "core/generator.h"

namespace accel::vision::ops {

using NormLayer = std::function<std::shared_ptr<nn::Module>(int64_t channels)>;
using ActivationLayer = std::function<std::shared_ptr<nn::Module>()>;

// partial(nn.BatchNorm2d, eps=eps, momentum=momentum).
NormLayer batch_norm2d(double eps = 1e-5, std::optional<double> momentum = 0.1);
// nn.LayerNorm(channels, eps=eps) (ViT's norm_layer is partial(nn.LayerNorm, eps=1e-6)).
NormLayer layer_norm(double eps = 1e-5);
// An activation module M built as M(inplace): activation<nn::ReLU>(true) is
// partial(nn.ReLU, inplace=True).
template <typename M>
ActivationLayer activation(bool inplace = false) {
  return [inplace] { return std::make_shared<M>(inplace); };
}
// The parameter-free activations without an inplace argument (nn.GELU, nn.Sigmoid, nn.Tanh).
template <typename M>
ActivationLayer activation_without_inplace() {
  return [] { return std::make_shared<M>(); };
}

// torchvision.ops.Conv2dNormActivation(in_channels, out_channels, kernel_size=3, stride=1,
// padding=None, groups=1, norm_layer=BatchNorm2d, activation_layer=ReLU, dilation=1,
// inplace=True, bias=None): a Sequential of the convolution ("0"), the norm ("1") and the
// activation (next index), the norm and the activation left out when their factory is empty.
// padding None is (kernel_size - 1) / 2 * dilation per dim; bias None is "no norm layer". The
// activation factory decides inplace (the default is ReLU(inplace=True), torchvision's).
class Conv2dNormActivation : public nn::Sequential {
 public:
  Conv2dNormActivation(int64_t in_channels, int64_t out_channels, nn::Size2 kernel_size = 3,
                       nn::Size2 stride = 1, std::optional<nn::Size2> padding = std::nullopt,
                       int64_t groups = 1, NormLayer norm_layer = batch_norm2d(),
                       ActivationLayer activation_layer = activation<nn::ReLU>(true),
                       nn::Size2 dilation = 1, std::optional<bool> bias = std::nullopt);
  int64_t out_channels;
};

// torchvision.ops.SqueezeExcitation(input_channels, squeeze_channels, activation=ReLU,
// scale_activation=Sigmoid): x * scale_activation(fc2(activation(fc1(avgpool(x))))), fc1 and fc2
// 1x1 convolutions with bias; x (N, C, H, W), the scale (N, C, 1, 1).
class SqueezeExcitation : public nn::Module {
 public:
  SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels,
                    ActivationLayer activation = ops::activation<nn::ReLU>(),
                    ActivationLayer scale_activation = activation_without_inplace<nn::Sigmoid>());
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::AdaptiveAvgPool2d> avgpool;
  nn::Child<nn::Conv2d> fc1, fc2;
  nn::Child<nn::Module> activation, scale_activation;
};

// torchvision.ops.MLP(in_channels, hidden_channels, norm_layer=None, activation_layer=ReLU,
// inplace=True, bias=True, dropout=0.0): per hidden size but the last, Linear, the norm (when
// given), the activation and Dropout; then Linear to the last size and Dropout. Entries are
// numbered as torchvision's ("0", "1", ...). The activation factory decides inplace;
// dropout_inplace is torchvision's `inplace` for the Dropout layers (ViT's MLPBlock passes
// inplace=None: false).
class MLP : public nn::Sequential {
 public:
  MLP(int64_t in_channels, const std::vector<int64_t>& hidden_channels, NormLayer norm_layer = {},
      ActivationLayer activation_layer = activation<nn::ReLU>(true), bool dropout_inplace = true,
      bool bias = true, double dropout = 0.0);
};

// torchvision.ops.stochastic_depth(input, p, mode, training=True): in training, zeroes the whole
// input ("batch") or each row along dim 0 ("row") with probability p and scales the kept ones by
// 1 / (1 - p); the identity in evaluation or with p = 0. The keep draws are rand() < 1 - p from
// `gen` (the default generator when null), one per row or one in all. ValueError for p outside
// [0, 1] or another mode, as torchvision's.
Tensor stochastic_depth(const Tensor& input, double p, const std::string& mode,
                        bool training = true, Generator* gen = nullptr);

// torchvision.ops.StochasticDepth(p, mode): stochastic_depth in the module's training mode.
class StochasticDepth : public nn::Module {
 public:
  StochasticDepth(double p, std::string mode, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
  std::string mode;

 private:
  Generator* gen_;
};

}  // namespace accel::vision::ops
