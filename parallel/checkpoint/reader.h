// Reading a format-2 checkpoint on any mesh: each rank reads the elements of the regions it needs
// straight from the byte ranges of the pieces that hold them (no gather, no temporary file).
//
//   auto src = ckpt::open_checkpoint("ckpt/checkpoint_7");
//   Tensor w = empty(layout.region.local_shape(), TensorOptions(kFloat32));
//   src->read("model.0.w", layout.region, w);   // this rank's piece, converted to float32
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/checkpoint/index.h"
#include "parallel/placement.h"

namespace accel::dist::ckpt {

// Note [format-2 checkpoints]
// A checkpoint folder holds, and holds nothing else that is a folder or a link:
//   data_rank<r>.safetensors  the pieces rank r was primary for, one entry "<name>@r<r>" each
//                             (the local tensor, contiguous, shape = its region's local shape;
//                             __metadata__ {"accel_format": "2", "rank": "<r>"}): HF tools open it;
//   index.json                written last by rank 0 (index.h): per tensor its dtype, global
//                             shape and pieces (file, entry, region, block CRCs), and the meta.
// Pieces carry explicit regions of the global tensor (Note [placements]): Shard with chunks,
// uneven and empty shards, and a final Flat range all read back under any other layout by the
// overlaps of regions. Checks on read: the index (Note [format-2 index validation]), every block
// read against its CRC (Note [format-2 checksums]), the entry's dtype and shape against the
// record, and exact coverage of every region read (each element in exactly one piece).

// A checkpoint to load from. Format 2 today; older formats and pretrained safetensors files are
// meant to become other sources behind the same interface.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // Everything the index holds besides its tensors (step, mesh, loaders, ...).
  virtual const nlohmann::json& meta() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;  // sorted
  // The tensor's dtype, global shape and pieces; IoError naming the checkpoint when absent.
  virtual const TensorRecord& tensor(const std::string& name) const = 0;
  // dst := the elements of `want` (a region of the tensor's global shape; dst contiguous, of
  // want.local_shape(), any dtype and device: values are converted as copy_ does). Reads only
  // the blocks of the pieces that hold them and checks their CRCs. IoError naming the tensor,
  // the file and the piece for a CRC mismatch, an entry that is not what the index says, or an
  // element of `want` in no piece or in two. Never writes a file.
  virtual void read(const std::string& name, const Region& want, const Tensor& dst) = 0;
};

// Opens the format-2 checkpoint in `dir`: refuses a link or a folder anywhere in it (naming it),
// reads index.json (never through a link, at most kMaxIndexBytes) and checks it. Data files are
// opened when first read, never through a link. IoError naming the folder and the problem.
std::unique_ptr<CheckpointSource> open_checkpoint(const std::string& dir);

}  // namespace accel::dist::ckpt
