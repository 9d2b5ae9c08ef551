#include "parallel/checkpoint/crc.h"

#include <zlib.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace accel::dist::ckpt {

namespace {
// zlib's crc32 takes a uInt length: feed large buffers in pieces.
uint32_t crc_continue(uint32_t crc, const void* data, uint64_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  constexpr uint64_t kStep = uint64_t(1) << 30;
  while (n > 0) {
    const uint64_t k = std::min(n, kStep);
    crc = uint32_t(crc32(uLong(crc), p, uInt(k)));
    p += k;
    n -= k;
  }
  return crc;
}
}  // namespace

uint32_t piece_seed(const std::string& name, DType dtype, const Region& region) {
  nlohmann::json shape = nlohmann::json::array();
  for (int64_t s : region.global_shape()) shape.push_back(s);
  const std::string id = name + "|" + std::string(dtype_safetensors_name(dtype)) + "|" +
                         shape.dump() + "|" + region.to_json().dump();
  return crc_continue(0, id.data(), id.size());
}

uint32_t block_crc(uint32_t seed, const void* data, size_t n) {
  return crc_continue(seed, data, n);
}

std::vector<uint32_t> block_crcs(uint32_t seed, const void* data, uint64_t n,
                                 uint64_t block_bytes) {
  std::vector<uint32_t> out;
  out.reserve(size_t(block_count(n, block_bytes)));
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (uint64_t at = 0; at < n; at += block_bytes)
    out.push_back(crc_continue(seed, p + at, std::min(block_bytes, n - at)));
  return out;
}

uint32_t text_crc(std::string_view text) { return crc_continue(0, text.data(), text.size()); }

}  // namespace accel::dist::ckpt
