// File helpers shared by the readers: whole-file reads with transparent gzip, and a read-only
// memory map. Every failure is an IoError whose message names the file and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accel::data {

// Reads the whole file. When it starts with the gzip magic (1f 8b) it is inflated (all members
// of a multi-member stream); a corrupt or truncated stream is an IoError naming the file.
std::vector<uint8_t> read_file_bytes(const std::string& path, bool decompress_gzip = true);

// Inflates an in-memory gzip stream. `what` names the source in error messages.
std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& what);

inline bool is_gzip(const uint8_t* data, size_t size) {
  return size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
}

// Read-only private mapping of a whole file; unmapped on destruction. Movable, not copyable.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace accel::data
