#include "data/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"

namespace accel::data {

namespace {

Tensor to_tensor(const DecodedImage& img) {
  Tensor t = empty({img.height, img.width, img.channels}, kUInt8);
  if (!img.pixels.empty()) std::memcpy(t.data_ptr(), img.pixels.data(), img.pixels.size());
  return t;
}

// (H, W) or (H, W, C) uint8 on the CPU, contiguous; returns C.
Tensor hwc_u8(const Tensor& image, const char* op, int64_t max_c, int64_t* c) {
  ACCEL_CHECK(image.defined(), ValueError, op, "image is undefined");
  ACCEL_CHECK(image.dtype() == kUInt8, DTypeError, op,
              "expects a uint8 (H, W) or (H, W, C) image, got ", image.dtype(),
              " (floating (C, H, W) images go through save_image)");
  ACCEL_CHECK(image.dim() == 2 || image.dim() == 3, ShapeError, op,
              "expects a uint8 (H, W) or (H, W, C) image, got shape ", image.shape_str());
  *c = image.dim() == 2 ? 1 : image.size(2);
  ACCEL_CHECK(*c >= 1 && *c <= max_c && (max_c != 3 || *c != 2), ShapeError, op, "image ",
              image.shape_str(), " has ", *c, " channels; ",
              max_c == 4 ? "PNG takes 1 to 4" : "JPEG takes 1 or 3");
  return image.cpu().contiguous();
}

}  // namespace

Tensor decode_image(const uint8_t* data, size_t size, const std::string& what,
                    const ImageOptions& options) {
  return to_tensor(decode_image_bytes(data, size, what, options.limits()));
}

Tensor read_image(const std::string& path, const ImageOptions& options) {
  const std::string bytes = file_io::read_file(path, "read_image", options.max_file_bytes);
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path, options);
}

std::string encode_png(const Tensor& image, int compression) {
  int64_t c = 0;
  Tensor t = hwc_u8(image, "encode_png", 4, &c);
  return encode_png_bytes(static_cast<const uint8_t*>(t.data_ptr()), t.size(0), t.size(1), c,
                          "<png>", compression);
}

std::string encode_jpeg(const Tensor& image, int quality) {
  int64_t c = 0;
  Tensor t = hwc_u8(image, "encode_jpeg", 3, &c);
  return encode_jpeg_bytes(static_cast<const uint8_t*>(t.data_ptr()), t.size(0), t.size(1), c,
                           "<jpeg>", quality);
}

void write_png(const Tensor& image, const std::string& path, int compression) {
  int64_t c = 0;
  Tensor t = hwc_u8(image, "write_png", 4, &c);
  const std::string bytes = encode_png_bytes(static_cast<const uint8_t*>(t.data_ptr()), t.size(0),
                                             t.size(1), c, path, compression);
  file_io::write_file_atomic(path, bytes, "write_png", /*durable=*/false);
}

void write_jpeg(const Tensor& image, const std::string& path, int quality) {
  int64_t c = 0;
  Tensor t = hwc_u8(image, "write_jpeg", 3, &c);
  const std::string bytes = encode_jpeg_bytes(static_cast<const uint8_t*>(t.data_ptr()), t.size(0),
                                              t.size(1), c, path, quality);
  file_io::write_file_atomic(path, bytes, "write_jpeg", /*durable=*/false);
}

