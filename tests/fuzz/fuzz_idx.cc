// Fuzz target: the IDX reader (raw and gzip) on arbitrary bytes. IoError is the documented
// failure; anything else escaping, a sanitizer report, or a broken invariant is a bug.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "data/idx_parse.h"
#include "data/io.h"

namespace {
constexpr size_t kGunzipLimit = size_t(64) << 10;
// A small IdxOptions::max_bytes, so that the limit check is reached by short inputs.
constexpr size_t kIdxLimit = size_t(1) << 16;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::data;
  try {
    const IdxData f = parse_idx_bytes(std::vector<uint8_t>(data, data + size), "<fuzz>", kIdxLimit);
    // What the readers rely on: the payload is exactly numel elements, and numel is the
    // product of the dimensions.
    int64_t numel = 1;
    bool zero = false;
    for (int64_t d : f.dims) zero |= d == 0;
    for (int64_t d : f.dims) {
      if (!zero && __builtin_mul_overflow(numel, d, &numel)) std::abort();
    }
    if ((zero ? 0 : numel) != f.numel) std::abort();
    if (f.bytes.size() - f.data_offset != size_t(f.numel) * idx_elem_size(f.type)) std::abort();
    if (f.bytes.size() - f.data_offset > kIdxLimit) std::abort();  // the declared limit holds
    // Touch the whole payload so a short buffer shows up under ASan.
    volatile uint8_t sink = 0;
    for (size_t i = f.data_offset; i < f.bytes.size(); ++i) sink = sink ^ f.bytes[i];
  } catch (const accel::IoError&) {
  }
  if (is_gzip(data, size)) {
    try {
      const std::vector<uint8_t> out = gunzip(data, size, "<fuzz>", kGunzipLimit);
      if (out.size() > kGunzipLimit) std::abort();
    } catch (const accel::IoError&) {
    }
  }
  return 0;
}
