#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"

namespace accel::data::transforms {

namespace {

// An image in one of the two layouts (data/image.h), contiguous on the CPU. For HWC, c is the
// channels per pixel; for CHW, the number of (H, W) planes (all leading dims flattened).
struct Img {
  Tensor t;
  bool hwc = false;
  int64_t h = 0, w = 0, c = 0;
  Shape lead;  // CHW: the leading dims (..., C); HWC: empty
  bool two_d = false;

  int64_t at(int64_t y, int64_t x, int64_t k) const {
    return hwc ? (y * w + x) * c + k : (k * h + y) * w + x;
  }
};

Img canon(const Tensor& image, const char* op) {
  ACCEL_CHECK(image.defined(), ValueError, op, "image is undefined");
  Img m;
  if (image.dtype() == kUInt8) {
    ACCEL_CHECK(image.dim() == 2 || image.dim() == 3, ShapeError, op,
                "a uint8 image is (H, W) or (H, W, C), got ", image.shape_str());
    m.hwc = true;
    m.two_d = image.dim() == 2;
    m.h = image.size(0);
    m.w = image.size(1);
    m.c = m.two_d ? 1 : image.size(2);
  } else {
    ACCEL_CHECK(image.is_floating_point(), DTypeError, op,
                "images are uint8 (H, W, C) or floating (..., C, H, W), got ", image.dtype());
    ACCEL_CHECK(image.dim() >= 2, ShapeError, op,
                "a floating image is (..., C, H, W) or (H, W), got ", image.shape_str());
    m.two_d = image.dim() == 2;
    m.h = image.size(-2);
    m.w = image.size(-1);
    m.lead = Shape(image.sizes().begin(), image.sizes().end() - 2);
    m.c = 1;
    for (int64_t d : m.lead) m.c *= d;
  }
  ACCEL_CHECK(m.h >= 1 && m.w >= 1, ShapeError, op, "empty image ", image.shape_str());
  m.t = image.detach().cpu().contiguous();
  return m;
}

Tensor make_out(const Img& m, int64_t h, int64_t w, DType dtype) {
  if (m.hwc) return m.two_d ? empty({h, w}, dtype) : empty({h, w, m.c}, dtype);
  Shape s = m.lead;
  s.push_back(h);
  s.push_back(w);
  return empty(s, dtype);
}

// Floating images other than float32/float64 are computed in float32 and converted back.
template <typename F>
Tensor by_dtype(const Tensor& image, const char* op, F&& f) {
  const DType dt = image.dtype();
  if (dt == kUInt8 || dt == kFloat32 || dt == kFloat64) return f(canon(image, op));
  Img m = canon(image, op);
  m.t = m.t.to(kFloat32);
  return f(m).to(dt);
}

template <typename T>
void crop_kernel(const Img& m, Tensor& out, int64_t top, int64_t left, int64_t oh, int64_t ow) {
  const T* src = m.t.data<T>();
  T* dst = out.data<T>();
  const Img o{out, m.hwc, oh, ow, m.c, {}, false};
  for (int64_t k = 0; k < m.c; ++k)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sy = top + y, sx = left + x;
        const bool in = sy >= 0 && sy < m.h && sx >= 0 && sx < m.w;
        dst[o.at(y, x, k)] = in ? src[m.at(sy, sx, k)] : T(0);
      }
}

template <typename T>
void flip_kernel(const Img& m, Tensor& out) {
  const T* src = m.t.data<T>();
  T* dst = out.data<T>();
  for (int64_t k = 0; k < m.c; ++k)
    for (int64_t y = 0; y < m.h; ++y)
      for (int64_t x = 0; x < m.w; ++x) dst[m.at(y, x, k)] = src[m.at(y, m.w - 1 - x, k)];
}

// Note [bilinear like torch]: upsample_bilinear2d with align_corners=False on the CPU, in the
// accumulation type A (float for float32 and uint8, double for float64): scale = in / out,
// src = max(scale * (d + 0.5) - 0.5, 0), i0 = floor(src), i1 = min(i0 + 1, in - 1),
// l1 = src - i0, l0 = 1 - l1; out = (v00 l0x + v01 l1x) l0y + (v10 l0x + v11 l1x) l1y.
template <typename A>
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<A> l0, l1;
  Taps(int64_t in, int64_t out)
      : i0(size_t(out)), i1(size_t(out)), l0(size_t(out)), l1(size_t(out)) {
    const A scale = A(in) / A(out);
    for (int64_t d = 0; d < out; ++d) {
      A src = scale * (A(d) + A(0.5)) - A(0.5);
      if (src < 0) src = 0;
      int64_t a = int64_t(src);
      if (a > in - 1) a = in - 1;
      const A lam = src - A(a);
      i0[size_t(d)] = a;
      i1[size_t(d)] = a < in - 1 ? a + 1 : a;
      l1[size_t(d)] = lam;
      l0[size_t(d)] = A(1) - lam;
    }
  }
};

