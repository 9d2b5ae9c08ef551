// Saving a format-2 checkpoint (Note [format-2 checkpoints] in reader.h): every rank writes the
// pieces it is primary for into data_rank<r>.safetensors, rank 0 gathers the piece records and
// writes index.json last.
//
//   std::vector<ckpt::StateEntry> entries = {{"model.0.w", layout.region, local_w,
//   layout.primary()}}; ckpt::save_pieces(dir, world.get(), world->rank(), entries, {{"step",
//   12}});
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "parallel/checkpoint/index.h"
#include "parallel/placement.h"

namespace accel::dist::ckpt {

// One tensor piece a rank holds: its global name, where it lies in the global tensor, the local
// tensor (region.local_shape(), any dtype, device and strides), and whether this rank writes it
// (Layout::primary(): one holder per piece).
struct StateEntry {
  std::string name;
  Region region;
  Tensor local;
  bool primary = true;
  std::string layout;  // informational, recorded in the index (Layout::str())
};

// This rank's part: writes its primary pieces that hold elements into
// `dir`/data_rank<rank>.safetensors (atomic, durable, never through a link: io::SafetensorsWriter)
// with their block CRCs computed from the bytes written, and returns its piece records (compact
// JSON, the message rank 0 merges). No file when the rank holds no element. ValueError for an
// entry named twice or a local tensor whose shape is not its region's.
std::string write_rank_pieces(const std::string& dir, int rank,
                              const std::vector<StateEntry>& entries,
                              uint64_t crc_block_bytes = kCrcBlockBytes);

// Rank 0's part: merges every rank's records (rank_records[r] from rank r; an {"error": ...}
// record is re-raised naming the rank), checks them as a reader will (the same dtype and shape on
// every rank, every element in some piece: validate_index), adds `meta` (an object; the index's
// own keys are refused; null is none) and writes `dir`/index.json durably. Returns the index
// written.
Index write_index(const std::string& dir, const std::vector<std::string>& rank_records,
                  const nlohmann::json& meta);

// Both, over `world` (send / recv of a length and the bytes, rank order, to rank 0), after which
// every rank's data file is durable and, on rank 0, index.json is written. A rank that fails
// still reports to rank 0, which raises naming it. (The other ranks return before rank 0 has
// written the index: agreeing that the save succeeded is the caller's commit protocol.) `world`
// null: one process (rank 0). Returns the index on rank 0, an empty Index on the others.
Index save_pieces(const std::string& dir, ProcessGroup* world, int rank,
                  const std::vector<StateEntry>& entries, const nlohmann::json& meta,
                  uint64_t crc_block_bytes = kCrcBlockBytes);

}  // namespace accel::dist::ckpt
