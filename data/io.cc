#include "data/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace accel::data {

namespace {

std::string errno_str() { return std::strerror(errno); }

// Closes the descriptor on every exit path, including throws.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` read-only and returns its size; refuses directories and other non-files with a
// clear message instead of the EISDIR a later read() would give.
size_t open_regular(const std::string& path, const char* op, Fd& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ACCEL_CHECK(f.fd >= 0, IoError, op, "cannot open '", path, "': ", errno_str());
  struct stat st;
  ACCEL_CHECK(::fstat(f.fd, &st) == 0, IoError, op, "cannot stat '", path, "': ", errno_str());
  ACCEL_CHECK(S_ISREG(st.st_mode), IoError, op, "'", path, "' is not a regular file");
  return size_t(st.st_size);
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path, bool decompress_gzip) {
  Fd f;
  const size_t size = open_regular(path, "read_file", f);
  std::vector<uint8_t> buf(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(f.fd, buf.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    ACCEL_CHECK(r >= 0, IoError, "read_file", "error reading '", path, "': ", errno_str());
    if (r == 0) break;  // file shrank under us
    got += size_t(r);
  }
  ACCEL_CHECK(got == size, IoError, "read_file", "'", path, "' shrank while reading: expected ",
              size, " bytes, got ", got);
  if (decompress_gzip && is_gzip(buf.data(), buf.size()))
    return gunzip(buf.data(), buf.size(), path);
  return buf;
}

std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& what) {
  std::vector<uint8_t> out;
  // The trailer's ISIZE is the uncompressed size mod 2^32 of the last member: a good first guess.
  if (size >= 18) {
    uint32_t isize;
    std::memcpy(&isize, data + size - 4, 4);
    // deflate cannot exceed ~1032:1, so a lying trailer cannot make us reserve gigabytes.
    out.reserve(std::min<size_t>(size_t(isize), size * 1032) + 1);
  }
  z_stream zs{};
  // 15 + 16: gzip wrapper only (a zlib or raw stream behind a gzip magic is garbage here).
  ACCEL_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, IoError, "gunzip", "zlib init failed for '", what,
              "'");
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&zs};
  constexpr size_t kChunk = size_t(1) << 20;
  size_t consumed_total = 0;
  for (;;) {
    // zlib counts in uInt; feed at most 1 GiB at a time so huge files are fine.
    const size_t remaining = size - consumed_total;
    zs.avail_in = uInt(std::min<size_t>(remaining, size_t(1) << 30));
    zs.next_in = const_cast<Bytef*>(data + consumed_total);
    const size_t in_before = zs.avail_in;
    // Grow only when (nearly) full: an exact ISIZE guess must not double the buffer at the end.
    if (out.capacity() - out.size() < 4096) out.reserve(out.size() * 2 + kChunk);
    const size_t old = out.size();
    out.resize(out.capacity());
    zs.next_out = out.data() + old;
    zs.avail_out = uInt(std::min<size_t>(out.size() - old, size_t(1) << 30));
    const size_t out_before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.resize(old + (out_before - zs.avail_out));
    consumed_total += in_before - zs.avail_in;
    if (rc == Z_STREAM_END) {
      if (consumed_total == size) break;
      // Another gzip member follows (concatenated .gz files are valid gzip); anything else after
      // the stream is trailing garbage.
      ACCEL_CHECK(is_gzip(data + consumed_total, size - consumed_total), IoError, "gunzip", "'",
                  what, "': ", size - consumed_total,
                  " bytes of trailing garbage after the gzip stream");
      ACCEL_CHECK(inflateReset(&zs) == Z_OK, IoError, "gunzip", "zlib reset failed for '", what,
                  "'");
      continue;
    }
    ACCEL_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, IoError, "gunzip", "'", what,
                "': corrupt gzip data at compressed byte ", consumed_total, ": ",
                zs.msg ? zs.msg : "zlib error");
    // All input consumed, room left for output, and still no stream end: the file was cut short.
    ACCEL_CHECK(!(consumed_total == size && zs.avail_out != 0), IoError, "gunzip", "'", what,
                "': truncated gzip stream (", size, " compressed bytes, ", out.size(),
                " inflated before the end)");
  }
  return out;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  Fd f;
  size_ = open_regular(path, "mmap", f);
  if (size_ == 0) return;  // mmap of length 0 is invalid; an empty mapping is fine
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  ACCEL_CHECK(p != MAP_FAILED, IoError, "mmap", "cannot map '", path, "' (", size_,
              " bytes): ", errno_str());
  // Windows are read in random order; tell the kernel not to read ahead aggressively.
  ::madvise(p, size_, MADV_RANDOM);
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

}  // namespace accel::data
