#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/transforms_detail.h"

namespace accel::data::transforms {

namespace detail {

void check_image(const Tensor& image, const char* op) {
  ACCEL_CHECK(image.defined(), ValueError, op, "image is undefined");
  const bool u8 = image.dtype() == kUInt8;
  ACCEL_CHECK(u8 || image.is_floating_point(), DTypeError, op,
              "expects a uint8 (H, W, C) / (H, W) or floating (..., C, H, W) / (H, W) image, got ",
              image.dtype(), " ", image.shape_str());
  ACCEL_CHECK(u8 ? image.dim() == 2 || image.dim() == 3 : image.dim() >= 2, ShapeError, op,
              u8 ? "expects a uint8 image of (H, W, C) or (H, W), got "
                 : "expects a floating image of (..., C, H, W) or (H, W), got ",
              image.shape_str());
  ACCEL_CHECK(image.numel() > 0, ShapeError, op, "empty image ", image.shape_str());
}

Img canon(const Tensor& image, const char* op) {
  check_image(image, op);
  Img m;
  m.two_d = image.dim() == 2;
  if (image.dtype() == kUInt8) {
    m.hwc = true;
    m.h = image.size(0);
    m.w = image.size(1);
    m.c = m.two_d ? 1 : image.size(2);
    m.channels = m.c;
  } else {
    m.h = image.size(-2);
    m.w = image.size(-1);
    m.lead = Shape(image.sizes().begin(), image.sizes().end() - 2);
    m.c = 1;
    for (int64_t d : m.lead) m.c *= d;
    m.channels = m.two_d ? 1 : image.size(-3);
  }
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

std::pair<int64_t, int64_t> image_hw(const Tensor& image, const char* op) {
  check_image(image, op);
  const bool hwc = image.dtype() == kUInt8;
  return {hwc ? image.size(0) : image.size(-2), hwc ? image.size(1) : image.size(-1)};
}

}  // namespace detail

namespace {

using detail::by_dtype;
using detail::Img;

template <typename T>
void crop_kernel(const Img& m, Tensor& out, int64_t top, int64_t left, int64_t oh, int64_t ow) {
  const T* src = m.t.data<T>();
  T* dst = out.data<T>();
  Img o;
  o.hwc = m.hwc;
  o.h = oh;
  o.w = ow;
  o.c = m.c;
  for (int64_t k = 0; k < m.c; ++k)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sy = top + y, sx = left + x;
        const bool in = sy >= 0 && sy < m.h && sx >= 0 && sx < m.w;
        dst[o.at(y, x, k)] = in ? src[m.at(sy, sx, k)] : T(0);
      }
}

template <typename T>
void flip_kernel(const Img& m, Tensor& out, bool vertical) {
  const T* src = m.t.data<T>();
  T* dst = out.data<T>();
  for (int64_t k = 0; k < m.c; ++k)
    for (int64_t y = 0; y < m.h; ++y)
      for (int64_t x = 0; x < m.w; ++x)
        dst[m.at(y, x, k)] = vertical ? src[m.at(m.h - 1 - y, x, k)] : src[m.at(y, m.w - 1 - x, k)];
}

Tensor flip(const Tensor& image, bool vertical, const char* op) {
  return by_dtype(image, op, [&](const Img& m) {
    Tensor out = detail::make_out(m, m.h, m.w, m.t.dtype());
    switch (m.t.dtype()) {
      case kUInt8: flip_kernel<uint8_t>(m, out, vertical); break;
      case kFloat64: flip_kernel<double>(m, out, vertical); break;
      default: flip_kernel<float>(m, out, vertical);
    }
    return out;
  });
}

// Python's round() of d / 2 (half to even), for a non-negative or negative integer d.
int64_t half_round(int64_t d) { return int64_t(std::nearbyint(double(d) / 2.0)); }

void check_size(int64_t h, int64_t w, const char* op) {
  ACCEL_CHECK(h >= 1 && w >= 1, ValueError, op, "output size must be positive, got (", h, ", ", w,
              ")");
}

}  // namespace

// ---- random words (Note [torchvision's random draws]) ----

RandomWords random_words(Generator& gen) {
  return [&gen] { return uint32_t(gen.next_u64() >> 32); };
}

float uniform_from_word(uint32_t word) { return float(word & 0xFFFFFFu) * 0x1.0p-24f; }

namespace {

// torch.empty(1).uniform_(a, b) on a float32 tensor: a and b become float32; fused as torch's
// kernel is compiled.
float uniform_f32(const RandomWords& words, double a, double b) {
  const float fa = float(a), fb = float(b);
  return std::fma(uniform_from_word(words()), fb - fa, fa);
}

}  // namespace

// ---- functional ----

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_size(height, width, "crop");
  return by_dtype(image, "crop", [&](const Img& m) {
    Tensor out = detail::make_out(m, height, width, m.t.dtype());
    switch (m.t.dtype()) {
      case kUInt8: crop_kernel<uint8_t>(m, out, top, left, height, width); break;
      case kFloat64: crop_kernel<double>(m, out, top, left, height, width); break;
      default: crop_kernel<float>(m, out, top, left, height, width);
    }
    return out;
  });
}

