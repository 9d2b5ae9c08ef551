// The colour functions of data/transforms.h: torchvision 0.14's functional_tensor
// rgb_to_grayscale, adjust_brightness / contrast / saturation / hue.
//
// Note [colour like torchvision]
// torchvision builds each adjustment from whole-tensor ops, each rounding to the tensor's dtype
// (float32 for uint8 and float32 images, float64 for float64), with Python numbers cast to that
// dtype; we run the same operations in the same order per pixel (the data layer is compiled with
// -ffp-contract=off, so nothing is fused that torch rounds twice):
//   gray    = (0.2989 r + 0.587 g) + 0.114 b, cast to the image dtype (uint8: truncated);
//   _blend  = clamp(float(ratio) x + float(1 - ratio) y, 0, 1 or 255), cast (uint8: truncated);
//   brightness: _blend(x, 0, f); saturation: _blend(x, gray(x), f);
//   contrast: _blend(x, mean, f), mean = mean of gray(x) (one channel: of x) as float32 over each
//     image, sum / count: torch sums float32 in a cascade; we sum exactly (uint8 gray values are
//     integers, so torch's sum is exact too while it stays below 2^24, e.g. up to 256 x 256
//     pixels), and float images get the correctly rounded mean, within an ulp of torch's;
//   hue: uint8 / 255, _rgb2hsv, h = (h + f) mod 1, _hsv2rgb, uint8 * 255 truncated.
// One-channel images come back unchanged from saturation and hue, as in torchvision.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/transforms.h"
#include "data/transforms_detail.h"

