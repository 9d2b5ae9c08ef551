#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "io/safetensors_header.h"
#include "core/file_io.h"

namespace accel::io {

static_assert(kSafetensorsMaxHeaderBytes == detail::kMaxHeaderBytes);
static_assert(std::endian::native == std::endian::little,
              "safetensors byte order is little-endian; a big-endian host needs byte swaps");

namespace {

using json = nlohmann::json;

std::string errno_str() { return std::strerror(errno); }

constexpr const char* kLoad = "load_safetensors";
constexpr const char* kSave = "save_safetensors";
constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kLengthBytes = 8;
constexpr size_t kHeaderAlign = 8;

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
  // Non-blocking open, regular files only (Note [safe file access] in core/file_io.h); the sizes
  // the header declares are checked against the file's size before anything is allocated.
  const file_io::ReadableFile file = file_io::open_read(path, kLoad);
  const int fd = file.fd.get();
  const uint64_t file_size = file.size;
  ACCEL_CHECK(file_size >= kLengthBytes, IoError, kLoad, "'", path, "': file is ", file_size,
              " bytes, too short for the 8-byte header length");

  unsigned char len_bytes[kLengthBytes];
  ACCEL_CHECK(file_io::pread_all(fd, len_bytes, kLengthBytes, 0), IoError, kLoad, "'", path,
              "': cannot read the header length: ", errno ? errno_str() : "unexpected end of file");
  const uint64_t header_len = detail::safetensors_header_length(len_bytes, file_size, path);

