// Fuzz target: the PNG decoder (libpng behind data/image_codec.cc) on arbitrary bytes. IoError
// is the documented failure (Note [hostile images]); anything else escaping, a sanitizer report,
// an abort from libpng or a broken invariant is a bug. A decoded image must survive our encoder
// and decode to the same pixels.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::data;
  ImageLimits limits;
  limits.max_pixels = int64_t(1) << 16;  // small, so the size check is reached by short inputs
  limits.max_memory = int64_t(64) << 20;
  for (ImageMode mode : {ImageMode::kAny, ImageMode::kRGB}) {
    limits.mode = mode;
    try {
      const DecodedImage img = decode_png_bytes(data, size, "<fuzz>", limits);
      if (img.height < 1 || img.width < 1 || img.height * img.width > limits.max_pixels)
        std::abort();
      if (img.channels < 1 || img.channels > 4) std::abort();
      if (mode == ImageMode::kRGB && img.channels != 3) std::abort();
      if (img.pixels.size() != size_t(img.height * img.width * img.channels)) std::abort();
      const std::string png =
          encode_png_bytes(img.pixels.data(), img.height, img.width, img.channels, "<fuzz>", 1);
      ImageLimits any = limits;
      any.mode = ImageMode::kAny;
      const DecodedImage back = decode_png_bytes(reinterpret_cast<const uint8_t*>(png.data()),
                                                 png.size(), "<fuzz round trip>", any);
      if (back.channels != img.channels || back.pixels != img.pixels) std::abort();
    } catch (const accel::IoError&) {
    }
  }
  return 0;
}