// Note [make_grid]: torchvision.utils.make_grid step by step, computed in float32 on the CPU
// (images are small; the batch is copied once): 1-channel -> 3 channels, optional normalisation
// (clamp to the range, subtract low, divide by max(high - low, 1e-5)), then a canvas of
// (C, ymaps * (H + p) + p, xmaps * (W + p) + p) filled with pad_value and image k pasted at
// row k / xmaps, column k % xmaps, xmaps = min(nrow, B).
Tensor make_grid(const Tensor& images, const GridOptions& o) {
  const char* op = "make_grid";
  ACCEL_CHECK(images.defined(), ValueError, op, "images is undefined");
  ACCEL_CHECK(images.is_floating_point(), DTypeError, op,
              "expects floating images (values in [0, 1] or a value_range), got ", images.dtype());
  ACCEL_CHECK(images.dim() >= 2 && images.dim() <= 4, ShapeError, op,
              "expects (B, C, H, W), (C, H, W) or (H, W), got ", images.shape_str());
  ACCEL_CHECK(o.nrow >= 1, ValueError, op, "nrow must be >= 1, got ", o.nrow);
  ACCEL_CHECK(o.padding >= 0, ValueError, op, "padding must be >= 0, got ", o.padding);
  Tensor x = images.detach().to(kCPU, kFloat32);
  if (x.dim() == 2) x = x.unsqueeze(0);
  if (x.dim() == 3) x = x.unsqueeze(0);
  const int64_t b = x.size(0), c_in = x.size(1), h = x.size(2), w = x.size(3);
  ACCEL_CHECK(b >= 1 && h >= 1 && w >= 1 && c_in >= 1, ShapeError, op, "empty images ",
              images.shape_str());
  const int64_t c = c_in == 1 ? 3 : c_in;
  // Owned float copy, (B, C, H, W) contiguous, channels repeated when c_in == 1.
  Tensor buf = empty({b, c, h, w}, kFloat32);
  buf.copy_(x.expand({b, c, h, w}));
  float* p = buf.data<float>();
  const int64_t per = c * h * w;
  if (o.normalize) {
    auto norm = [&](float* q, int64_t n) {
      double lo, hi;
      if (o.value_range) {
        lo = o.value_range->first;
        hi = o.value_range->second;
      } else {
        lo = *std::min_element(q, q + n);
        hi = *std::max_element(q, q + n);
      }
      const float flo = float(lo), fhi = float(hi);
      const float den = float(std::max(hi - lo, 1e-5));
      for (int64_t i = 0; i < n; ++i) q[i] = (std::clamp(q[i], flo, fhi) - flo) / den;
    };
    if (o.scale_each) {
      for (int64_t k = 0; k < b; ++k) norm(p + k * per, per);
    } else {
      norm(p, b * per);
    }
  }
  if (b == 1) return buf.squeeze(0);
  const int64_t pad = o.padding;
  const int64_t xmaps = std::min(o.nrow, b), ymaps = (b + xmaps - 1) / xmaps;
  const int64_t gh = ymaps * (h + pad) + pad, gw = xmaps * (w + pad) + pad;
  Tensor grid = full({c, gh, gw}, o.pad_value, kFloat32);
  float* g = grid.data<float>();
  for (int64_t k = 0; k < b; ++k) {
    const int64_t y0 = (k / xmaps) * (h + pad) + pad, x0 = (k % xmaps) * (w + pad) + pad;
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        std::memcpy(g + (ch * gh + y0 + y) * gw + x0, p + k * per + (ch * h + y) * w,
                    size_t(w) * sizeof(float));
  }
  return grid;
}

void save_image(const Tensor& images, const std::string& path, const GridOptions& o) {
  Tensor grid = make_grid(images, o).contiguous();  // (C, H, W) float32 CPU
  const int64_t c = grid.size(0), h = grid.size(1), w = grid.size(2);
  ACCEL_CHECK(c >= 1 && c <= 4, ShapeError, "save_image", "a grid of ", c,
              " channels cannot be a PNG (1 to 4); images ", images.shape_str());
  const float* g = grid.data<float>();
  std::vector<uint8_t> hwc(size_t(c * h * w));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < h * w; ++i) {
      // torchvision: mul(255).add_(0.5).clamp_(0, 255).to(uint8) (truncation); NaN -> 0.
      float v = g[ch * h * w + i] * 255.0f + 0.5f;
      v = v >= 0.0f ? std::min(v, 255.0f) : 0.0f;
      hwc[size_t(i * c + ch)] = uint8_t(v);
    }
  const std::string bytes = encode_png_bytes(hwc.data(), h, w, c, path);
  file_io::write_file_atomic(path, bytes, "save_image", /*durable=*/false);
}

void save_image(const Tensor& images, const std::string& path, int64_t nrow, int64_t padding,
                bool normalize, std::optional<std::pair<double, double>> value_range) {
  GridOptions o;
  o.nrow = nrow;
  o.padding = padding;
  o.normalize = normalize;
  o.value_range = value_range;
  save_image(images, path, o);
}

}  // namespace accel::data
