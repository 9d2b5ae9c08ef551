// Options of the convolution and pooling modules in libtorch's spelling (Note [options structs]
// in autograd/options.h):
//   nn::Conv2d(nn::Conv2dOptions(1, 64, 5).stride(2).padding(2).bias(false))
//   nn::Conv2d(nn::Conv2dOptions(3, 16, {3, 5}).padding({1, 2}).padding_mode("reflect"))
//   nn::MaxPool2d(nn::MaxPool2dOptions({2, 2}).stride(2))
//   nn::Conv2d({.in_channels = 1, .out_channels = 64, .kernel_size = 5, .bias = false})
//   nn::MaxPool2d({2, 2})  (the pools take the options class, Note [options structs])
// A 2-D size (kernel_size, stride, padding, dilation, output_padding) is a Size2: one number or
// a braced pair, as libtorch's ExpandingArray<2> (`5` is {5, 5}); a 1-D size is one number
// (`{5}` converts too). Fields, defaults and order are torch's. padding_mode is "zeros" (the
// default), "reflect", "replicate" or "circular" (Conv1d / Conv2d; the transposed convolutions
// take "zeros" only, as torch).
#pragma once

#include <optional>
#include <string>

#include "autograd/options.h"
#include "core/shape.h"

namespace accel::nn {

// A 2-D size given as one number (3 -> 3x3) or a pair ({3, 5}), libtorch's ExpandingArray<2>.
// Default (0, 0): an unset required size, which the modules refuse.
struct Size2 {
  int64_t h = 0, w = 0;
  Size2() = default;
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, like PyTorch's int-or-tuple
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  Shape shape() const { return Shape{h, w}; }
  std::string str() const;
};

// ---- convolutions ----

struct Conv2dFields {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Size2 kernel_size = 0;  // required (0: unset, refused)
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  std::string padding_mode = "zeros";
};
struct Conv2dOptions : Conv2dFields {
  using Fields = Conv2dFields;
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size) {
    Fields::in_channels = in_channels;
    Fields::out_channels = out_channels;
    Fields::kernel_size = kernel_size;
  }
  ACCEL_OPTIONS_FROM_FIELDS(Conv2dOptions)
  ACCEL_OPTION(in_channels)
  ACCEL_OPTION(out_channels)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(dilation)
  ACCEL_OPTION(groups)
  ACCEL_OPTION(bias)
  ACCEL_OPTION(padding_mode)
};

struct Conv1dFields {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_size = 0;  // required (0: unset, refused)
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  std::string padding_mode = "zeros";
};
struct Conv1dOptions : Conv1dFields {
  using Fields = Conv1dFields;
  Conv1dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size) {
    Fields::in_channels = in_channels;
    Fields::out_channels = out_channels;
    Fields::kernel_size = kernel_size;
  }
  ACCEL_OPTIONS_FROM_FIELDS(Conv1dOptions)
  ACCEL_OPTION(in_channels)
  ACCEL_OPTION(out_channels)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(dilation)
  ACCEL_OPTION(groups)
  ACCEL_OPTION(bias)
  ACCEL_OPTION(padding_mode)
};

// torch's order: output_padding, groups, bias, dilation.
struct ConvTranspose2dFields {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Size2 kernel_size;  // required
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
  std::string padding_mode = "zeros";
};
struct ConvTranspose2dOptions : ConvTranspose2dFields {
  using Fields = ConvTranspose2dFields;
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size) {
    Fields::in_channels = in_channels;
    Fields::out_channels = out_channels;
    Fields::kernel_size = kernel_size;
  }
  ACCEL_OPTIONS_FROM_FIELDS(ConvTranspose2dOptions)
  ACCEL_OPTION(in_channels)
  ACCEL_OPTION(out_channels)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(output_padding)
  ACCEL_OPTION(groups)
  ACCEL_OPTION(bias)
  ACCEL_OPTION(dilation)
  ACCEL_OPTION(padding_mode)
};

struct ConvTranspose1dFields {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_size = 0;  // required (0: unset, refused)
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  int64_t dilation = 1;
  std::string padding_mode = "zeros";
};
struct ConvTranspose1dOptions : ConvTranspose1dFields {
  using Fields = ConvTranspose1dFields;
  ConvTranspose1dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size) {
    Fields::in_channels = in_channels;
    Fields::out_channels = out_channels;
    Fields::kernel_size = kernel_size;
  }
  ACCEL_OPTIONS_FROM_FIELDS(ConvTranspose1dOptions)
  ACCEL_OPTION(in_channels)
  ACCEL_OPTION(out_channels)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(output_padding)
  ACCEL_OPTION(groups)
  ACCEL_OPTION(bias)
  ACCEL_OPTION(dilation)
  ACCEL_OPTION(padding_mode)
};

// ---- pooling ----

// stride unset: the kernel size (torch's stride=None). dilation must be 1 (dilated max pooling is
// not offered); ceil_mode: the output size rounds up (Note [max pool ceil_mode] in
// autograd/ops/conv.cc).
struct MaxPool2dFields {
  Size2 kernel_size;  // required
  std::optional<Size2> stride = std::nullopt;
  Size2 padding = 0;
  Size2 dilation = 1;
  bool ceil_mode = false;
};
struct MaxPool2dOptions : MaxPool2dFields {
  using Fields = MaxPool2dFields;
  MaxPool2dOptions(Size2 kernel_size) { Fields::kernel_size = kernel_size; }  // NOLINT: implicit
  ACCEL_OPTIONS_FROM_FIELDS(MaxPool2dOptions)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(dilation)
  ACCEL_OPTION(ceil_mode)
};

struct AvgPool2dFields {
  Size2 kernel_size;  // required
  std::optional<Size2> stride = std::nullopt;
  Size2 padding = 0;
  bool count_include_pad = true;
};
struct AvgPool2dOptions : AvgPool2dFields {
  using Fields = AvgPool2dFields;
  AvgPool2dOptions(Size2 kernel_size) { Fields::kernel_size = kernel_size; }  // NOLINT: implicit
  ACCEL_OPTIONS_FROM_FIELDS(AvgPool2dOptions)
  ACCEL_OPTION(kernel_size)
  ACCEL_OPTION(stride)
  ACCEL_OPTION(padding)
  ACCEL_OPTION(count_include_pad)
};

}  // namespace accel::nn