Tensor hflip(const Tensor& image) { return flip(image, false, "hflip"); }
Tensor vflip(const Tensor& image) { return flip(image, true, "vflip"); }

Tensor center_crop(const Tensor& image, int64_t height, int64_t width) {
  check_size(height, width, "center_crop");
  const auto [h, w] = detail::image_hw(image, "center_crop");
  // torchvision pads a too-small side by ((c - s) // 2 before, the rest after), then crops at
  // round((padded - c) / 2): the offset into the unpadded image is -(c - s) // 2 there.
  const int64_t top = height > h ? -((height - h) / 2) : half_round(h - height);
  const int64_t left = width > w ? -((width - w) / 2) : half_round(w - width);
  return crop(image, top, left, height, width);
}

Tensor to_tensor(const Tensor& image) {
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
  // torchvision: img.to(float32).div(255).
  for (int64_t i = 0; i < h * w; ++i)
    for (int64_t k = 0; k < c; ++k) d[k * h * w + i] = float(s[i * c + k]) / 255.0f;
  return image.device().is_cpu() ? out : out.to(image.device());
}

Tensor normalize(const Tensor& image, const std::vector<double>& mean,
                 const std::vector<double>& std) {
  ACCEL_CHECK(!mean.empty() && mean.size() == std.size(), ValueError, "Normalize",
              "mean and std need the same, non-zero number of values; got ", mean.size(), " and ",
              std.size());
  ACCEL_CHECK(image.defined(), ValueError, "Normalize", "image is undefined");
  ACCEL_CHECK(image.is_floating_point(), DTypeError, "Normalize",
              "expects a floating (..., C, H, W) image (after ToTensor), got ", image.dtype(), " ",
              image.shape_str());
  ACCEL_CHECK(image.dim() >= 3, ShapeError, "Normalize", "expects (..., C, H, W), got ",
              image.shape_str());
  const int64_t c = image.size(-3);
  ACCEL_CHECK(mean.size() == 1 || int64_t(mean.size()) == c, ValueError, "Normalize", mean.size(),
              " mean/std values for an image of ", c, " channels ", image.shape_str());
  std::vector<double> m(static_cast<size_t>(c)), s(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    m[size_t(k)] = mean.size() == 1 ? mean[0] : mean[size_t(k)];
    s[size_t(k)] = std.size() == 1 ? std[0] : std[size_t(k)];
  }
  // torchvision: tensor.sub_(mean).div_(std), mean and std in the image's dtype, on its device.
  Tensor mean_t = tensor(m, {c, 1, 1}, TensorOptions(kFloat64)).to(image.device(), image.dtype());
  Tensor std_t = tensor(s, {c, 1, 1}, TensorOptions(kFloat64)).to(image.device(), image.dtype());
  for (double v : std_t.to(kCPU, kFloat64).to_vector<double>())
    ACCEL_CHECK(v != 0.0, ValueError, "Normalize", "std evaluated to zero after conversion to ",
                image.dtype(), ", leading to division by zero");
  return image.detach().sub(mean_t).div(std_t);
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

Resize::Resize(int64_t size, InterpolationMode interpolation, std::optional<int64_t> max_size,
               bool antialias)
    : size_(size), interpolation_(interpolation), max_size_(max_size), antialias_(antialias) {
  ACCEL_CHECK(size >= 1, ValueError, "Resize", "size must be positive, got ", size);
  ACCEL_CHECK(
      !max_size || *max_size > size, ValueError, "Resize", "max_size = ", max_size.value_or(0),
      " must be strictly greater than the requested size for the smaller edge size = ", size);
  ACCEL_CHECK(!antialias || interpolation == InterpolationMode::kBilinear ||
                  interpolation == InterpolationMode::kBicubic,
              ValueError, "Resize", "antialias is supported for bilinear and bicubic only, not ",
              interpolation_name(interpolation));
}

Resize::Resize(int64_t height, int64_t width, InterpolationMode interpolation, bool antialias)
    : height_(height), width_(width), interpolation_(interpolation), antialias_(antialias) {
  check_size(height, width, "Resize");
  ACCEL_CHECK(!antialias || interpolation == InterpolationMode::kBilinear ||
                  interpolation == InterpolationMode::kBicubic,
              ValueError, "Resize", "antialias is supported for bilinear and bicubic only, not ",
              interpolation_name(interpolation));
}

Tensor Resize::apply(const Tensor& image, Generator&) const {
  detail::check_image(image, "Resize");
  if (size_ > 0) return resize(image, {size_}, interpolation_, max_size_, antialias_);
  return resize(image, height_, width_, interpolation_, antialias_);
}

std::string Resize::repr() const {
  std::ostringstream os;
  os << "Resize(size=";
  if (size_ > 0) {
    os << size_;
  } else {
    os << "(" << height_ << ", " << width_ << ")";
  }
  os << ", interpolation=" << interpolation_name(interpolation_);
  if (max_size_) os << ", max_size=" << *max_size_;
  os << ", antialias=" << (antialias_ ? "True" : "False") << ")";
  return os.str();
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height_(height), width_(width) {
  check_size(height, width, "CenterCrop");
}
Tensor CenterCrop::apply(const Tensor& image, Generator&) const {
  detail::check_image(image, "CenterCrop");
  return center_crop(image, height_, width_);
}
std::string CenterCrop::repr() const {
  std::ostringstream os;
  os << "CenterCrop(size=(" << height_ << ", " << width_ << "))";
  return os.str();
}

RandomResizedCrop::RandomResizedCrop(int64_t size, std::pair<double, double> scale,
                                     std::pair<double, double> ratio,
                                     InterpolationMode interpolation, bool antialias)
    : RandomResizedCrop(std::make_pair(size, size), scale, ratio, interpolation, antialias) {}

RandomResizedCrop::RandomResizedCrop(std::pair<int64_t, int64_t> size,
                                     std::pair<double, double> scale,
                                     std::pair<double, double> ratio,
                                     InterpolationMode interpolation, bool antialias)
    : height_(size.first),
      width_(size.second),
      scale_(scale),
      ratio_(ratio),
      interpolation_(interpolation),
      antialias_(antialias) {
  check_size(height_, width_, "RandomResizedCrop");
  ACCEL_CHECK(scale.first > 0 && scale.first <= scale.second, ValueError, "RandomResizedCrop",
              "scale must be (min, max) with 0 < min <= max, got (", scale.first, ", ",
              scale.second, ")");
  ACCEL_CHECK(ratio.first > 0 && ratio.first <= ratio.second, ValueError, "RandomResizedCrop",
              "ratio must be (min, max) with 0 < min <= max, got (", ratio.first, ", ",
              ratio.second, ")");
  ACCEL_CHECK(!antialias || interpolation == InterpolationMode::kBilinear ||
                  interpolation == InterpolationMode::kBicubic,
              ValueError, "RandomResizedCrop",
              "antialias is supported for bilinear and bicubic only, not ",
              interpolation_name(interpolation));
}

// torchvision 0.14's RandomResizedCrop.get_params, draw for draw (Note [torchvision's random
// draws]): log_ratio = torch.log(torch.tensor(ratio)) is float32, the two uniforms per attempt
// are float32 values, the rest is Python (double) arithmetic.
RandomResizedCrop::Box RandomResizedCrop::get_params(int64_t h, int64_t w,
                                                     const RandomWords& words) const {
  ACCEL_CHECK(h >= 1 && w >= 1, ShapeError, "RandomResizedCrop", "empty image (", h, ", ", w, ")");
  const double area = double(h) * double(w);
  const float lr0 = float(std::log(double(float(ratio_.first))));
  const float lr1 = float(std::log(double(float(ratio_.second))));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * double(uniform_f32(words, scale_.first, scale_.second));
    const double aspect = double(float(std::exp(double(uniform_f32(words, lr0, lr1)))));
    const int64_t cw = int64_t(std::nearbyint(std::sqrt(target * aspect)));
    const int64_t ch = int64_t(std::nearbyint(std::sqrt(target / aspect)));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      // torch.randint(0, n, (1,)): one word, w % n.
      const int64_t top = int64_t(words() % uint32_t(h - ch + 1));
      const int64_t left = int64_t(words() % uint32_t(w - cw + 1));
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

RandomResizedCrop::Box RandomResizedCrop::get_params(int64_t h, int64_t w, Generator& gen) const {
  return get_params(h, w, random_words(gen));
}

Tensor RandomResizedCrop::apply(const Tensor& image, Generator& gen) const {
  const auto [h, w] = detail::image_hw(image, "RandomResizedCrop");
  const Box b = get_params(h, w, gen);
  return resized_crop(image, b.top, b.left, b.height, b.width, height_, width_, interpolation_,
                      antialias_);
}

std::string RandomResizedCrop::repr() const {
  std::ostringstream os;
  os << "RandomResizedCrop(size=(" << height_ << ", " << width_ << "), scale=(" << scale_.first
     << ", " << scale_.second << "), ratio=(" << ratio_.first << ", " << ratio_.second
     << "), interpolation=" << interpolation_name(interpolation_)
     << ", antialias=" << (antialias_ ? "True" : "False") << ")";
  return os.str();
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  ACCEL_CHECK(p >= 0 && p <= 1, ValueError, "RandomHorizontalFlip", "p must be in [0, 1], got ", p);
}
bool RandomHorizontalFlip::get_params(const RandomWords& words) const {
  // torch.rand(1) < p: the tensor is float32, so p is compared as float32.
  return uniform_from_word(words()) < float(p_);
}
Tensor RandomHorizontalFlip::apply(const Tensor& image, Generator& gen) const {
  detail::check_image(image, "RandomHorizontalFlip");  // also when it does not flip
  return get_params(random_words(gen)) ? hflip(image) : image;
}
std::string RandomHorizontalFlip::repr() const {
  std::ostringstream os;
  os << "RandomHorizontalFlip(p=" << p_ << ")";
  return os.str();
}

Tensor ToTensor::apply(const Tensor& image, Generator&) const { return to_tensor(image); }

Normalize::Normalize(std::vector<double> mean, std::vector<double> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  ACCEL_CHECK(!mean_.empty() && mean_.size() == std_.size(), ValueError, "Normalize",
              "mean and std need the same, non-zero number of values; got ", mean_.size(), " and ",
              std_.size());
  for (double s : std_)
    ACCEL_CHECK(s != 0.0, ValueError, "Normalize", "std evaluated to zero (division by zero)");
}

Tensor Normalize::apply(const Tensor& image, Generator&) const {
  return normalize(image, mean_, std_);
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

// ---- ColorJitter ----

namespace {

// torchvision's ColorJitter._check_input; nullopt for the identity range (nothing drawn).
std::optional<std::pair<double, double>> jitter_range(const JitterRange& r, const char* name,
                                                      bool hue) {
  const double center = hue ? 0.0 : 1.0;
  const double lo_bound = hue ? -0.5 : 0.0, hi_bound = hue ? 0.5 : INFINITY;
  std::pair<double, double> v;
  if (r.range) {
    v = *r.range;
  } else {
    ACCEL_CHECK(r.value >= 0, ValueError, "ColorJitter", "if ", name,
                " is a single number, it must be non negative, got ", r.value);
    v = {center - r.value, center + r.value};
    if (!hue) v.first = std::max(v.first, 0.0);
  }
  // torchvision checks the bounds of pairs only (a hue of 0.7 fails later, in adjust_hue); we
  // check both here.
  ACCEL_CHECK(lo_bound <= v.first && v.first <= v.second && v.second <= hi_bound, ValueError,
              "ColorJitter", name, " values should be between (", lo_bound, ", ", hi_bound,
              ") with min <= max, got (", v.first, ", ", v.second, ")");
  if (v.first == center && v.second == center) return std::nullopt;
  return v;
}

}  // namespace

ColorJitter::ColorJitter(JitterRange brightness, JitterRange contrast, JitterRange saturation,
                         JitterRange hue) {
  ranges_[0] = jitter_range(brightness, "brightness", false);
  ranges_[1] = jitter_range(contrast, "contrast", false);
  ranges_[2] = jitter_range(saturation, "saturation", false);
  ranges_[3] = jitter_range(hue, "hue", true);
}

ColorJitter::Params ColorJitter::get_params(const RandomWords& words) const {
  Params p;
  // torch.randperm(4) on the CPU (n < 2^24): r[i] swaps with r[i + word % (4 - i)].
  for (int i = 0; i < 3; ++i) {
    const int z = int(words() % uint32_t(4 - i));
    std::swap(p.order[size_t(i)], p.order[size_t(i + z)]);
  }
  for (size_t k = 0; k < 4; ++k)
    if (ranges_[k])
      p.factors[k] = double(uniform_f32(words, ranges_[k]->first, ranges_[k]->second));
  return p;
}

ColorJitter::Params ColorJitter::get_params(Generator& gen) const {
  return get_params(random_words(gen));
}

Tensor ColorJitter::apply_params(const Tensor& image, const Params& p) {
  Tensor x = image;
  for (int id : p.order) {
    ACCEL_CHECK(id >= 0 && id < 4, ValueError, "ColorJitter", "order holds ", id,
                "; expected a permutation of 0..3");
    const auto& f = p.factors[size_t(id)];
    if (!f) continue;
    switch (id) {
      case 0: x = adjust_brightness(x, *f); break;
      case 1: x = adjust_contrast(x, *f); break;
      case 2: x = adjust_saturation(x, *f); break;
      default: x = adjust_hue(x, *f);
    }
  }
  return x;
}

Tensor ColorJitter::apply(const Tensor& image, Generator& gen) const {
  // Checked before drawing, and also when every range is the identity (torchvision's adjust_*
  // each assert 1 or 3 channels).
  detail::check_image(image, "ColorJitter");
  const int64_t c = image.dim() == 2 ? 1 : image.dtype() == kUInt8 ? image.size(2) : image.size(-3);
  ACCEL_CHECK(c == 1 || c == 3, ShapeError, "ColorJitter",
              "expects an image of 1 or 3 channels, got ", c, " (", image.dtype(), " ",
              image.shape_str(), ")");
  return apply_params(image, get_params(gen));
}

std::string ColorJitter::repr() const {
  std::ostringstream os;
  const char* names[4] = {"brightness", "contrast", "saturation", "hue"};
  os << "ColorJitter(";
  for (size_t k = 0; k < 4; ++k) {
    os << (k ? ", " : "") << names[k] << "=";
    if (ranges_[k]) {
      os << "(" << ranges_[k]->first << ", " << ranges_[k]->second << ")";
    } else {
      os << "None";
    }
  }
  os << ")";
  return os.str();
}

}  // namespace accel::data::transforms
