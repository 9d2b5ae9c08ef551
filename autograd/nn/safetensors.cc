#include "autograd/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "autograd/nn/safetensors_header.h"

namespace accel::nn {

static_assert(kSafetensorsMaxHeaderBytes == detail::kMaxHeaderBytes);
static_assert(std::endian::native == std::endian::little,
              "safetensors byte order is little-endian; a big-endian host needs byte swaps");

namespace {

using json = nlohmann::json;

constexpr const char* kLoad = "load_safetensors";
constexpr const char* kSave = "save_safetensors";
constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kLengthBytes = 8;
constexpr size_t kHeaderAlign = 8;

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

std::string errno_str() { return std::strerror(errno); }

// Reads exactly n bytes at `offset`; false on EOF or error (errno set on error).
bool pread_full(int fd, void* dst, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return true;
}

bool write_full(int fd, const void* src, size_t n) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

using Entry = detail::SafetensorsEntry;

}  // namespace

// Note [safetensors validation]
// The header comes from an untrusted file, so nothing from it sizes an allocation or a read
// until it has been checked against the file itself:
//   1. the file holds at least the 8-byte length; the length is <= 100 MB and <= file size - 8;
//   2. the header is a UTF-8 JSON object (nlohmann's lexer rejects ill-formed UTF-8) with no
//      duplicate key at any depth (nlohmann keeps the last duplicate silently, so the reader
//      tracks the keys of every open object), nested at most kSafetensorsMaxDepth deep, read as
//      a stream of events rather than a document tree (Note [safetensors header as events] in
//      safetensors_header.cc: memory stays a small multiple of the header size);
//   3. every entry has a known dtype name, a shape of at most kSafetensorsMaxRank non-negative
//      integers whose element count
//      and byte size do not overflow, and data_offsets [begin, end] with begin <= end;
//   4. end - begin == numel x dtype size;
//   5. sorted by offset, the entries tile the byte buffer exactly: the first starts at 0, each
//      starts where the previous ended (no gap, no overlap), the last ends at the end of the file
//      (no trailing bytes);
//   6. __metadata__, when present, is an object of strings;
//   7. BOOL bytes are 0 or 1 (any other byte is not a valid bool).
// Steps 1-6 live in safetensors_header.cc (shared with tests/fuzz/fuzz_safetensors.cc).
// Only then are tensors allocated (their total size is bounded by the file size) and read.
TensorDict load_safetensors(const std::string& path, Metadata* metadata) {
  Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ACCEL_CHECK(file.fd >= 0, IoError, kLoad, "cannot open '", path, "': ", errno_str());
  struct stat st {};
  ACCEL_CHECK(::fstat(file.fd, &st) == 0, IoError, kLoad, "cannot stat '", path,
              "': ", errno_str());
  ACCEL_CHECK(S_ISREG(st.st_mode), IoError, kLoad, "'", path, "' is not a regular file");
  const uint64_t file_size = uint64_t(st.st_size);
  ACCEL_CHECK(file_size >= kLengthBytes, IoError, kLoad, "'", path, "': file is ", file_size,
              " bytes, too short for the 8-byte header length");

  unsigned char len_bytes[kLengthBytes];
  ACCEL_CHECK(pread_full(file.fd, len_bytes, kLengthBytes, 0), IoError, kLoad, "'", path,
              "': cannot read the header length: ", errno ? errno_str() : "unexpected end of file");
  const uint64_t header_len = detail::safetensors_header_length(len_bytes, file_size, path);

  std::string header(size_t(header_len), '\0');
  ACCEL_CHECK(pread_full(file.fd, header.data(), header.size(), kLengthBytes), IoError, kLoad, "'",
              path, "': cannot read the header: ", errno ? errno_str() : "unexpected end of file");
  const uint64_t buffer_size = file_size - kLengthBytes - header_len;
  const uint64_t buffer_start = kLengthBytes + header_len;
  Metadata own_metadata;  // the aliases of Note [tied tensors in files] are read from it
  if (metadata == nullptr) metadata = &own_metadata;
  const std::vector<Entry> entries =
      detail::parse_safetensors_header(header, buffer_size, path, metadata);

  TensorDict out;
  for (const Entry& e : entries) {
    Shape shape;
    for (int64_t s : e.shape) shape.push_back(s);
    Tensor t = empty(shape, TensorOptions(e.dtype, kCPU));
    const size_t n = size_t(e.end - e.begin);
    if (n > 0) {
      ACCEL_CHECK(pread_full(file.fd, t.data_ptr(), n, buffer_start + e.begin), IoError, kLoad, "'",
                  path, "': cannot read tensor '", e.name, "': ",
                  errno ? errno_str() : "unexpected end of file (file changed while reading?)");
    }
    if (e.dtype == kBool) {
      const uint8_t* b = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < n; ++i) {
        ACCEL_CHECK(b[i] <= 1, IoError, kLoad, "'", path, "': BOOL tensor '", e.name,
                    "' holds byte ", int(b[i]), " at element ", i, " (expected 0 or 1)");
      }
    }
    out.emplace(e.name, std::move(t));
  }
  restore_tied_aliases(out, *metadata);
  return out;
}