  std::string header(size_t(header_len), '\0');
  ACCEL_CHECK(file_io::pread_all(fd, header.data(), header.size(), kLengthBytes), IoError, kLoad,
              "'", path,
              "': cannot read the header: ", errno ? errno_str() : "unexpected end of file");
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
      ACCEL_CHECK(file_io::pread_all(fd, t.data_ptr(), n, buffer_start + e.begin), IoError, kLoad,
                  "'", path, "': cannot read tensor '", e.name, "': ",
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
  // A unique temporary in the target directory, renamed over `path` on commit (Note [safe file
  // access] in core/file_io.h).
  file_ = std::make_unique<file_io::AtomicFile>(path_, kSave);
  file_->write(len_bytes, kLengthBytes);
  file_->write(text);
}

// Out of line: file_io::AtomicFile is complete only here. Destroying an uncommitted file removes
// its temporary.
SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const Tensor& t) {
  ACCEL_CHECK(file_ && !committed_, IoError, kSave, "'", path_, "': the writer is closed");
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
  if (h.nbytes() > 0) {
    try {
      file_->write(h.data_ptr(), h.nbytes());
    } catch (...) {
      file_.reset();  // the temporary is gone; the writer is closed
      throw;
    }
  }
  ++next_;
}

void SafetensorsWriter::commit() {
  ACCEL_CHECK(file_ && !committed_, IoError, kSave, "'", path_, "': the writer is closed");
  ACCEL_CHECK(next_ == entries_.size(), ValueError, kSave, "'", path_, "': ", next_, " of ",
              entries_.size(), " announced tensors written");
  std::unique_ptr<file_io::AtomicFile> f = std::move(file_);
  f->commit();
  committed_ = true;
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

// ---------------------------------------------------------------------------------------------
// SafetensorsFile: Note [reading parts of a safetensors file] in safetensors.h.

namespace {
constexpr const char* kRead = "safetensors";
}  // namespace

SafetensorsFile::SafetensorsFile(std::string path, file_io::Links links) : path_(std::move(path)) {
  // A regular file (a FIFO or device planted in its place is refused before a byte is read); a
  // link is followed (Hugging Face caches link snapshots to blobs/) unless `links` refuses it.
  // Note [safe file access].
  file_io::ReadableFile file = file_io::open_read(path_, kRead, file_io::kNoSizeCap, links);
  const uint64_t file_size = file.size;
  file_size_ = file_size;
  ACCEL_CHECK(file_size >= kLengthBytes, IoError, kRead, "'", path_, "': file is ", file_size,
              " bytes, too short for the 8-byte header length");
  unsigned char len_bytes[kLengthBytes];
  ACCEL_CHECK(file_io::pread_all(file.fd.get(), len_bytes, kLengthBytes, 0), IoError, kRead, "'",
              path_,
              "': cannot read the header length: ", errno ? errno_str() : "unexpected end of file");
  const uint64_t header_len = detail::safetensors_header_length(len_bytes, file_size, path_);
  std::string header(size_t(header_len), '\0');
  ACCEL_CHECK(file_io::pread_all(file.fd.get(), header.data(), header.size(), kLengthBytes),
              IoError, kRead, "'", path_,
              "': cannot read the header: ", errno ? errno_str() : "unexpected end of file");
  const uint64_t buffer_start = kLengthBytes + header_len;
  const std::vector<Entry> entries =
      detail::parse_safetensors_header(header, file_size - buffer_start, path_, &metadata_);
  for (const Entry& e : entries) {
    Stored s;
    s.info.dtype = e.dtype;
    for (int64_t d : e.shape) s.info.shape.push_back(d);
    s.info.numel = shape_numel(s.info.shape);
    s.begin = buffer_start + e.begin;
    entries_.emplace(e.name, std::move(s));
  }
  fd_ = file.fd.release();
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::vector<std::string> SafetensorsFile::names(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->first);
  return out;
}

const SafetensorsFile::Info& SafetensorsFile::info(const std::string& name) const {
  auto it = entries_.find(name);
  ACCEL_CHECK(it != entries_.end(), IoError, kRead, "'", path_, "' holds no tensor '", name, "'");
  return it->second.info;
}

void SafetensorsFile::read_range(const std::string& name, int64_t lo, int64_t hi,
                                 const Tensor& dst) const {
  auto it = entries_.find(name);
  ACCEL_CHECK(it != entries_.end(), IoError, kRead, "'", path_, "' holds no tensor '", name, "'");
  const Stored& s = it->second;
  ACCEL_CHECK(0 <= lo && lo <= hi && hi <= s.info.numel, IoError, kRead, "'", path_,
              "': elements [", lo, ", ", hi, ") are outside tensor '", name, "' of ", s.info.numel,
              " elements");
  ACCEL_CHECK(dst.defined() && dst.numel() == hi - lo && dst.is_contiguous(), ValueError, kRead,
              "'", path_, "': reading ", hi - lo, " elements of '", name,
              "' needs a contiguous destination of as many elements, got ",
              dst.defined() ? dst.shape_str() : std::string("undefined"));
  if (hi == lo) return;
  NoGradGuard ng;
  const size_t esize = dtype_size(s.info.dtype);
  auto read_bytes = [&](void* p, int64_t from, int64_t count) {
    ACCEL_CHECK(file_io::pread_all(fd_, p, size_t(count) * esize, s.begin + uint64_t(from) * esize),
                IoError, kRead, "'", path_, "': cannot read tensor '", name, "': ",
                errno ? errno_str() : "unexpected end of file (file changed while reading?)");
    if (s.info.dtype == kBool) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      for (int64_t i = 0; i < count; ++i)
        ACCEL_CHECK(b[i] <= 1, IoError, kRead, "'", path_, "': BOOL tensor '", name,
                    "' holds byte ", int(b[i]), " at element ", from + i, " (expected 0 or 1)");
    }
  };
  Tensor flat = dst.view({hi - lo});
  if (dst.device().is_cpu() && dst.dtype() == s.info.dtype) {
    read_bytes(flat.data_ptr(), lo, hi - lo);  // straight into the destination
    return;
  }
  // Another dtype, device or layout: a bounded bounce buffer, converted chunk by chunk.
  const int64_t chunk = std::max<int64_t>(1, int64_t(kSafetensorsReadChunkBytes / esize));
  Tensor bounce = empty({std::min(chunk, hi - lo)}, TensorOptions(s.info.dtype, kCPU));
  for (int64_t a = lo; a < hi; a += chunk) {
    const int64_t n = std::min(chunk, hi - a);
    Tensor b = bounce.narrow(0, 0, n);
    read_bytes(b.data_ptr(), a, n);
    Tensor part = flat.narrow(0, a - lo, n);
    part.copy_(b);
  }
}

void SafetensorsFile::read_bytes(const std::string& name, uint64_t byte_lo, uint64_t n,
                                 void* dst) const {
  auto it = entries_.find(name);
  ACCEL_CHECK(it != entries_.end(), IoError, kRead, "'", path_, "' holds no tensor '", name, "'");
  const Stored& s = it->second;
  const uint64_t size = uint64_t(s.info.numel) * dtype_size(s.info.dtype);
  ACCEL_CHECK(byte_lo <= size && n <= size - byte_lo, IoError, kRead, "'", path_, "': bytes [",
              byte_lo, ", ", byte_lo + n, ") are outside tensor '", name, "' of ", size, " bytes");
  if (n == 0) return;
  ACCEL_CHECK(file_io::pread_all(fd_, dst, size_t(n), s.begin + byte_lo), IoError, kRead, "'",
              path_, "': cannot read bytes [", byte_lo, ", ", byte_lo + n, ") of tensor '", name,
              "': ", errno ? errno_str() : "unexpected end of file (file changed while reading?)");
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const Info& in = info(name);
  Tensor t = empty(in.shape, TensorOptions(in.dtype, kCPU));
  read_range(name, 0, in.numel, t);
  return t;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

namespace {
constexpr uint64_t kMaxIndexBytes = uint64_t(64) << 20;  // transformers' indexes are < 1 MB

// The whole index file: a regular file of at most kMaxIndexBytes (Note [safe file access]).
std::string read_index(const std::string& path) {
  return file_io::read_file(path, kRead, kMaxIndexBytes);
}
}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string index;
  if (fs::is_directory(path, ec)) {
    const fs::path idx = fs::path(path) / "model.safetensors.index.json";
    const fs::path one = fs::path(path) / "model.safetensors";
    if (fs::exists(idx, ec)) {
      index = idx.string();
    } else {
      ACCEL_CHECK(fs::exists(one, ec), IoError, kRead, "directory '", path,
                  "' holds neither model.safetensors.index.json nor model.safetensors");
      path_ = one.string();
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index = path;
  } else {
    path_ = path;
  }
  // Tied names each file's metadata records as `alias -> kept` (Note [tied tensors in files]):
  // a key that names no tensor of the set, whose value does.
  auto find_aliases = [this] {
    for (const auto& f : files_)
      for (const auto& [alias, name] : f->metadata())
        if (!where_.count(alias) && where_.count(name)) alias_.emplace(alias, name);
  };
  if (index.empty()) {
    files_.push_back(std::make_unique<SafetensorsFile>(path_));
    for (const std::string& n : files_.back()->names()) where_.emplace(n, files_.back().get());
    find_aliases();
    return;
  }
  path_ = index;
  json j;
  try {
    j = json::parse(read_index(index));
  } catch (const json::exception& e) {
    ACCEL_THROW(IoError, kRead, "'", index, "' is not a JSON index: ", e.what());
  }
  ACCEL_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), IoError,
              kRead, "'", index, "' has no \"weight_map\" object");
  const fs::path dir = fs::path(index).parent_path();
  std::map<std::string, SafetensorsFile*> opened;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    ACCEL_CHECK(it->is_string(), IoError, kRead, "'", index, "': weight_map[\"", it.key(),
                "\"] must be a file name, got ", it->type_name());
    const std::string file = it->get<std::string>();
    ACCEL_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
                IoError, kRead, "'", index, "': weight_map[\"", it.key(), "\"] names '", file,
                "'; only files next to the index are read");
    auto f = opened.find(file);
    if (f == opened.end()) {
      files_.push_back(std::make_unique<SafetensorsFile>((dir / file).string()));
      f = opened.emplace(file, files_.back().get()).first;
    }
    ACCEL_CHECK(f->second->contains(it.key()), IoError, kRead, "'", index, "' maps tensor '",
                it.key(), "' to '", f->second->path(), "', which does not hold it");
    where_.emplace(it.key(), f->second);
  }
  find_aliases();
}

SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : where_) out.push_back(n);
  for (const auto& [n, f] : alias_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

void SafetensorsCheckpoint::add_alias(const std::string& alias, const std::string& name) {
  ACCEL_CHECK(contains(name), IoError, kRead, "'", path_, "' holds no tensor '", name, "'");
  if (!contains(alias)) alias_.emplace(alias, stored_name(name));
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(stored_name(name));
  ACCEL_CHECK(it != where_.end(), IoError, kRead, "'", path_, "' holds no tensor '", name, "'");
  return *it->second;
}

}  // namespace accel::io
