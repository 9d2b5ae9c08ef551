// A whole torch.save file, zip or legacy, parsed and checked without tensors (so the loader and
// the fuzz target tests/fuzz/fuzz_torch.cc run the same code): the unpickled data and where each
// storage's bytes are. See Note [torch file layouts] in torch_file.cc.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "io/torch_pickle.h"
#include "io/torch_zip.h"

namespace accel::io {
class PtValue;
}

namespace accel::io::detail {

// Largest data.pkl read (it describes tensors, it does not hold them: a model of 10^5 tensors has
// a pickle of ~10 MB).
constexpr uint64_t kMaxPickleBytes = uint64_t(1) << 30;

struct StorageData {
  StorageInfo info;
  uint64_t offset = 0;   // of the first byte, in the file
  uint64_t nbytes = 0;   // info.numel x element size
  bool has_crc = false;  // zip records carry a CRC-32; legacy storages do not
  uint32_t crc = 0;
};

struct TorchFile {
  bool legacy = false;
  std::unique_ptr<Unpickler> pickle;  // owns the graph `root` points into
  PickleValue root;
  std::map<std::string, StorageData> storages;  // every storage the data references
};

// Starts with the zip or the legacy magic bytes (and is not a safetensors file: Note [checkpoint
// file formats] in nn/module.cc).
bool looks_like_torch_file(const unsigned char* head, size_t n);

// IoError naming `path` and what is wrong, for anything that is not a torch.save file whose every
// check passes (Notes [torch zip archives], [restricted unpickler], [torch file layouts]).
TorchFile parse_torch_file(const ByteSource& src, const std::string& path);

// read_pt over any byte source (tests read files from memory); `path` names it in errors.
PtValue read_pt_from(const ByteSource& src, const std::string& path);

// Reads storage `key`'s bytes into dst (s.nbytes bytes), checking its CRC-32 where it has one.
void read_storage(const ByteSource& src, const StorageData& s, void* dst, const std::string& key,
                  const std::string& path);

}  // namespace accel::io::detail
