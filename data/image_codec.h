// PNG and JPEG without tensors: decoding bytes to 8-bit pixels and encoding pixels to bytes, on
// libpng and libjpeg-turbo. Kept apart from image.cc so the fuzz targets
// (tests/fuzz/fuzz_png.cc, fuzz_jpeg.cc) build from this file alone.
//
// Note [hostile images]
// Every decode failure is an accel::IoError naming `what` (the file) and what is wrong: a bad
// signature, a truncated stream, a corrupt chunk or scan, dimensions whose pixel count exceeds
// ImageLimits::max_pixels (checked from the header, before any pixel memory is allocated). The C
// libraries report errors by longjmp; each call into them runs in a small function that holds no
// C++ object across the setjmp (the output buffer is allocated between the header and pixel
// phases, outside any protected region), so a longjmp never skips a destructor. JPEG warnings
// (corrupt data the library would paper over with grey, a premature end of file) are errors
// too: a truncated JPEG is refused, as PIL does without LOAD_TRUNCATED_IMAGES. Progressive JPEGs
// are limited to kMaxJpegScans scans, and libjpeg's working memory to ImageLimits::max_memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accel::data {

// Channel layout of decoded pixels. kAny keeps the file's own (1 gray, 2 gray+alpha, 3 RGB,
// 4 RGBA); the others convert exactly like PIL's Image.convert: gray -> RGB repeats the value,
// RGB -> gray is L = (19595 R + 38470 G + 7471 B + 2^15) >> 16 (ITU-R 601-2 luma in PIL's fixed
// point), alpha is dropped (not composited) or added as 255. CMYK JPEGs become RGB as in PIL.
enum class ImageMode { kAny, kGray, kRGB, kRGBA };

// PIL's default decompression-bomb bound (Image.MAX_IMAGE_PIXELS).
inline constexpr int64_t kDefaultMaxPixels = 89478485;
inline constexpr int kMaxJpegScans = 1000;

struct ImageLimits {
  int64_t max_pixels = kDefaultMaxPixels;  // width * height above this is an IoError
  int64_t max_memory = int64_t(2) << 30;   // libjpeg working memory (progressive buffers)
  ImageMode mode = ImageMode::kRGB;
};

struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels, row-major HWC
};

enum class ImageFormat { kUnknown, kPng, kJpeg };
// From the leading bytes (PNG signature, JPEG SOI marker FF D8 FF).
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

DecodedImage decode_png_bytes(const uint8_t* data, size_t size, const std::string& what,
                              const ImageLimits& limits = {});
DecodedImage decode_jpeg_bytes(const uint8_t* data, size_t size, const std::string& what,
                               const ImageLimits& limits = {});
// By sniffed format; IoError for anything else.
DecodedImage decode_image_bytes(const uint8_t* data, size_t size, const std::string& what,
                                const ImageLimits& limits = {});

// Converts HWC 8-bit pixels between channel counts 1..4 as ImageMode says (kAny: unchanged).
DecodedImage convert_image(DecodedImage img, ImageMode mode);

// Encoders: `pixels` is height * width * channels bytes, HWC. PNG takes 1..4 channels
// (gray, gray+alpha, RGB, RGBA), JPEG 1 or 3. ValueError for bad sizes; IoError (naming `what`)
// if the library fails.
std::string encode_png_bytes(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels,
                             const std::string& what, int compression = 6);
std::string encode_jpeg_bytes(const uint8_t* pixels, int64_t height, int64_t width,
                              int64_t channels, const std::string& what, int quality = 90);

}  // namespace accel::data
