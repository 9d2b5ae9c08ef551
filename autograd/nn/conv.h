// Conv2d and 2-D pooling modules (NCHW).
//
// Conv2d initialisation is PyTorch's default: weight Kaiming-uniform with a = sqrt(5), bias
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels / groups * kH * kW.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

#include "autograd/nn/module.h"
#include "core/generator.h"

namespace accel::nn {

// A 2-D size given as one number (3 -> 3x3) or a pair ({3, 5}).
struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, like PyTorch's int-or-tuple
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  Shape shape() const { return Shape{h, w}; }
  std::string str() const;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1, bool bias = true,
         Generator* gen = nullptr);
  // x: (N, C_in, H, W) -> (N, C_out, H_out, W_out)
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, dilation;
  int64_t groups;
  Tensor weight;  // (C_out, C_in / groups, kH, kW)
  Tensor bias;    // (C_out); undefined without bias
};

class MaxPool2d : public Module {
 public:
  // stride defaults to kernel_size.
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Size2 kernel_size, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Size2 kernel_size, stride, padding;
  bool count_include_pad;
};

}  // namespace accel::nn
