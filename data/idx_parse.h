// The IDX container without tensors: header checks and the payload bytes, raw or gzip. Kept
// apart from idx.cc so the fuzz target (tests/fuzz/fuzz_idx.cc) builds from a few sources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"

namespace accel::data {

// The most an IDX reader holds by default (IdxOptions::max_bytes): more than any IDX data set
// (EMNIST ByClass training images, the largest, are 0.55 GB).
inline constexpr size_t kIdxDefaultMaxBytes = size_t(1) << 30;

// IDX element type codes (third magic byte).
inline constexpr uint8_t kIdxUByte = 0x08, kIdxSByte = 0x09, kIdxShort = 0x0B, kIdxInt = 0x0C,
                         kIdxFloat = 0x0D, kIdxDouble = 0x0E;

// Bytes per element of an IDX type code; 0 for an unknown code.
size_t idx_elem_size(uint8_t type);
// "ubyte", "byte", "short", "int", "float", "double" or "unknown".
const char* idx_type_name(uint8_t type);
// "0x0803" style, zero-padded to `digits`.
std::string idx_hex(uint32_t v, int digits);

struct IdxData {
  uint8_t type = 0;
  Shape dims;
  int64_t numel = 0;           // product of dims; checked not to overflow
  std::vector<uint8_t> bytes;  // header + payload (inflated when the file was gzip)
  size_t data_offset = 0;      // payload start; bytes.size() - data_offset == numel * elem size
  const uint8_t* data() const { return bytes.data() + data_offset; }
};

// Checks the content of an IDX file (gzip-compressed or not) and returns it with the payload.
// IoError naming `what` for a bad magic, an unknown type, a truncated header, dimensions whose
// product or byte size overflows, a payload shorter or longer than the header says, or a broken
// gzip stream. A gzip file is inflated only up to the size its header declares (plus one byte to
// see that nothing follows), so a small file cannot expand to gigabytes first; and a header that
// declares more than max_bytes, or more than the compressed bytes can hold (deflate inflates at
// most ~1032:1), is an IoError before anything is inflated.
IdxData parse_idx_bytes(std::vector<uint8_t> file, const std::string& what,
                        size_t max_bytes = kIdxDefaultMaxBytes);

}  // namespace accel::data
