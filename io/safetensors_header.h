// The safetensors header checks without tensors or file I/O, so the loader and the fuzz target
// (tests/fuzz/fuzz_safetensors.cc) run the same code. See Note [safetensors validation].
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace accel::io::detail {

// Largest header accepted: io::kSafetensorsMaxHeaderBytes (safetensors.h, which this header
// cannot include without pulling in tensors; a static_assert keeps the two equal).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Nesting depth accepted in the header JSON. A valid header is 3 deep (root object, tensor entry,
// shape array); one level of slack allows an unknown key with an array or object value.
constexpr int kSafetensorsMaxDepth = 4;
// Dimensions accepted per tensor: bounds the memory a long shape array can make us allocate.
constexpr size_t kSafetensorsMaxRank = 64;
constexpr size_t kSafetensorsLengthBytes = 8;

struct SafetensorsEntry {
  std::string name;
  DType dtype = kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the byte buffer
};

// The header length from the 8 little-endian length bytes; IoError naming `path` unless it is
// within kMaxHeaderBytes and the `file_size - 8` bytes that follow.
uint64_t safetensors_header_length(const unsigned char* len_bytes, uint64_t file_size,
                                   const std::string& path);

// Validates the header JSON against a byte buffer of `buffer_size` bytes (steps 2-6 of Note
// [safetensors validation]) and returns the entries sorted by offset, tiling the buffer exactly.
// `metadata`, when given, receives the __metadata__ strings (only on success). IoError naming
// `path` for every violation. Memory use is linear in the header size with a small factor: the
// JSON is read as a stream of events (no document tree), nesting is limited to
// kSafetensorsMaxDepth and shapes to kSafetensorsMaxRank dimensions.
std::vector<SafetensorsEntry> parse_safetensors_header(
    std::string_view header, uint64_t buffer_size, const std::string& path,
    std::map<std::string, std::string>* metadata);

}  // namespace accel::io::detail