template <typename T, typename A>
void resize_kernel(const Img& m, Tensor& out, int64_t oh, int64_t ow) {
  const T* src = m.t.data<T>();
  T* dst = out.data<T>();
  const Taps<A> ty(m.h, oh), tx(m.w, ow);
  const Img o{out, m.hwc, oh, ow, m.c, {}, false};
  for (int64_t k = 0; k < m.c; ++k)
    for (int64_t y = 0; y < oh; ++y) {
      const size_t yy = size_t(y);
      for (int64_t x = 0; x < ow; ++x) {
        const size_t xx = size_t(x);
        const A v00 = A(src[m.at(ty.i0[yy], tx.i0[xx], k)]);
        const A v01 = A(src[m.at(ty.i0[yy], tx.i1[xx], k)]);
        const A v10 = A(src[m.at(ty.i1[yy], tx.i0[xx], k)]);
        const A v11 = A(src[m.at(ty.i1[yy], tx.i1[xx], k)]);
        const A r = (v00 * tx.l0[xx] + v01 * tx.l1[xx]) * ty.l0[yy] +
                    (v10 * tx.l0[xx] + v11 * tx.l1[xx]) * ty.l1[yy];
        if constexpr (std::is_same_v<T, uint8_t>) {
          dst[o.at(y, x, k)] = uint8_t(std::clamp(std::nearbyint(r), A(0), A(255)));
        } else {
          dst[o.at(y, x, k)] = T(r);
        }
      }
    }
}

// Python's round() of d / 2 (half to even), for a non-negative or negative integer d.
int64_t half_round(int64_t d) { return int64_t(std::nearbyint(double(d) / 2.0)); }

void check_size(int64_t h, int64_t w, const char* op) {
  ACCEL_CHECK(h >= 1 && w >= 1, ValueError, op, "output size must be positive, got (", h, ", ", w,
              ")");
}

}  // namespace

// ---- functional ----

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_size(height, width, "crop");
  return by_dtype(image, "crop", [&](const Img& m) {
    Tensor out = make_out(m, height, width, m.t.dtype());
    switch (m.t.dtype()) {
      case kUInt8: crop_kernel<uint8_t>(m, out, top, left, height, width); break;
      case kFloat64: crop_kernel<double>(m, out, top, left, height, width); break;
      default: crop_kernel<float>(m, out, top, left, height, width);
    }
    return out;
  });
}

Tensor hflip(const Tensor& image) {
  return by_dtype(image, "hflip", [&](const Img& m) {
    Tensor out = make_out(m, m.h, m.w, m.t.dtype());
    switch (m.t.dtype()) {
      case kUInt8: flip_kernel<uint8_t>(m, out); break;
      case kFloat64: flip_kernel<double>(m, out); break;
      default: flip_kernel<float>(m, out);
    }
    return out;
  });
}

