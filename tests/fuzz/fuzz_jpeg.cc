// Fuzz target: the JPEG decoder (libjpeg-turbo behind data/image_codec.cc) on arbitrary bytes.
// IoError is the documented failure (Note [hostile images]): corrupt data, truncation and
// oversized frames are errors, never an abort, a grey-filled image or a read out of bounds. A
// decoded image must survive our JPEG encoder and decode again to the same size.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::data;
  ImageLimits limits;
  limits.max_pixels = int64_t(1) << 16;
  limits.max_memory = int64_t(64) << 20;
  for (ImageMode mode : {ImageMode::kAny, ImageMode::kGray}) {
    limits.mode = mode;
    try {
      const DecodedImage img = decode_jpeg_bytes(data, size, "<fuzz>", limits);
      if (img.height < 1 || img.width < 1 || img.height * img.width > limits.max_pixels)
        std::abort();
      if (img.channels != 1 && img.channels != 3) std::abort();
      if (mode == ImageMode::kGray && img.channels != 1) std::abort();
      if (img.pixels.size() != size_t(img.height * img.width * img.channels)) std::abort();
      const std::string jpg =
          encode_jpeg_bytes(img.pixels.data(), img.height, img.width, img.channels, "<fuzz>", 75);
      ImageLimits any = limits;
      any.mode = ImageMode::kAny;
      const DecodedImage back = decode_jpeg_bytes(reinterpret_cast<const uint8_t*>(jpg.data()),
                                                  jpg.size(), "<fuzz round trip>", any);
      if (back.height != img.height || back.width != img.width || back.channels != img.channels)
        std::abort();
    } catch (const accel::IoError&) {
    }
  }
  return 0;
}
