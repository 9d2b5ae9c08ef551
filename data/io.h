// File helpers shared by the readers: whole-file reads with transparent gzip and bounded
// inflation. Every failure is an IoError whose message names the file and what is wrong. Files
// are opened as Note [safe file access] in core/file_io.h says: without blocking, regular files
// only (a FIFO or /dev/zero is an IoError before a byte is read), links to regular files followed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accel::data {

// No limit on the inflated size (callers that know better pass one).
inline constexpr size_t kNoSizeLimit = ~size_t(0);

// Reads the whole file. When it starts with the gzip magic (1f 8b) it is inflated (all members
// of a multi-member stream); a corrupt or truncated stream is an IoError naming the file, and so
// is one that inflates to more than `max_bytes` (inflation stops there: a small file cannot make
// us allocate gigabytes before being rejected). A file larger than max_bytes (plus the few bytes
// of gzip framing a compressed file may add) is refused before it is read.
std::vector<uint8_t> read_file_bytes(const std::string& path, bool decompress_gzip = true,
                                     size_t max_bytes = kNoSizeLimit);

// Inflates an in-memory gzip stream. `what` names the source in error messages; IoError as soon
// as the output would exceed `max_bytes`.
std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& what,
                            size_t max_bytes = kNoSizeLimit);

// Incremental inflation of an in-memory gzip stream (all members), for readers that learn from
// the first bytes how many to expect (Note [bounded inflation] in io.cc). `data` must outlive it.
class GzipStream {
 public:
  GzipStream(const uint8_t* data, size_t size, std::string what);
  ~GzipStream();
  GzipStream(const GzipStream&) = delete;
  GzipStream& operator=(const GzipStream&) = delete;

  // Appends up to n inflated bytes to `out` and returns how many; fewer than n only at the end
  // of the stream. Output memory grows with what was actually inflated, never with n.
  size_t read(size_t n, std::vector<uint8_t>& out);
  // Total inflated so far.
  size_t produced() const { return produced_; }

 private:
  const uint8_t* data_;
  size_t size_;
  std::string what_;
  size_t consumed_ = 0;
  size_t produced_ = 0;
  bool member_end_ = false;  // the current member ended; another may follow
  bool done_ = false;        // all input consumed at a member end
  void* zs_ = nullptr;       // z_stream, kept out of the header
};

inline bool is_gzip(const uint8_t* data, size_t size) {
  return size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
}

// The most a file of at most `max_bytes` of content may hold on disk when it is gzip: stored
// (incompressible) deflate blocks add 5 bytes per 64 KiB, gzip members 18 bytes each.
inline size_t gzip_file_cap(size_t max_bytes) {
  return max_bytes == kNoSizeLimit ? kNoSizeLimit : max_bytes + max_bytes / 256 + 4096;
}

}  // namespace accel::data
