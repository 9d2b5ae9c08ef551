// The zip container of torch.save files, without tensors or file I/O (so the loader and the fuzz
// target tests/fuzz/fuzz_torch.cc run the same code). See Note [torch zip archives].
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace accel::io::detail {

// Reads exactly n bytes at `offset` into dst; false on a short read or an error (errno set for
// an error, 0 at the end of the data).
using ReadAt = std::function<bool(void* dst, size_t n, uint64_t offset)>;

// Bytes of untrusted origin: a file read with pread, or memory (the fuzz target, tests).
struct ByteSource {
  uint64_t size = 0;
  ReadAt read;
};

// The byte source over memory that outlives it.
ByteSource memory_source(const void* data, size_t n);

struct ZipEntry {
  std::string name;
  uint64_t header_offset = 0;  // of its local header
  uint64_t size = 0;           // stored: compressed size == uncompressed size
  uint32_t crc32 = 0;
};

// Largest central directory read (a torch file holds a few records per tensor; 64 MiB is about a
// million records).
constexpr uint64_t kZipMaxDirectoryBytes = uint64_t(64) << 20;

struct ZipDirectory {
  std::vector<ZipEntry> entries;  // in central directory order
  std::map<std::string, size_t, std::less<>> by_name;
  uint64_t central_offset = 0;  // every entry's bytes lie before it
  const ZipEntry* find(std::string_view name) const;
};

// Reads and checks the central directory (Note [torch zip archives], steps 1-3). IoError naming
// `path` and what is wrong.
ZipDirectory read_zip_directory(const ByteSource& src, const std::string& path, const char* op);

// The absolute offset of e's first data byte, after checking its local header (step 4).
uint64_t zip_data_offset(const ByteSource& src, const ZipDirectory& dir, const ZipEntry& e,
                         const std::string& path, const char* op);

// IoError unless the byte ranges [begin, end) do not overlap (step 5): a storage record read twice
// through two entries would let a small file make the loader allocate without bound.
void check_disjoint(std::vector<std::pair<uint64_t, uint64_t>> ranges, const std::string& path,
                    const char* op);

// zlib's CRC-32 (the zip checksum), continued from `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

// Sizes and offsets from this value on go to zip64 fields (the format's own limit, 0xFFFFFFFF);
// tests pass a small value to exercise the zip64 layout on small files.
constexpr uint64_t kZip64Threshold = 0xFFFFFFFFu;
// Where torch aligns record data (caffe2/serialize/inline_container.cc, kFieldAlignment).
constexpr uint64_t kZipAlignment = 64;

// Writes the zip layout torch.save writes (Note [writing torch zip archives]) to a sink: stored
// records whose data start at multiples of 64 bytes (padding in an "FB" extra field), each
// followed by a data descriptor, then the central directory, the zip64 end records and the end
// record. Records are written in the order they are given.
class ZipWriter {
 public:
  using Sink = std::function<void(const void* data, size_t n)>;
  explicit ZipWriter(Sink sink, uint64_t zip64_threshold = kZip64Threshold);

  // A record of exactly `size` bytes, given by write() calls between begin_record and end_record.
  void begin_record(const std::string& name, uint64_t size);
  void write(const void* data, size_t n);
  void end_record();
  void add_record(const std::string& name, std::string_view data);
  // The central directory and end records; nothing may be added afterwards.
  void finish();
  uint64_t bytes_written() const { return pos_; }

 private:
  struct Written {
    std::string name;
    uint64_t header_offset, size;
    uint32_t crc;
  };
  void put(const void* data, size_t n);
  Sink sink_;
  uint64_t zip64_threshold_;
  uint64_t pos_ = 0;
  std::vector<Written> done_;
  bool open_ = false, finished_ = false;
  Written cur_{};
  uint64_t cur_written_ = 0;
};

}  // namespace accel::io::detail
