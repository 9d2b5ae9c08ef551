// Images as tensors: PNG/JPEG files <-> uint8 (H, W, C) tensors, and torchvision's make_grid /
// save_image. Decoding is data/image_codec.h (libpng, libjpeg-turbo) with its limits; every
// failure to read or decode a file is an IoError naming the file (Note [hostile images]).
//
// Layout convention (data/transforms.h relies on it): a uint8 image is (H, W, C) or (H, W), like
// a PIL image or a numpy array; a floating image is (C, H, W) (or (B, C, H, W)), like a torchvision
// tensor after ToTensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "data/image_codec.h"

namespace accel::data {

struct ImageOptions {
  ImageMode mode = ImageMode::kRGB;  // PIL's .convert("RGB") by default, as ImageFolder does
  int64_t max_pixels = kDefaultMaxPixels;
  int64_t max_memory = int64_t(2) << 30;
  uint64_t max_file_bytes = uint64_t(256) << 20;  // larger files are refused before reading

  ImageLimits limits() const { return ImageLimits{max_pixels, max_memory, mode}; }
};

// Decodes a PNG or JPEG file (format from its signature, not its name) to a uint8 tensor of
// shape (H, W, C), C = 3 by default (see ImageOptions::mode; kGray gives C = 1). The file is
// read with core/file_io (regular files only, no FIFOs or devices, size capped).
Tensor read_image(const std::string& path, const ImageOptions& options = {});
// The same from bytes in memory; `what` names the source in errors.
Tensor decode_image(const uint8_t* data, size_t size, const std::string& what,
                    const ImageOptions& options = {});

// uint8 (H, W), (H, W, C) with C in 1..4 -> PNG bytes; (H, W) or (H, W, 1|3) -> JPEG bytes.
// DTypeError for other dtypes, ShapeError for other shapes.
std::string encode_png(const Tensor& image, int compression = 6);
std::string encode_jpeg(const Tensor& image, int quality = 90);
// Encode and write atomically (core/file_io AtomicFile: a temporary renamed over `path`).
void write_png(const Tensor& image, const std::string& path, int compression = 6);
void write_jpeg(const Tensor& image, const std::string& path, int quality = 90);

// torchvision.utils.make_grid: a floating (B, C, H, W) batch (or one (C, H, W) or (H, W) image)
// laid out in rows of `nrow` images with `padding` pixels of `pad_value` around each. One-channel
// images become three. normalize shifts each image (scale_each) or the whole batch to [0, 1] by
// its min and max, or by value_range (low, high) after clamping to it. A single image is returned
// as (C, H, W) without padding, as torchvision does.
struct GridOptions {
  int64_t nrow = 8;
  int64_t padding = 2;
  bool normalize = false;
  std::optional<std::pair<double, double>> value_range{};
  bool scale_each = false;
  double pad_value = 0.0;
};
Tensor make_grid(const Tensor& images, const GridOptions& options = {});

// torchvision.utils.save_image: make_grid, then x * 255 + 0.5 clamped to [0, 255] and truncated
// to uint8, written as a PNG (atomically). Accepts a batch or a single image, on any device.
void save_image(const Tensor& images, const std::string& path, const GridOptions& options = {});
// Positional form like torchvision's save_image(tensor, fp, nrow, padding, normalize, range).
void save_image(const Tensor& images, const std::string& path, int64_t nrow, int64_t padding = 2,
                bool normalize = false,
                std::optional<std::pair<double, double>> value_range = std::nullopt);

}  // namespace accel::data
