// The index of a format-2 checkpoint (Note [format-2 checkpoints]): which pieces of which
// tensors each data file holds, where each piece lies in its tensor (a Region, Note
// [placements]), the pieces' block checksums, and the facade's meta. Written last by rank 0
// (parallel/checkpoint/writer.h), read by any mesh (parallel/checkpoint/reader.h).
//
//   index.json: {"format": 2, "crc_block_bytes": 1048576,
//                "files": [{"name": "data_rank0.safetensors", "bytes": 81234}, ...],
//                "tensors": {"model.0.w": {"dtype": "F64", "shape": [96, 32], "layout": "...",
//                            "pieces": [{"file": 0, "entry": "model.0.w@r0",
//                                        "region": {"dims": [...], "flat": [0, 768]},
//                                        "crc": [2863311530]}, ...]}, ...},
//                ...the facade's meta (step, mesh, loaders, ...)...,
//                "index_crc32": 123456789}
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "parallel/placement.h"

namespace accel::dist::ckpt {

constexpr int kFormat = 2;
constexpr const char* kIndexFile = "index.json";
// Bytes per checksum block of a piece (Note [format-2 checksums] in crc.h).
constexpr uint64_t kCrcBlockBytes = uint64_t(1) << 20;
// Largest block size and index file accepted.
constexpr uint64_t kMaxCrcBlockBytes = uint64_t(64) << 20;
constexpr uint64_t kMaxIndexBytes = uint64_t(64) << 20;
// Most dimensions a tensor may have (safetensors' own bound).
constexpr size_t kMaxRank = 64;

// "data_rank<r>.safetensors"
std::string data_file_name(int rank);
// "<name>@r<rank>": a piece's entry in its data file.
std::string piece_entry_name(const std::string& name, int rank);

struct PieceRecord {
  int64_t file = 0;           // index into Index::files
  std::string entry;          // the safetensors entry holding the piece's bytes
  Region region;              // where the piece lies in the tensor
  std::vector<uint32_t> crc;  // one per block of the piece's bytes
};

struct TensorRecord {
  DType dtype = kFloat32;
  Shape shape;
  std::string layout;  // informational ("tp: Shard(0), dp_shard: Flat"); regions are authoritative
  std::vector<PieceRecord> pieces;
};

struct FileRecord {
  std::string name;  // a plain file name in the checkpoint folder
  uint64_t bytes = 0;
};

struct Index {
  std::map<std::string, TensorRecord> tensors;
  std::vector<FileRecord> files;
  uint64_t crc_block_bytes = kCrcBlockBytes;
  nlohmann::json meta = nlohmann::json::object();  // every other top-level key
};

// The index as written: compact JSON, index_crc32 over the text without that field.
std::string index_to_text(const Index& index);
// Parses and checks an index text (Note [format-2 index validation] in index.cc); IoError naming
// `where` (the index file), the tensor and the piece for every violation. The text must be at
// most kMaxIndexBytes.
Index parse_index(std::string_view text, const std::string& where);
// The checks of parse_index that span pieces, on an index built in memory (the writer runs them
// before it writes).
void validate_index(const Index& index, const std::string& where);

// One tensor's record as JSON and back (the per-rank records the writer sends to rank 0 use the
// same form; file indexes are then the sender's own). tensor_from_json checks the record alone
// (dtype, shape, layout, each piece's file index names one of `files`, region inside the shape,
// as many CRCs as blocks); IoError naming `where`, the tensor, the piece and its file.
nlohmann::json tensor_to_json(const TensorRecord& t);
TensorRecord tensor_from_json(const nlohmann::json& j, const std::string& name,
                              const std::vector<FileRecord>& files, uint64_t block_bytes,
                              const std::string& where);

}  // namespace accel::dist::ckpt
