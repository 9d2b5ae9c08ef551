// Conv2d and 2-D pooling modules (NCHW).
//
// Conv2d initialisation is PyTorch's default: weight Kaiming-uniform with a = sqrt(5), bias
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels / groups * kH * kW.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include "nn/conv_options.h"
#include "nn/module.h"
#include "core/generator.h"

namespace accel::nn {

// Every module here takes its positional arguments in torch's order, or its options
// (nn/conv_options.h, libtorch's spelling): nn::Conv2d(nn::Conv2dOptions(1, 64,
// 5).bias(false)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1, bool bias = true,
         Generator* gen = nullptr);
  explicit Conv2d(const Conv2dFields& options, Generator* gen = nullptr);
  // x: (N, C_in, H, W) -> (N, C_out, H_out, W_out)
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, dilation;
  int64_t groups;
  Parameter weight;  // (C_out, C_in / groups, kH, kW)
  Parameter bias;    // (C_out); None without bias
  // "zeros", or "reflect" / "replicate" / "circular": the input padded by pad() with that mode,
  // then convolved without padding (torch's _conv_forward).
  std::string padding_mode = "zeros";
};

class MaxPool2d : public Module {
 public:
  // stride defaults to kernel_size.
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0);
  // Options as libtorch's class, not the aggregate (Note [options structs]); the only way to
  // ask for ceil_mode: nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true)).
  explicit MaxPool2d(const MaxPool2dOptions& options);
  // MaxPool2d({2, 2}): the kernel size (without it, {2, 2} would also read as kernel 2, stride 2).
  explicit MaxPool2d(std::initializer_list<int64_t> kernel_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Size2 kernel_size, stride, padding;
  Size2 dilation = 1;  // 1 only
  bool ceil_mode = false;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, bool count_include_pad = true);
  explicit AvgPool2d(const AvgPool2dOptions& options);             // as MaxPool2d's
  explicit AvgPool2d(std::initializer_list<int64_t> kernel_size);  // AvgPool2d({2, 2})
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Size2 kernel_size, stride, padding;
  bool count_include_pad;
};

// ---------------- transposed and 1-D convolutions ----------------

// torch.nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=1, padding=0,
// output_padding=0, groups=1, bias=True, dilation=1): the same arguments in the same order.
// x: (N, C_in, H, W) -> (N, C_out, H_out, W_out),
// H_out = (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1.
// weight: (C_in, C_out / groups, kH, kW), bias: (C_out). Init as torch: Kaiming-uniform with
// a = sqrt(5) over fan_in = weight.size(1) kH kW = C_out / groups kH kW (torch computes it from
// the weight tensor, whose dim 1 is C_out / groups here), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
                  Size2 padding = 0, Size2 output_padding = 0, int64_t groups = 1, bool bias = true,
                  Size2 dilation = 1, Generator* gen = nullptr);
  explicit ConvTranspose2d(const ConvTranspose2dFields& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // torch's forward(input, output_size): output_size (H_out, W_out) (or with leading N, C_out)
  // picks output_padding = output_size - the smallest output; it must stay below the stride.
  Tensor forward(const Tensor& x, const Shape& output_size);
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, output_padding;
  int64_t groups;
  Size2 dilation;
  Parameter weight;  // (C_in, C_out / groups, kH, kW)
  Parameter bias;    // (C_out); undefined without bias
};

// torch.nn.Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
// groups=1, bias=True, padding_mode='zeros') (numeric padding only, not 'same' / 'valid'). x: (N,
// C_in, L) or (C_in, L) -> (N, C_out, L_out), L_out = (L + 2 padding - dilation (k - 1) - 1) /
// stride + 1. weight (C_out, C_in / groups, k), bias (C_out); init as Conv2d with fan_in = C_in /
// groups k.
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1, bool bias = true,
         Generator* gen = nullptr);
  explicit Conv1d(const Conv1dFields& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels, kernel_size, stride, padding, dilation, groups;
  Parameter weight;                    // (C_out, C_in / groups, k)
  Parameter bias;                      // (C_out)
  std::string padding_mode = "zeros";  // as Conv2d's
};

// torch.nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=1, padding=0,
// output_padding=0, groups=1, bias=True, dilation=1). weight (C_in, C_out / groups, k); init as
// ConvTranspose2d.
class ConvTranspose1d : public Module {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  int64_t stride = 1, int64_t padding = 0, int64_t output_padding = 0,
                  int64_t groups = 1, bool bias = true, int64_t dilation = 1,
                  Generator* gen = nullptr);
  explicit ConvTranspose1d(const ConvTranspose1dFields& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, dilation;
  Parameter weight;  // (C_in, C_out / groups, k)
  Parameter bias;    // (C_out)
};

// torch.nn.AdaptiveAvgPool2d(output_size) / AdaptiveMaxPool2d(output_size, return_indices=False):
// x (N, C, H, W) or (C, H, W) -> (..., oh, ow); window i spans
// [floor(i H / oh), ceil((i + 1) H / oh)). return_indices: forward_with_indices() returns the
// flat h * W + w index of each maximum (forward() the values, as a Module must return one tensor).
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Size2 output_size;
};

class AdaptiveMaxPool2d : public Module {
 public:
  explicit AdaptiveMaxPool2d(Size2 output_size, bool return_indices = false);
  // AdaptiveMaxPool2d({5, 7}): the output size, not (5, return_indices = true).
  explicit AdaptiveMaxPool2d(std::initializer_list<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& x);
  std::string extra_repr() const override;
  Size2 output_size;
  bool return_indices;
};

}  // namespace accel::nn
