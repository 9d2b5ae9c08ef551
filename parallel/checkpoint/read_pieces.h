// How a CheckpointSource reads a region of a tensor from the pieces that hold it: shared by the
// format-2 reader (reader.cc) and the format-1 source (legacy.cc), which differ only in how they
// reach a piece's file and what they check of each window of bytes (format 2: its CRC).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/index.h"

namespace accel::dist::ckpt::detail {

struct PieceAccess {
  // The piece's data file, its entry checked against the record (dtype, local shape): its bytes
  // bound the runs overlap() walks, so an index cannot make the reader walk a piece that is not
  // there. Called once per piece meeting the region.
  std::function<const io::SafetensorsFile&(const PieceRecord&)> file;
  // "'<entry>' in '<file>'", for errors.
  std::function<std::string(const PieceRecord&)> describe;
  // Bytes read at once (format 2: the CRC block, so each block is read whole, at most once).
  uint64_t window_bytes = 0;
  // Where the piece's bytes begin in its entry, in bytes (format 1's ZeRO-1/2 bucket slices: the
  // parameters of a bucket share one entry per rank); empty: at 0, the entry being the piece.
  std::function<uint64_t(const PieceRecord&)> entry_offset;
  // Checks window `w` (bytes [offset, offset + len) of the piece) just read; may be empty.
  std::function<void(const PieceRecord&, const io::SafetensorsFile&, uint64_t w, uint64_t offset,
                     const unsigned char* bytes, uint64_t len)>
      check_window;
};

// Note [reading a region of a checkpoint]
// dst := the elements of `want` of tensor `name` (record `rec` of the checkpoint `dir`). For each
// piece whose bounding box meets `want`: access.file() (the entry check), then overlap() gives
// (src, dst, n) runs ascending in both orders. Coverage is checked first, on the runs alone:
// sorted by dst they must tile [0, want.numel()) (an element in no piece or in two is an IoError
// naming the tensor and the pieces). Then each piece's needed bytes are read window by window
// (each window at most once, through one bounded buffer), checked, and copied to their place:
// straight into dst when it is a contiguous CPU tensor of the stored dtype, else into a CPU
// staging tensor of the stored dtype that dst then copies from (conversion and device transfer by
// copy_).
void read_pieces(const std::string& dir, const std::string& name, const TensorRecord& rec,
                 const Region& want, const Tensor& dst, const PieceAccess& access);

}  // namespace accel::dist::ckpt::detail
