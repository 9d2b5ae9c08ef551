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

#include <string>
#include <vector>

#include "autograd/nn/module.h"

namespace accel::nn {

// Largest header we accept (the HF reference implementation uses the same bound).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Writes atomically: a temporary file in the same directory, fsync, rename over `path`, fsync
// of the directory. Tensors may live on any device and have any strides; they are written as
// contiguous CPU bytes. The name "__metadata__" is reserved. Tensors that are one view under
// several names (tied parameters) are written once, the other names recorded in the metadata
// (Note [tied tensors in files] in safetensors.cc).
void save_safetensors(const std::string& path, const TensorDict& tensors,
                      const Metadata& metadata = {});

// Reads every tensor onto the CPU. `metadata`, when given, receives the __metadata__ strings.
// Tied names recorded in the metadata get the tensor they alias (the same Tensor).
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
  [[noreturn]] void fail(const char* what);
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace accel::nn
