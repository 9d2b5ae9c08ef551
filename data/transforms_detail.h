// Internal to data/transforms*.cc, resample.cc and color.cc (private header, not installed): an
// image in one of the two layouts of data/image.h, checked and made contiguous on the CPU.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace accel::data::transforms::detail {

// For HWC, c is the channels per pixel; for CHW, the number of (H, W) planes (all leading dims
// flattened); channels is the C of torchvision's (..., C, H, W) view (1 for a 2-D image).
struct Img {
  Tensor t;
  bool hwc = false;
  int64_t h = 0, w = 0, c = 0;
  int64_t channels = 1;
  Shape lead;  // CHW: the leading dims (..., C); HWC: empty
  bool two_d = false;

  int64_t at(int64_t y, int64_t x, int64_t k) const {
    return hwc ? (y * w + x) * c + k : (k * h + y) * w + x;
  }
};

// uint8 (H, W) / (H, W, C) or floating (..., C, H, W) / (H, W), not empty; anything else is a
// ShapeError or DTypeError naming `op`, the dtype and the shape. No copy: the transform classes
// call it first so that an error names the transform rather than a functional form.
void check_image(const Tensor& image, const char* op);
// check_image, then the image made contiguous on the CPU.
Img canon(const Tensor& image, const char* op);
// An uninitialised image of m's layout with spatial size (h, w).
Tensor make_out(const Img& m, int64_t h, int64_t w, DType dtype);
// (H, W) of an image without copying it (the checks of canon on dims only).
std::pair<int64_t, int64_t> image_hw(const Tensor& image, const char* op);

// Floating images other than float32 / float64 are computed in float32 and converted back (as
// torchvision's tensor resize casts them).
// The transforms compute on the CPU; the result goes back to the image's device (torchvision's
// stays where the image is).
template <typename F>
Tensor by_dtype(const Tensor& image, const char* op, F&& f) {
  const DType dt = image.dtype();
  Tensor out;
  if (dt == kUInt8 || dt == kFloat32 || dt == kFloat64) {
    out = f(canon(image, op));
  } else {
    Img m = canon(image, op);
    m.t = m.t.to(kFloat32);
    out = f(m).to(dt);
  }
  return out.device() == image.device() ? out : out.to(image.device());
}

}  // namespace accel::data::transforms::detail
