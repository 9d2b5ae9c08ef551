// Checkpoints in the Hugging Face safetensors format, so HF tools read what we write and we read
// what they write (for the dtypes accel has).
//
// Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the byte buffer; offsets are relative to the buffer start. We write tensors in name order,
// contiguous, and pad the header with spaces to a multiple of 8 bytes (as the HF writer does).
//
// The loader trusts nothing in the file until it has been checked (Note [safetensors
// validation] in safetensors.cc); every violation is an IoError naming the file and the problem.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/tensor.h"
#include "io/tensor_dict.h"

namespace accel::io {

// Largest header we accept (the HF reference implementation uses the same bound).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Writes atomically: a temporary file in the same directory, fsync, rename over `path`, fsync
// of the directory, never through a link (Note [safe file access] in core/file_io.h). Tensors may
// live on any device and have any strides; they are written as contiguous CPU bytes. The name
// "__metadata__" is reserved. Tensors that are one view under several names (tied parameters) are
// written once, the other names recorded in the metadata (Note [tied tensors in files] in
// safetensors.cc).
void save_safetensors(const std::string& path, const TensorDict& tensors,
                      const Metadata& metadata = {});

// Reads every tensor onto the CPU. `metadata`, when given, receives the __metadata__ strings.
// A link to a regular file is followed (a Hugging Face cache links into blobs/); a FIFO, device
// or directory is an IoError before anything is read. Tied names recorded in the metadata get the
// tensor they alias (the same Tensor).
TensorDict load_safetensors(const std::string& path, Metadata* metadata = nullptr);

// The steps of Note [tied tensors in files]: `tensors` without the names that alias another
// entry, each recorded in `metadata` as alias -> kept (unless the key is taken); and back.
TensorDict drop_tied_aliases(const TensorDict& tensors, Metadata& metadata);
void restore_tied_aliases(TensorDict& tensors, const Metadata& metadata);
// A safetensors file written one tensor at a time, in the announced order, so that a sharded
// model can be exported holding one piece in memory (dist/fsdp.h). Atomic like save_safetensors:
// the file appears at `path` only on commit(); a writer destroyed before that leaves nothing.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype = kFloat32;
    Shape shape;
  };
  SafetensorsWriter(std::string path, std::vector<Entry> entries, const Metadata& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The next announced tensor (its dtype and shape must match; any device).
  void write(const Tensor& t);
  void commit();

 private:
  std::string path_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  std::unique_ptr<file_io::AtomicFile> file_;  // null once committed or failed
  bool committed_ = false;
};

// Note [reading parts of a safetensors file]
// A checkpoint reader that needs a few slices of a large file (a ZeRO-3 rank resuming, a sharded
// model loading pretrained weights) must not hold the file in memory: SafetensorsFile opens it,
// reads and checks the header alone (the same checks as load_safetensors, Note [safetensors
// validation]) and keeps the descriptor; tensor bytes are read with pread only when asked for,
// straight into the destination when it is a contiguous CPU tensor of the stored dtype, else
// through a bounded bounce buffer (kSafetensorsReadChunkBytes) converted chunk by chunk. Element
// ranges are checked against the tensor before any read.
constexpr size_t kSafetensorsReadChunkBytes = size_t(4) << 20;

class SafetensorsFile {
 public:
  struct Info {
    DType dtype = kFloat32;
    Shape shape;
    int64_t numel = 0;
  };
  // IoError naming `path` when it cannot be opened, is not a regular file or its header is bad.
  // `links`: kFollow opens through a link to a regular file (a Hugging Face cache links into
  // blobs/); kRefuse (files accel wrote itself, such as a checkpoint's data files) refuses a link
  // at `path`, naming it.
  explicit SafetensorsFile(std::string path, file_io::Links links = file_io::Links::kFollow);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return metadata_; }
  std::vector<std::string> names() const;                           // sorted
  std::vector<std::string> names(const std::string& prefix) const;  // those starting with it
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // IoError naming the file and the tensor when it holds none of that name.
  const Info& info(const std::string& name) const;
  // dst := elements [lo, hi) of the flattened tensor `name`; dst is contiguous with hi - lo
  // elements (any shape, dtype and device: the values are converted as copy_ does). IoError for a
  // range outside the tensor or a failed read (naming the file and the tensor).
  void read_range(const std::string& name, int64_t lo, int64_t hi, const Tensor& dst) const;
  // The whole tensor, in its stored dtype, on the CPU.
  Tensor read(const std::string& name) const;
  // dst := bytes [byte_lo, byte_lo + n) of the stored bytes of tensor `name`, as they are in the
  // file (no conversion, no BOOL check: the caller checks them, e.g. against a checksum). IoError
  // naming the file, the tensor and the range when it lies outside the tensor's bytes or the
  // read fails.
  void read_bytes(const std::string& name, uint64_t byte_lo, uint64_t n, void* dst) const;
  // The file's size in bytes when it was opened.
  uint64_t file_size() const { return file_size_; }

 private:
  struct Stored {
    Info info;
    uint64_t begin = 0;  // absolute file offset of the first byte
  };
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::map<std::string, Stored> entries_;
  Metadata metadata_;
};

// A model's weights as one safetensors file or as a sharded set the way transformers writes it:
// an index JSON (model.safetensors.index.json: {"metadata": {...}, "weight_map": {"<tensor>":
// "<file>"}}) next to the files it names. `path` is a .safetensors file, an index file (a name
// ending in .json), or a directory holding model.safetensors.index.json or model.safetensors.
// Every file is opened as a SafetensorsFile (headers only); the index is checked whole before
// anything is read (a JSON object with a weight_map of plain file names in the index's
// directory, each naming a file that holds that tensor): IoError naming the index, the file and
// the tensor otherwise.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);
  ~SafetensorsCheckpoint();
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;

  // The index file, or the single file.
  const std::string& path() const { return path_; }
  // Every name, the tied aliases a file's metadata records (Note [tied tensors in files])
  // included: an alias reads the tensor it names.
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const {
    return where_.count(name) != 0 || alias_.count(name) != 0;
  }
  const SafetensorsFile& file_of(const std::string& name) const;
  // From now on `alias` reads the tensor `name` (which the checkpoint holds) reads.
  void add_alias(const std::string& alias, const std::string& name);
  const SafetensorsFile::Info& info(const std::string& name) const {
    return file_of(name).info(stored_name(name));
  }
  void read_range(const std::string& name, int64_t lo, int64_t hi, const Tensor& dst) const {
    file_of(name).read_range(stored_name(name), lo, hi, dst);
  }

 private:
  // The name a tensor is stored under: an alias's target, else the name itself.
  const std::string& stored_name(const std::string& name) const {
    auto it = alias_.find(name);
    return it == alias_.end() ? name : it->second;
  }
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::map<std::string, std::string> alias_;  // alias -> stored name
};

}  // namespace accel::io

// The names these had when the reader lived in nn/ (accel::nn), kept so that code
// written against them compiles unchanged; new code says io::.
namespace accel::nn {
using io::drop_tied_aliases;
using io::kSafetensorsMaxHeaderBytes;
using io::kSafetensorsReadChunkBytes;
using io::load_safetensors;
using io::Metadata;
using io::restore_tied_aliases;
using io::SafetensorsCheckpoint;
using io::SafetensorsFile;
using io::SafetensorsWriter;
using io::save_safetensors;
using io::TensorDict;
}  // namespace accel::nn