namespace accel::data::transforms {

namespace {

using detail::Img;

// Pixel access to an image of `channels` channels: uint8 (H, W, C), or floating (N, C, H, W)
// with N the product of the leading dims.
template <typename T>
struct Pixels {
  T* data;
  bool hwc;
  int64_t n, channels, hw;
  T& at(int64_t b, int64_t k, int64_t i) const {
    return hwc ? data[i * channels + k] : data[(b * channels + k) * hw + i];
  }
};

template <typename T>
Pixels<T> pixels(const Img& m, const Tensor& t) {
  return {t.data<T>(), m.hwc, m.c / m.channels, m.channels, m.h * m.w};
}

template <typename A>
A gray_of(A r, A g, A b) {
  return (A(0.2989) * r + A(0.587) * g) + A(0.114) * b;
}

// The image dtype's value of a computed A: uint8 truncates (torch's .to(uint8)).
template <typename T, typename A>
T cast_to(A v) {
  return T(v);
}

template <typename T, typename A>
T blend(A x, A y, double ratio) {
  const A bound = std::is_same_v<T, uint8_t> ? A(255) : A(1);
  A v = A(ratio) * x + A(1.0 - ratio) * y;
  v = v < A(0) ? A(0) : (v > bound ? bound : v);  // clamp; NaN passes as in torch
  return cast_to<T>(v);
}

void check_channels(const Img& m, const char* op) {
  ACCEL_CHECK(m.channels == 1 || m.channels == 3, ShapeError, op,
              "expects an image of 1 or 3 channels, got ", m.channels, " (shape ", m.t.shape_str(),
              ")");
}

template <typename T, typename A>
void gray_kernel(const Img& m, const Tensor& out, int64_t out_channels) {
  const Pixels<T> in = pixels<T>(m, m.t);
  const Pixels<T> o{out.data<T>(), m.hwc, in.n, out_channels, in.hw};
  for (int64_t b = 0; b < in.n; ++b)
    for (int64_t i = 0; i < in.hw; ++i) {
      const T g =
          in.channels == 1
              ? in.at(b, 0, i)
              : cast_to<T>(gray_of(A(in.at(b, 0, i)), A(in.at(b, 1, i)), A(in.at(b, 2, i))));
      for (int64_t k = 0; k < out_channels; ++k) o.at(b, k, i) = g;
    }
}

// The dtype dispatch of every colour function: T the element type, A the computing type.
template <typename F>
Tensor by_type(const Tensor& image, const char* op, F&& f) {
  return detail::by_dtype(image, op, [&](const Img& m) {
    check_channels(m, op);
    switch (m.t.dtype()) {
      case kUInt8: return f(m, uint8_t{}, float{});
      case kFloat64: return f(m, double{}, double{});
      default: return f(m, float{}, float{});
    }
  });
}

template <typename T>
Tensor output_like(const Img& m, int64_t channels) {
  if (m.hwc) {
    return m.two_d && channels == 1 ? empty({m.h, m.w}, m.t.dtype())
                                    : empty({m.h, m.w, channels}, m.t.dtype());
  }
  Shape s = m.lead;
  if (m.two_d) {
    if (channels == 1) return empty({m.h, m.w}, m.t.dtype());
    s = {channels};
  } else {
    s.back() = channels;
  }
  s.push_back(m.h);
  s.push_back(m.w);
  return empty(s, m.t.dtype());
}

// torchvision's _rgb2hsv and _hsv2rgb for one pixel, operation for operation.
template <typename A>
void hue_shift(A& r, A& g, A& b, A hue) {
  const A maxc = std::max(std::max(r, g), b), minc = std::min(std::min(r, g), b);
  const bool eqc = maxc == minc;
  const A cr = maxc - minc;
  const A s = cr / (eqc ? A(1) : maxc);
  const A crd = eqc ? A(1) : cr;
  const A rc = (maxc - r) / crd, gc = (maxc - g) / crd, bc = (maxc - b) / crd;
  // Exactly one of the three masks is set; the other terms are zeros and add nothing.
  A h;
  if (maxc == r) {
    h = bc - gc;
  } else if (maxc == g) {
    h = (A(2) + rc) - bc;
  } else {
    h = (A(4) + gc) - rc;
  }
  h = std::fmod(h / A(6) + A(1), A(1));
  // (h + hue_factor) % 1.0: torch's remainder, fmod then + 1 for a negative result.
  h = h + hue;
  h = std::fmod(h, A(1));
  if (h != 0 && h < 0) h = h + A(1);
  const A v = maxc;
  const A h6 = h * A(6);
  const A fi = std::floor(h6);
  const A f = h6 - fi;
  int i = int(fi) % 6;
  if (i < 0) i += 6;
  auto clamp01 = [](A x) { return x < A(0) ? A(0) : (x > A(1) ? A(1) : x); };
  const A p = clamp01(v * (A(1) - s));
  const A q = clamp01(v * (A(1) - s * f));
  const A t = clamp01(v * (A(1) - s * (A(1) - f)));
  switch (i) {
    case 0: r = v, g = t, b = p; break;
    case 1: r = q, g = v, b = p; break;
    case 2: r = p, g = v, b = t; break;
    case 3: r = p, g = q, b = v; break;
    case 4: r = t, g = p, b = v; break;
    default: r = v, g = p, b = q;
  }
}

}  // namespace

Tensor rgb_to_grayscale(const Tensor& image, int64_t num_output_channels) {
  ACCEL_CHECK(num_output_channels == 1 || num_output_channels == 3, ValueError, "rgb_to_grayscale",
              "num_output_channels should be either 1 or 3, got ", num_output_channels);
  return by_type(image, "rgb_to_grayscale", [&](const Img& m, auto t, auto a) {
    using T = decltype(t);
    using A = decltype(a);
    Tensor out = output_like<T>(m, num_output_channels);
    gray_kernel<T, A>(m, out, num_output_channels);
    return out;
  });
}

Tensor adjust_brightness(const Tensor& image, double brightness_factor) {
  ACCEL_CHECK(brightness_factor >= 0, ValueError, "adjust_brightness", "brightness_factor (",
              brightness_factor, ") is not non-negative");
  return by_type(image, "adjust_brightness", [&](const Img& m, auto t, auto a) {
    using T = decltype(t);
    using A = decltype(a);
    Tensor out = detail::make_out(m, m.h, m.w, m.t.dtype());
    const T* s = m.t.data<T>();
    T* d = out.data<T>();
    for (int64_t i = 0; i < m.t.numel(); ++i) d[i] = blend<T, A>(A(s[i]), A(0), brightness_factor);
    return out;
  });
}

Tensor adjust_contrast(const Tensor& image, double contrast_factor) {
  ACCEL_CHECK(contrast_factor >= 0, ValueError, "adjust_contrast", "contrast_factor (",
              contrast_factor, ") is not non-negative");
  return by_type(image, "adjust_contrast", [&](const Img& m, auto t, auto a) {
    using T = decltype(t);
    using A = decltype(a);
    Tensor out = detail::make_out(m, m.h, m.w, m.t.dtype());
    const Pixels<T> in = pixels<T>(m, m.t), o = pixels<T>(m, out);
    for (int64_t b = 0; b < in.n; ++b) {
      // The mean of gray(x) (in the image dtype) per image, as float32 (float64 images: double).
      double sum = 0;
      for (int64_t i = 0; i < in.hw; ++i) {
        const T g =
            in.channels == 1
                ? in.at(b, 0, i)
                : cast_to<T>(gray_of(A(in.at(b, 0, i)), A(in.at(b, 1, i)), A(in.at(b, 2, i))));
        sum += double(A(g));
      }
      const A mean = A(sum) / A(double(in.hw));
      for (int64_t k = 0; k < in.channels; ++k)
        for (int64_t i = 0; i < in.hw; ++i)
          o.at(b, k, i) = blend<T, A>(A(in.at(b, k, i)), mean, contrast_factor);
    }
    return out;
  });
}

Tensor adjust_saturation(const Tensor& image, double saturation_factor) {
  ACCEL_CHECK(saturation_factor >= 0, ValueError, "adjust_saturation", "saturation_factor (",
              saturation_factor, ") is not non-negative");
  return by_type(image, "adjust_saturation", [&](const Img& m, auto t, auto a) {
    using T = decltype(t);
    using A = decltype(a);
    if (m.channels == 1) return image;  // as torchvision (PIL's behaviour)
    Tensor out = detail::make_out(m, m.h, m.w, m.t.dtype());
    const Pixels<T> in = pixels<T>(m, m.t), o = pixels<T>(m, out);
    for (int64_t b = 0; b < in.n; ++b)
      for (int64_t i = 0; i < in.hw; ++i) {
        const A r = A(in.at(b, 0, i)), g = A(in.at(b, 1, i)), bl = A(in.at(b, 2, i));
        const A gray = A(cast_to<T>(gray_of(r, g, bl)));
        o.at(b, 0, i) = blend<T, A>(r, gray, saturation_factor);
        o.at(b, 1, i) = blend<T, A>(g, gray, saturation_factor);
        o.at(b, 2, i) = blend<T, A>(bl, gray, saturation_factor);
      }
    return out;
  });
}

Tensor adjust_hue(const Tensor& image, double hue_factor) {
  ACCEL_CHECK(hue_factor >= -0.5 && hue_factor <= 0.5, ValueError, "adjust_hue", "hue_factor (",
              hue_factor, ") is not in [-0.5, 0.5]");
  return by_type(image, "adjust_hue", [&](const Img& m, auto t, auto a) {
    using T = decltype(t);
    using A = decltype(a);
    if (m.channels == 1) return image;  // as torchvision (PIL's behaviour)
    Tensor out = detail::make_out(m, m.h, m.w, m.t.dtype());
    const Pixels<T> in = pixels<T>(m, m.t), o = pixels<T>(m, out);
    constexpr bool u8 = std::is_same_v<T, uint8_t>;
    for (int64_t b = 0; b < in.n; ++b)
      for (int64_t i = 0; i < in.hw; ++i) {
        A c[3];
        for (int k = 0; k < 3; ++k) {
          c[k] = A(in.at(b, k, i));
          if constexpr (u8) c[k] = c[k] / A(255);
        }
        hue_shift<A>(c[0], c[1], c[2], A(hue_factor));
        for (int k = 0; k < 3; ++k) o.at(b, k, i) = u8 ? cast_to<T>(c[k] * A(255)) : T(c[k]);
      }
    return out;
  });
}

}  // namespace accel::data::transforms
