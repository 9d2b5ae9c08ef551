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

#include "autograd/nn/module.h"

namespace accel::nn {

// Largest header we accept (the HF reference implementation uses the same bound).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Writes atomically: a temporary file in the same directory, fsync, rename over `path`, fsync
// of the directory. Tensors may live on any device and have any strides; they are written as
// contiguous CPU bytes. The name "__metadata__" is reserved.
void save_safetensors(const std::string& path, const TensorDict& tensors,
                      const Metadata& metadata = {});

// Reads every tensor onto the CPU. `metadata`, when given, receives the __metadata__ strings.
TensorDict load_safetensors(const std::string& path, Metadata* metadata = nullptr);
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
  [[noreturn]] void fail(const char* what);
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  int fd_ = -1;
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
  explicit SafetensorsFile(std::string path);
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

 private:
  struct Stored {
    Info info;
    uint64_t begin = 0;  // absolute file offset of the first byte
  };
  std::string path_;
  int fd_ = -1;
  std::map<std::string, Stored> entries_;
  Metadata metadata_;
};

}  // namespace accel::nn
