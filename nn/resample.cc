#include "nn/resample.h"

#include <sstream>

#include "autograd/ops.h"

namespace accel::nn {

PixelShuffle::PixelShuffle(int64_t r) : upscale_factor(r) {
  ACCEL_CHECK(r >= 1, ValueError, "PixelShuffle", "upscale_factor must be positive, got ", r);
}
Tensor PixelShuffle::forward(const Tensor& x) { return pixel_shuffle(x, upscale_factor); }
std::string PixelShuffle::extra_repr() const {
  return "upscale_factor=" + std::to_string(upscale_factor);
}

PixelUnshuffle::PixelUnshuffle(int64_t r) : downscale_factor(r) {
  ACCEL_CHECK(r >= 1, ValueError, "PixelUnshuffle", "downscale_factor must be positive, got ", r);
}
Tensor PixelUnshuffle::forward(const Tensor& x) { return pixel_unshuffle(x, downscale_factor); }
std::string PixelUnshuffle::extra_repr() const {
  return "downscale_factor=" + std::to_string(downscale_factor);
}

std::string Pad4::str() const {
  std::ostringstream os;
  os << "(" << left << ", " << right << ", " << top << ", " << bottom << ")";
  return os.str();
}

namespace {
void check_image(const char* op, const Tensor& x) {
  ACCEL_CHECK(x.defined() && (x.dim() == 3 || x.dim() == 4), ShapeError, op,
              "expected input (N, C, H, W) or (C, H, W), got ", x.defined() ? x.sizes() : Shape{});
}
}  // namespace

Tensor ReflectionPad2d::forward(const Tensor& x) {
  check_image("ReflectionPad2d", x);
  return pad(x, padding.pads(), "reflect");
}
std::string ReflectionPad2d::extra_repr() const { return padding.str(); }

Tensor ReplicationPad2d::forward(const Tensor& x) {
  check_image("ReplicationPad2d", x);
  return pad(x, padding.pads(), "replicate");
}
std::string ReplicationPad2d::extra_repr() const { return padding.str(); }

Tensor ConstantPad2d::forward(const Tensor& x) {
  check_image("ConstantPad2d", x);
  return pad(x, padding.pads(), "constant", value);
}
std::string ConstantPad2d::extra_repr() const {
  return "padding=" + padding.str() + ", value=" + std::to_string(value);
}

Upsample::Upsample(Shape size_, std::vector<double> scale_factor_, std::string mode_,
                   std::optional<bool> align_corners_)
    : size(std::move(size_)),
      scale_factor(std::move(scale_factor_)),
      mode(std::move(mode_)),
      align_corners(align_corners_) {
  ACCEL_CHECK(size.empty() != scale_factor.empty(), ValueError, "Upsample",
              "give exactly one of size and scale_factor");
  ACCEL_CHECK(mode == "nearest" || mode == "linear" || mode == "bilinear", ValueError, "Upsample",
              "mode must be \"nearest\", \"linear\" or \"bilinear\", got \"", mode, "\"");
}
Tensor Upsample::forward(const Tensor& x) {
  return interpolate(x, size, scale_factor, mode, align_corners);
}
std::string Upsample::extra_repr() const {
  std::ostringstream os;
  if (!size.empty()) os << "size=" << size << ", ";
  if (!scale_factor.empty()) {
    os << "scale_factor=(";
    for (size_t i = 0; i < scale_factor.size(); ++i) os << (i ? ", " : "") << scale_factor[i];
    os << "), ";
  }
  os << "mode='" << mode << "'";
  return os.str();
}

}  // namespace accel::nn