Tensor resize(const Tensor& image, int64_t height, int64_t width) {
  check_size(height, width, "resize");
  return by_dtype(image, "resize", [&](const Img& m) {
    Tensor out = make_out(m, height, width, m.t.dtype());
    switch (m.t.dtype()) {
      case kUInt8: resize_kernel<uint8_t, float>(m, out, height, width); break;
      case kFloat64: resize_kernel<double, double>(m, out, height, width); break;
      default: resize_kernel<float, float>(m, out, height, width);
    }
    return out;
  });
}

Tensor center_crop(const Tensor& image, int64_t height, int64_t width) {
  check_size(height, width, "center_crop");
  const bool hwc = image.defined() && image.dtype() == kUInt8;
  ACCEL_CHECK(image.defined() && image.dim() >= 2, ShapeError, "center_crop",
              "expects an image, got ", image.defined() ? image.shape_str() : "undefined");
  const int64_t h = hwc ? image.size(0) : image.size(-2);
  const int64_t w = hwc ? image.size(1) : image.size(-1);
  // torchvision pads a too-small side by ((c - s) // 2 before, the rest after), then crops at
  // round((padded - c) / 2): the offset into the unpadded image is -(c - s) // 2 there.
  const int64_t top = height > h ? -((height - h) / 2) : half_round(h - height);
  const int64_t left = width > w ? -((width - w) / 2) : half_round(w - width);
  return crop(image, top, left, height, width);
}

// ---- classes ----

Tensor Transform::operator()(const Tensor& image) const {
  Generator g = sample_generator();
  return apply(image, g);
}

AnyTransform::AnyTransform(TransformPtr p) : ptr_(std::move(p)) {}

Compose::Compose(std::vector<AnyTransform> transforms) {
  for (auto& t : transforms) {
    ACCEL_CHECK(t.ptr() != nullptr, ValueError, "Compose", "transform ", transforms_.size(),
                " is null");
    transforms_.push_back(t.ptr());
  }
}

Tensor Compose::apply(const Tensor& image, Generator& gen) const {
  Tensor x = image;
  for (const auto& t : transforms_) x = t->apply(x, gen);
  return x;
}

std::string Compose::repr() const {
  std::string s = "Compose(";
  for (size_t i = 0; i < transforms_.size(); ++i) s += (i ? ", " : "") + transforms_[i]->repr();
  return s + ")";
}

Lambda::Lambda(std::function<Tensor(const Tensor&)> fn)
    : fn_([f = std::move(fn)](const Tensor& x, Generator&) { return f(x); }) {}
Lambda::Lambda(std::function<Tensor(const Tensor&, Generator&)> fn) : fn_(std::move(fn)) {}

Resize::Resize(int64_t size) : size_(size) {
  ACCEL_CHECK(size >= 1, ValueError, "Resize", "size must be positive, got ", size);
}
Resize::Resize(int64_t height, int64_t width) : height_(height), width_(width) {
  check_size(height, width, "Resize");
}

Tensor Resize::apply(const Tensor& image, Generator&) const {
  int64_t oh = height_, ow = width_;
  if (size_ > 0) {
    ACCEL_CHECK(image.defined() && image.dim() >= 2, ShapeError, "Resize", "expects an image, got ",
                image.defined() ? image.shape_str() : "undefined");
    const bool hwc = image.dtype() == kUInt8;
    const int64_t h = hwc ? image.size(0) : image.size(-2);
    const int64_t w = hwc ? image.size(1) : image.size(-1);
    ACCEL_CHECK(h >= 1 && w >= 1, ShapeError, "Resize", "empty image ", image.shape_str());
    // torchvision: new_long = int(size * long / short) (Python float division, truncated).
    const int64_t s = std::min(h, w), l = std::max(h, w);
    const int64_t nl = int64_t(double(size_) * double(l) / double(s));
    oh = h <= w ? size_ : nl;
    ow = h <= w ? nl : size_;
  }
  return resize(image, oh, ow);
}

