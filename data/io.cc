#include "data/io.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace accel::data {

std::vector<uint8_t> read_file_bytes(const std::string& path, bool decompress_gzip,
                                     size_t max_bytes) {
  file_io::ReadableFile f =
      file_io::open_read(path, "read_file", decompress_gzip ? gzip_file_cap(max_bytes) : max_bytes);
  const size_t size = size_t(f.size);
  std::vector<uint8_t> buf(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(f.fd.get(), buf.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    ACCEL_CHECK(r >= 0, IoError, "read_file", "error reading '", path, "': ", std::strerror(errno));
    if (r == 0) break;  // file shrank under us
    got += size_t(r);
  }
  ACCEL_CHECK(got == size, IoError, "read_file", "'", path, "' shrank while reading: expected ",
              size, " bytes, got ", got);
  if (decompress_gzip && is_gzip(buf.data(), buf.size()))
    return gunzip(buf.data(), buf.size(), path, max_bytes);
  ACCEL_CHECK(buf.size() <= max_bytes, IoError, "read_file", "'", path, "' is ", buf.size(),
              " bytes, more than the limit of ", max_bytes);
  return buf;
}

// Note [bounded inflation]
// deflate reaches ~1032:1, so a 2 MB .gz can hold 2 GB. Inflating "everything, then check" lets
// a tiny hostile file exhaust memory before any check runs. GzipStream therefore hands out
// inflated bytes on demand, in chunks, and the output buffer grows only with what zlib actually
// produced: a reader asks for exactly the bytes its header declares (plus one, to detect
// trailing data), and gunzip() stops at max_bytes. Every member's CRC and length are still
// checked by zlib when its trailer is reached.
namespace {
constexpr size_t kInflateChunk = size_t(1) << 20;
// The first chunks are small and grow with the output, so a short stream behind a header that
// declares gigabytes costs kilobytes, not a zero-filled megabyte.
constexpr size_t kInflateMinChunk = size_t(4) << 10;
constexpr size_t kZlibMaxIn = size_t(1) << 30;  // zlib counts in uInt
}  // namespace

GzipStream::GzipStream(const uint8_t* data, size_t size, std::string what)
    : data_(data), size_(size), what_(std::move(what)) {
  auto* zs = new z_stream{};
  // 15 + 16: gzip wrapper only (a zlib or raw stream behind a gzip magic is garbage here).
  if (inflateInit2(zs, 15 + 16) != Z_OK) {
    delete zs;
    ACCEL_THROW(IoError, "gunzip", "zlib init failed for '", what_, "'");
  }
  zs_ = zs;
}

GzipStream::~GzipStream() {
  auto* zs = static_cast<z_stream*>(zs_);
  inflateEnd(zs);
  delete zs;
}

size_t GzipStream::read(size_t n, std::vector<uint8_t>& out) {
  auto* zs = static_cast<z_stream*>(zs_);
  size_t got = 0;
  while (got < n && !done_) {
    if (member_end_) {
      if (consumed_ == size_) {
        done_ = true;
        break;
      }
      // Another gzip member follows (concatenated .gz files are valid gzip); anything else after
      // the stream is trailing garbage.
      ACCEL_CHECK(is_gzip(data_ + consumed_, size_ - consumed_), IoError, "gunzip", "'", what_,
                  "': ", size_ - consumed_, " bytes of trailing garbage after the gzip stream");
      ACCEL_CHECK(inflateReset(zs) == Z_OK, IoError, "gunzip", "zlib reset failed for '", what_,
                  "'");
      member_end_ = false;
    }
    const size_t want = std::min({n - got, kInflateChunk, std::max(kInflateMinChunk, out.size())});
    const size_t old = out.size();
    out.resize(old + want);
    zs->next_out = out.data() + old;
    zs->avail_out = uInt(want);
    zs->next_in = const_cast<Bytef*>(data_ + consumed_);
    zs->avail_in = uInt(std::min(size_ - consumed_, kZlibMaxIn));
    const size_t in_before = zs->avail_in;
    const int rc = inflate(zs, Z_NO_FLUSH);
    const size_t made = want - zs->avail_out;
    out.resize(old + made);
    consumed_ += in_before - zs->avail_in;
    got += made;
    produced_ += made;
    if (rc == Z_STREAM_END) {
      member_end_ = true;
      continue;
    }
    ACCEL_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, IoError, "gunzip", "'", what_,
                "': corrupt gzip data at compressed byte ", consumed_, ": ",
                zs->msg ? zs->msg : "zlib error");
    // All input consumed, room left for output, and still no stream end: the file was cut short.
    ACCEL_CHECK(!(consumed_ == size_ && zs->avail_out != 0), IoError, "gunzip", "'", what_,
                "': truncated gzip stream (", size_, " compressed bytes, ", produced_,
                " inflated before the end)");
  }
  return got;
}

std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& what,
                            size_t max_bytes) {
  GzipStream s(data, size, what);
  std::vector<uint8_t> out;
  // The trailer's ISIZE is the uncompressed size mod 2^32 of the last member: a good first guess,
  // but only a guess (a hostile trailer may claim 4 GB), so never beyond the limit or ~1032:1.
  if (size >= 18) {
    uint32_t isize;
    std::memcpy(&isize, data + size - 4, 4);
    out.reserve(std::min({size_t(isize), size * 1032, max_bytes}) + 1);
  }
  const size_t ask = max_bytes == kNoSizeLimit ? max_bytes : max_bytes + 1;
  s.read(ask, out);
  ACCEL_CHECK(out.size() <= max_bytes, IoError, "gunzip", "'", what, "' inflates to more than ",
              max_bytes, " bytes (the limit); stopped there");
  return out;
}

}  // namespace accel::data
