// Test helpers of the data tests: fixture files (gzip, IDX, images); the scratch folder and file
// helpers are tests/common/util.h's.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data.h"
#include "tests/common/util.h"

namespace accel::data::testing {

using accel::test::TempDir;
using accel::test::write_file;

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  if (!b.empty()) std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

inline std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& in) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::vector<uint8_t> out(deflateBound(&zs, uLong(in.size())) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = uInt(in.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}

// An IDX file: magic 0 0 type ndim, big-endian dims, then `payload` as given.
inline std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b{0, 0, type, uint8_t(dims.size())};
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// Row values of a batch's field as int64 (for order comparisons).
inline std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }

}  // namespace accel::data::testing
