// Resampling modules, each torch.nn's module of the same name with the same arguments and
// defaults, forwarding to the op of autograd/ops.h (autograd/ops/resample.cc): PixelShuffle,
// PixelUnshuffle, the 2-D padding modules and Upsample.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace accel::nn {

// torch.nn.PixelShuffle(upscale_factor): (*, C r^2, H, W) -> (*, C, H r, W r).
class PixelShuffle : public Module {
 public:
  explicit PixelShuffle(int64_t upscale_factor);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t upscale_factor;
};

// torch.nn.PixelUnshuffle(downscale_factor): (*, C, H r, W r) -> (*, C r^2, H, W).
class PixelUnshuffle : public Module {
 public:
  explicit PixelUnshuffle(int64_t downscale_factor);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t downscale_factor;
};

// A 2-D padding given as one number (all four sides) or (left, right, top, bottom), as torch.
struct Pad4 {
  int64_t left = 0, right = 0, top = 0, bottom = 0;
  Pad4(int64_t v) : left(v), right(v), top(v), bottom(v) {}  // NOLINT: implicit, like torch
  Pad4(int64_t l, int64_t r, int64_t t, int64_t b) : left(l), right(r), top(t), bottom(b) {}
  std::vector<int64_t> pads() const { return {left, right, top, bottom}; }
  std::string str() const;
};

// torch.nn.ReflectionPad2d / ReplicationPad2d / ZeroPad2d / ConstantPad2d(padding, value):
// x (N, C, H, W) or (C, H, W) -> (..., H + top + bottom, W + left + right).
class ReflectionPad2d : public Module {
 public:
  explicit ReflectionPad2d(Pad4 padding) : padding(padding) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Pad4 padding;
};

class ReplicationPad2d : public Module {
 public:
  explicit ReplicationPad2d(Pad4 padding) : padding(padding) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Pad4 padding;
};

class ConstantPad2d : public Module {
 public:
  ConstantPad2d(Pad4 padding, double value) : padding(padding), value(value) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Pad4 padding;
  double value;
};

class ZeroPad2d : public ConstantPad2d {
 public:
  explicit ZeroPad2d(Pad4 padding) : ConstantPad2d(padding, 0.0) {}
};

// torch.nn.Upsample(size=None, scale_factor=None, mode='nearest', align_corners=None): give size
// (one entry or one per spatial dim) or scale_factor; mode "nearest", "linear" (N, C, L) or
// "bilinear" (N, C, H, W). interpolate() in autograd/ops.h.
class Upsample : public Module {
 public:
  explicit Upsample(Shape size = {}, std::vector<double> scale_factor = {},
                    std::string mode = "nearest", std::optional<bool> align_corners = std::nullopt);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Shape size;
  std::vector<double> scale_factor;
  std::string mode;
  std::optional<bool> align_corners;
};

}  // namespace accel::nn