std::string Resize::repr() const {
  std::ostringstream os;
  if (size_ > 0) {
    os << "Resize(size=" << size_ << ", bilinear, antialias=False)";
  } else {
    os << "Resize(size=(" << height_ << ", " << width_ << "), bilinear, antialias=False)";
  }
  return os.str();
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height_(height), width_(width) {
  check_size(height, width, "CenterCrop");
}
Tensor CenterCrop::apply(const Tensor& image, Generator&) const {
  return center_crop(image, height_, width_);
}
std::string CenterCrop::repr() const {
  std::ostringstream os;
  os << "CenterCrop(size=(" << height_ << ", " << width_ << "))";
  return os.str();
}

RandomResizedCrop::RandomResizedCrop(int64_t size, std::pair<double, double> scale,
                                     std::pair<double, double> ratio)
    : RandomResizedCrop(std::make_pair(size, size), scale, ratio) {}

RandomResizedCrop::RandomResizedCrop(std::pair<int64_t, int64_t> size,
                                     std::pair<double, double> scale,
                                     std::pair<double, double> ratio)
    : height_(size.first), width_(size.second), scale_(scale), ratio_(ratio) {
  check_size(height_, width_, "RandomResizedCrop");
  ACCEL_CHECK(scale.first > 0 && scale.first <= scale.second, ValueError, "RandomResizedCrop",
              "scale must be (min, max) with 0 < min <= max, got (", scale.first, ", ",
              scale.second, ")");
  ACCEL_CHECK(ratio.first > 0 && ratio.first <= ratio.second, ValueError, "RandomResizedCrop",
              "ratio must be (min, max) with 0 < min <= max, got (", ratio.first, ", ",
              ratio.second, ")");
}

RandomResizedCrop::Box RandomResizedCrop::get_params(int64_t h, int64_t w, Generator& gen) const {
  const double area = double(h) * double(w);
  const double lr0 = std::log(ratio_.first), lr1 = std::log(ratio_.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target =
        area * (scale_.first + (scale_.second - scale_.first) * gen.next_double());
    const double aspect = std::exp(lr0 + (lr1 - lr0) * gen.next_double());
    const int64_t cw = int64_t(std::nearbyint(std::sqrt(target * aspect)));
    const int64_t ch = int64_t(std::nearbyint(std::sqrt(target / aspect)));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      // randint(0, h - ch + 1): uniform over the valid offsets.
      const int64_t top = std::min(h - ch, int64_t(gen.next_double() * double(h - ch + 1)));
      const int64_t left = std::min(w - cw, int64_t(gen.next_double() * double(w - cw + 1)));
      return {top, left, ch, cw};
    }
  }
  // Fallback: the central crop, its aspect clamped into the ratio range.
  const double in_ratio = double(w) / double(h);
  int64_t cw = w, ch = h;
  if (in_ratio < ratio_.first) {
    ch = int64_t(std::nearbyint(double(w) / ratio_.first));
  } else if (in_ratio > ratio_.second) {
    cw = int64_t(std::nearbyint(double(h) * ratio_.second));
  }
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

Tensor RandomResizedCrop::apply(const Tensor& image, Generator& gen) const {
  ACCEL_CHECK(image.defined() && image.dim() >= 2, ShapeError, "RandomResizedCrop",
              "expects an image, got ", image.defined() ? image.shape_str() : "undefined");
  const bool hwc = image.dtype() == kUInt8;
  const int64_t h = hwc ? image.size(0) : image.size(-2);
  const int64_t w = hwc ? image.size(1) : image.size(-1);
  ACCEL_CHECK(h >= 1 && w >= 1, ShapeError, "RandomResizedCrop", "empty image ", image.shape_str());
  const Box b = get_params(h, w, gen);
  return resize(crop(image, b.top, b.left, b.height, b.width), height_, width_);
}

std::string RandomResizedCrop::repr() const {
  std::ostringstream os;
  os << "RandomResizedCrop(size=(" << height_ << ", " << width_ << "), scale=(" << scale_.first
     << ", " << scale_.second << "), ratio=(" << ratio_.first << ", " << ratio_.second << "))";
  return os.str();
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  ACCEL_CHECK(p >= 0 && p <= 1, ValueError, "RandomHorizontalFlip", "p must be in [0, 1], got ", p);
}
Tensor RandomHorizontalFlip::apply(const Tensor& image, Generator& gen) const {
  return gen.next_double() < p_ ? hflip(image) : image;
}
std::string RandomHorizontalFlip::repr() const {
  std::ostringstream os;
  os << "RandomHorizontalFlip(p=" << p_ << ")";
  return os.str();
}

Tensor ToTensor::apply(const Tensor& image, Generator&) const {
  ACCEL_CHECK(image.defined(), ValueError, "ToTensor", "image is undefined");
  ACCEL_CHECK(image.dtype() == kUInt8, DTypeError, "ToTensor",
              "expects a uint8 (H, W, C) or (H, W) image, got ", image.dtype(), " ",
              image.shape_str());
  ACCEL_CHECK(image.dim() == 2 || image.dim() == 3, ShapeError, "ToTensor",
              "expects a uint8 (H, W, C) or (H, W) image, got ", image.shape_str());
  const Tensor src = image.cpu().contiguous();
  const int64_t h = src.size(0), w = src.size(1), c = src.dim() == 2 ? 1 : src.size(2);
  Tensor out = empty({c, h, w}, kFloat32);
  const uint8_t* s = src.data<uint8_t>();
  float* d = out.data<float>();
  for (int64_t i = 0; i < h * w; ++i)
    for (int64_t k = 0; k < c; ++k) d[k * h * w + i] = float(s[i * c + k]) / 255.0f;
  return out;
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  ACCEL_CHECK(!mean_.empty() && mean_.size() == std_.size(), ValueError, "Normalize",
              "mean and std need the same, non-zero number of values; got ", mean_.size(), " and ",
              std_.size());
  for (double s : std_)
    ACCEL_CHECK(s != 0.0, ValueError, "Normalize", "std evaluated to zero (division by zero)");
}

Tensor Normalize::apply(const Tensor& image, Generator&) const {
  ACCEL_CHECK(image.defined(), ValueError, "Normalize", "image is undefined");
  ACCEL_CHECK(image.is_floating_point(), DTypeError, "Normalize",
              "expects a floating (..., C, H, W) image (after ToTensor), got ", image.dtype());
  ACCEL_CHECK(image.dim() >= 3, ShapeError, "Normalize", "expects (..., C, H, W), got ",
              image.shape_str());
  const int64_t c = image.size(-3);
  ACCEL_CHECK(mean_.size() == 1 || int64_t(mean_.size()) == c, ValueError, "Normalize",
              mean_.size(), " mean/std values for an image of ", c, " channels ",
              image.shape_str());
  std::vector<double> m(static_cast<size_t>(c)), s(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    m[size_t(k)] = mean_.size() == 1 ? mean_[0] : mean_[size_t(k)];
    s[size_t(k)] = std_.size() == 1 ? std_[0] : std_[size_t(k)];
  }
  // torchvision: tensor.sub_(mean).div_(std), in the image's dtype and on its device.
  Tensor mean_t = tensor(m, {c, 1, 1}, TensorOptions(kFloat64)).to(image.device(), image.dtype());
  Tensor std_t = tensor(s, {c, 1, 1}, TensorOptions(kFloat64)).to(image.device(), image.dtype());
  return image.detach().sub(mean_t).div(std_t);
}

std::string Normalize::repr() const {
  std::ostringstream os;
  os << "Normalize(mean=[";
  for (size_t i = 0; i < mean_.size(); ++i) os << (i ? ", " : "") << mean_[i];
  os << "], std=[";
  for (size_t i = 0; i < std_.size(); ++i) os << (i ? ", " : "") << std_[i];
  os << "])";
  return os.str();
}

}  // namespace accel::data::transforms
