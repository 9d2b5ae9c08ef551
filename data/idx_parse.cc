#include "data/idx_parse.h"

#include <sstream>

#include "core/error.h"
#include "data/io.h"

namespace accel::data {

namespace {

constexpr size_t kMagicBytes = 4;
constexpr size_t kDimBytes = 4;
// A sanity bound on the element count (2^48 elements is 256 TB of bytes): a header beyond it is
// corrupt, whatever the file size.
constexpr int64_t kMaxElements = int64_t(1) << 48;
// deflate's largest ratio is 1032:1 (a 258-byte match in 2 bits); with gzip framing a stream of
// c compressed bytes inflates to less than c * 1032 + this.
constexpr size_t kMaxInflateRatio = 1032;
constexpr size_t kInflateSlack = 4096;

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// The header checks shared by raw and gzip input; `b` holds at least the 4 magic bytes.
void check_magic(const uint8_t* b, const std::string& what) {
  ACCEL_CHECK(b[0] == 0 && b[1] == 0, IoError, "idx", "'", what, "': bad magic ",
              idx_hex(load_be32(b), 8), " (IDX files start with two zero bytes)");
  ACCEL_CHECK(idx_elem_size(b[2]) != 0, IoError, "idx", "'", what, "': unknown element type ",
              idx_hex(b[2], 2), " in magic ", idx_hex(load_be32(b), 8));
  ACCEL_CHECK(b[3] >= 1, IoError, "idx", "'", what, "': magic ", idx_hex(load_be32(b), 8),
              " declares 0 dimensions");
}

// Fills type, dims, numel and data_offset from a complete header; returns the payload bytes the
// header declares.
size_t read_header(const uint8_t* b, const std::string& what, IdxData& f) {
  f.type = b[2];
  const int ndim = b[3];
  f.data_offset = kMagicBytes + kDimBytes * size_t(ndim);
  int64_t numel = 1;
  bool too_big = false;
  for (int d = 0; d < ndim; ++d) {
    const int64_t n = int64_t(load_be32(b + kMagicBytes + kDimBytes * size_t(d)));
    f.dims.push_back(n);
    // Checked before it can wrap: with dims up to 2^32 - 1 an unchecked product overflows int64
    // (65536^4 wraps to 0, which would describe 2^64 elements in 0 bytes).
    too_big |= __builtin_mul_overflow(numel, n, &numel) || numel > kMaxElements;
  }
  // A zero dimension makes everything else irrelevant: the tensor is empty.
  for (int64_t n : f.dims) too_big &= n != 0;
  ACCEL_CHECK(!too_big, IoError, "idx", "'", what, "': header dimensions ", f.dims,
              " hold more than 2^48 elements (corrupt header?)");
  f.numel = numel;
  // numel <= 2^48 and the element size <= 8: the byte count cannot overflow.
  return size_t(numel) * idx_elem_size(f.type);
}

// What the header declares, against what the caller can hold (Note [bounded inflation] in io.cc).
void check_limit(const IdxData& f, size_t expected, size_t max_bytes, const std::string& what) {
  ACCEL_CHECK(expected <= max_bytes, IoError, "idx", "'", what, "': header says ", f.dims, " ",
              idx_type_name(f.type), " = ", expected, " data bytes, more than the limit of ",
              max_bytes, " bytes (IdxOptions::max_bytes)");
}

void check_payload(const IdxData& f, size_t expected, size_t payload, const std::string& what) {
  ACCEL_CHECK(payload == expected, IoError, "idx", "'", what, "': header says ", f.dims, " ",
              idx_type_name(f.type), " = ", expected, " data bytes, file has ", payload,
              payload < expected ? " (truncated)" : " (trailing bytes)");
}

IdxData parse_raw(std::vector<uint8_t> file, const std::string& what, size_t max_bytes) {
  IdxData f;
  const size_t size = file.size();
  const uint8_t* b = file.data();
  ACCEL_CHECK(size >= kMagicBytes, IoError, "idx", "'", what, "' is ", size,
              " bytes, too short for the 4-byte IDX magic");
  check_magic(b, what);
  const size_t header = kMagicBytes + kDimBytes * size_t(b[3]);
  ACCEL_CHECK(size >= header, IoError, "idx", "'", what, "': truncated header: ", int(b[3]),
              " dimensions need ", header, " header bytes, file has ", size);
  const size_t expected = read_header(b, what, f);
  check_limit(f, expected, max_bytes, what);
  check_payload(f, expected, size - f.data_offset, what);
  f.bytes = std::move(file);
  return f;
}

IdxData parse_gzip(const std::vector<uint8_t>& file, const std::string& what, size_t max_bytes) {
  IdxData f;
  GzipStream s(file.data(), file.size(), what);
  std::vector<uint8_t>& out = f.bytes;
  const size_t got = s.read(kMagicBytes, out);
  ACCEL_CHECK(got == kMagicBytes, IoError, "idx", "'", what, "' inflates to ", got,
              " bytes, too short for the 4-byte IDX magic");
  check_magic(out.data(), what);
  const size_t header = kMagicBytes + kDimBytes * size_t(out[3]);
  s.read(header - kMagicBytes, out);
  ACCEL_CHECK(out.size() == header, IoError, "idx", "'", what, "': truncated header: ", int(out[3]),
              " dimensions need ", header, " header bytes, file has ", out.size());
  const size_t expected = read_header(out.data(), what, f);
  // Before inflating the payload: within the caller's limit, and within what the compressed
  // bytes can hold at all (a short stream behind a huge header fails now, not gigabytes later).
  check_limit(f, expected, max_bytes, what);
  ACCEL_CHECK(expected / kMaxInflateRatio <= file.size() + kInflateSlack, IoError, "idx", "'", what,
              "': header says ", f.dims, " ", idx_type_name(f.type), " = ", expected,
              " data bytes, more than ", file.size(),
              " compressed bytes can inflate to (truncated)");
  // Exactly the declared payload, then one byte more: present means trailing data, and the
  // stream is never inflated beyond that (Note [bounded inflation] in io.cc).
  s.read(expected, out);
  size_t payload = out.size() - header;
  if (payload == expected) payload += s.read(1, out);
  check_payload(f, expected, payload, what);
  return f;
}

}  // namespace

size_t idx_elem_size(uint8_t type) {
  switch (type) {
    case kIdxUByte:
    case kIdxSByte: return 1;
    case kIdxShort: return 2;
    case kIdxInt:
    case kIdxFloat: return 4;
    case kIdxDouble: return 8;
    default: return 0;
  }
}

const char* idx_type_name(uint8_t type) {
  switch (type) {
    case kIdxUByte: return "ubyte";
    case kIdxSByte: return "byte";
    case kIdxShort: return "short";
    case kIdxInt: return "int";
    case kIdxFloat: return "float";
    case kIdxDouble: return "double";
    default: return "unknown";
  }
}

std::string idx_hex(uint32_t v, int digits) {
  std::ostringstream os;
  os << "0x" << std::hex;
  os.width(digits);
  os.fill('0');
  os << v;
  return os.str();
}

IdxData parse_idx_bytes(std::vector<uint8_t> file, const std::string& what, size_t max_bytes) {
  if (is_gzip(file.data(), file.size())) return parse_gzip(file, what, max_bytes);
  return parse_raw(std::move(file), what, max_bytes);
}

}  // namespace accel::data