namespace {
// Header text (padded) for entries written in order.
std::string header_text(const std::string& path,
                        const std::vector<SafetensorsWriter::Entry>& entries,
                        const Metadata& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& e : entries) {
    ACCEL_CHECK(e.name != kMetadataKey, ValueError, kSave, "'", path, "': the tensor name '",
                kMetadataKey, "' is reserved");
    ACCEL_CHECK(seen.insert(e.name).second, ValueError, kSave, "'", path, "': tensor '", e.name,
                "' twice");
    json shape = json::array();
    for (int64_t d : e.shape) shape.push_back(d);
    const uint64_t n = uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {{"dtype", std::string(dtype_safetensors_name(e.dtype))},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = m;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    ACCEL_THROW(ValueError, kSave, "'", path,
                "': a tensor name or metadata string is not valid UTF-8: ", e.what());
  }
  // Pad with spaces so the byte buffer starts 8-byte aligned (the HF writer does the same).
  text.append((kHeaderAlign - (kLengthBytes + text.size()) % kHeaderAlign) % kHeaderAlign, ' ');
  return text;
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<Entry> entries,
                                     const Metadata& metadata)
    : path_(std::move(path)), entries_(std::move(entries)) {
  const std::string text = header_text(path_, entries_, metadata);
  unsigned char len_bytes[kLengthBytes];
  for (size_t i = 0; i < kLengthBytes; ++i)
    len_bytes[i] = (uint64_t(text.size()) >> (8 * i)) & 0xff;
  // Temporary file in the target directory, so rename() is atomic (same file system).
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  ACCEL_CHECK(fd_ >= 0, IoError, kSave, "cannot create a temporary file next to '", path_,
              "': ", errno_str());
  if (!write_full(fd_, len_bytes, kLengthBytes) || !write_full(fd_, text.data(), text.size()))
    fail("write failed");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void SafetensorsWriter::fail(const char* what) {
  const std::string err = errno_str();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  tmp_.clear();
  ACCEL_THROW(IoError, kSave, "'", path_, "': ", what, ": ", err);
}

void SafetensorsWriter::write(const Tensor& t) {
  ACCEL_CHECK(fd_ >= 0 && !committed_, IoError, kSave, "'", path_, "': the writer is closed");
  ACCEL_CHECK(next_ < entries_.size(), ValueError, kSave, "'", path_, "': more tensors than the ",
              entries_.size(), " announced");
  const Entry& e = entries_[next_];
  ACCEL_CHECK(t.defined() && t.dtype() == e.dtype && t.sizes() == e.shape, ValueError, kSave, "'",
              path_, "': tensor '", e.name, "' was announced as ", e.dtype, " ", shape_str(e.shape),
              ", got ", t.defined() ? t.shape_str() : "undefined",
              t.defined() ? std::string(" ") + std::string(dtype_name(t.dtype())) : "");
  Tensor h = t.detach();
  if (!h.device().is_cpu()) h = h.to(kCPU);
  h = h.contiguous();
  if (h.nbytes() > 0 && !write_full(fd_, h.data_ptr(), h.nbytes())) fail("write failed");
  ++next_;
}

void SafetensorsWriter::commit() {
  ACCEL_CHECK(fd_ >= 0 && !committed_, IoError, kSave, "'", path_, "': the writer is closed");
  ACCEL_CHECK(next_ == entries_.size(), ValueError, kSave, "'", path_, "': ", next_, " of ",
              entries_.size(), " announced tensors written");
  if (::fsync(fd_) != 0) fail("fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close failed");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename failed");
  committed_ = true;
  // Make the rename itself durable.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ACCEL_CHECK(d.fd >= 0 && ::fsync(d.fd) == 0, IoError, kSave, "'", path_,
              "': cannot fsync directory '", dir.string(), "': ", errno_str());
}

// Note [tied tensors in files]
// A tied parameter is in a state dict under several names (Note [tied parameters] in
// module.cc), every name sharing one storage. safetensors files hold each tensor's bytes once;
// HF's save_file refuses shared tensors and safetensors.torch.save_model drops all names of a
// shared group but one (the first in sorted order), recording each dropped name in the metadata
// as `dropped -> kept` (never overriding a user's key). We write the same way: tensors that are
// the same view (storage, offset, sizes, strides, dtype) are written once under their sorted-first
// name, with `alias -> kept` in __metadata__; when the user's metadata already uses an alias's
// name as a key, that alias is written as a copy instead. Reading, a metadata key that is not a
// tensor of the file and whose value is one is such an alias: load_safetensors puts the kept
// tensor back under it (the same Tensor), so every reader gets the dict the writer was given,
// and files written by safetensors.torch.save_model load with their ties. Views that only
// overlap are written as copies.
TensorDict drop_tied_aliases(const TensorDict& tensors, Metadata& metadata) {
  TensorDict out;
  std::vector<std::pair<std::string, Tensor>> kept;  // sorted-first name of each group
  for (const auto& [name, t] : tensors) {
    const Tensor* same = nullptr;
    const std::string* as = nullptr;
    if (t.defined() && !metadata.count(name))
      for (const auto& [k, u] : kept)
        if (u.storage() == t.storage() && u.offset() == t.offset() && u.sizes() == t.sizes() &&
            u.strides() == t.strides() && u.dtype() == t.dtype()) {
          same = &u;
          as = &k;
          break;
        }
    if (same) {
      metadata.emplace(name, *as);
      continue;
    }
    if (t.defined()) kept.emplace_back(name, t);
    out.emplace(name, t);
  }
  return out;
}

void restore_tied_aliases(TensorDict& tensors, const Metadata& metadata) {
  for (const auto& [alias, name] : metadata) {
    if (tensors.count(alias)) continue;
    auto it = tensors.find(name);
    if (it != tensors.end()) tensors.emplace(alias, it->second);
  }
}

void save_safetensors(const std::string& path, const TensorDict& all, const Metadata& user) {
  // Note [tied tensors in files]: tied tensors once, their other names in the metadata.
  Metadata metadata = user;
  const TensorDict tensors = drop_tied_aliases(all, metadata);
  // Bring every tensor to contiguous CPU bytes first, so a failure leaves no file behind.
  std::vector<Tensor> host;
  std::vector<SafetensorsWriter::Entry> entries;
  host.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    ACCEL_CHECK(t.defined(), ValueError, kSave, "'", path, "': tensor '", name, "' is undefined");
    Tensor h = t.detach();
    if (!h.device().is_cpu()) h = h.to(kCPU);
    h = h.contiguous();
    entries.push_back({name, h.dtype(), h.sizes()});
    host.push_back(std::move(h));
  }
  SafetensorsWriter w(path, std::move(entries), metadata);
  for (const Tensor& h : host) w.write(h);
  w.commit();
}

}  // namespace accel::nn
