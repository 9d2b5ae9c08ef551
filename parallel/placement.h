// Where a tensor lives on the device mesh (Note [placements]): per mesh dimension a Placement
// (Replicate, Shard(dim), Flat, Partial), and the Region of the global tensor this rank holds.
// Every engine (tensor parallel, ZeRO, FSDP, DDP) states the layout of what it holds this way,
// and the one checkpoint format writes and reads pieces by their regions: a piece saved on one
// mesh is read on any other by the overlaps of regions.
//
//   Region r = Region::whole({96, 32}).shard(0, /*chunks=*/3, /*n=*/2, /*i=*/1);  // qkv, tp 2
//   r.local_shape();   // (48, 32): rows 16..31, 48..63, 80..95 of the global tensor
//   r = r.flat(100, 900);                       // then ZeRO's flat shard of that local piece
//   for (const Overlap& o : overlap(saved, wanted)) ...   // copy o.n elements src -> dst
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace accel::dist {

// Note [placements]
// DTensor's model, with one addition. A tensor's layout is the sequence of steps that cut it, in
// the order they were applied: tensor parallelism first cuts the global tensor (Shard(d) with
// torch.chunk's rule; packed tensors such as qkv are `chunks` equal blocks each cut alike), then
// the data-parallel engine either replicates the tp-local tensor (DDP) or owns a Flat range of
// its row-major order (ZeRO and FSDP keep their flat bucket / unit buffers: a rank's shard of a
// buffer is, per parameter, a range of the parameter's flattened local tensor). DTensor and
// torch's DCP describe pieces as boxes only (FSDP2 gave up the flat buffer for per-parameter
// Shard(0) and copies on every gather); accel keeps the flat buffer and lets a Region end in one
// flat range. Partial is a pending sum over a mesh dimension (gradients inside an accumulation
// window). Uneven sizes follow torch.chunk: chunk = ceil(size / n), piece i is
// [i * chunk, min(size, (i + 1) * chunk)), possibly empty, so ranks may hold different sizes.
// Stage is pipeline parallelism's: the tensor is held whole by the ranks at this coordinate of the
// dimension only (its layer's pipeline stage), by no other: it neither cuts nor replicates.
struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Flat, Partial, Stage };
  Kind kind = Kind::Replicate;
  int32_t dim = 0;     // Shard: the tensor dimension
  int32_t chunks = 1;  // Shard: the dimension is `chunks` equal blocks, each cut alike
  // Shard: each block is cut in whole units of `unit` elements (an attention projection's rows
  // by heads: unit = head_dim), torch.chunk's rule applied to the count of units.
  int32_t unit = 1;

  static Placement replicate() { return {}; }
  static Placement shard(int64_t dim, int64_t chunks = 1, int64_t unit = 1);
  static Placement flat() { return {Kind::Flat, 0, 1, 1}; }
  static Placement partial() { return {Kind::Partial, 0, 1, 1}; }
  static Placement stage() { return {Kind::Stage, 0, 1, 1}; }
  // "Replicate", "Shard(0)", "Shard(0, chunks=3)", "Shard(0, chunks=3, unit=8)", "Flat",
  // "Partial", "Stage"
  std::string str() const;
  bool operator==(const Placement&) const = default;
};

// torch.chunk's piece i of n over `size` elements.
struct Chunk {
  int64_t begin = 0, length = 0;
};
Chunk shard_chunk(int64_t size, int64_t n, int64_t i);

// One contiguous stretch of a dimension: local indices [local, local + length) are global
// indices [global, global + length).
struct Segment {
  int64_t local = 0, global = 0, length = 0;
  bool operator==(const Segment&) const = default;
};

// `n` elements contiguous in both the piece's (local) and the global row-major order.
struct Run {
  int64_t local = 0, global = 0, n = 0;
};

// The elements of a global tensor one piece holds, and where each lies in the piece: per tensor
// dimension an increasing piecewise map local index -> global index (segments ascending in both),
// then, optionally, the flat range [flat_lo, flat_hi) of that box's row-major order (the piece is
// then 1-D). Every composition of Shard (with chunks) and one final Flat is a Region.
class Region {
 public:
  Region() = default;
  static Region whole(const Shape& global);
  // Cuts the current piece along `dim` (of the box) into n torch.chunk pieces per block of
  // `chunks` equal blocks and keeps piece i of each block; with `unit` > 1 the pieces are whole
  // units of that many elements (torch.chunk over the block's units: 5 heads of 8 rows over 2
  // ranks are rows 0..23 and 24..39). ShapeError when the dimension's current length is not a
  // multiple of `chunks` x `unit`, or after flat().
  Region shard(int64_t dim, int64_t chunks, int64_t n, int64_t i, int64_t unit = 1) const;
  // The range [lo, hi) of the current box's row-major order; the last step (ShapeError after
  // another flat(), or when the range is outside the box).
  Region flat(int64_t lo, int64_t hi) const;

  const Shape& global_shape() const { return global_; }
  // The box before any flat range: the size of each dimension's segments.
  Shape box_shape() const;
  // The piece's shape: box_shape(), or (flat_hi - flat_lo) when flat.
  Shape local_shape() const;
  int64_t numel() const;
  bool is_flat() const { return flat_hi_ >= 0; }
  int64_t flat_lo() const { return flat_lo_; }
  int64_t flat_hi() const { return flat_hi_; }
  const std::vector<std::vector<Segment>>& segments() const { return dims_; }
  // Every run of the piece, ascending in both orders (adjacent runs merged). Local offsets are
  // the piece's own (0-based within a flat range).
  void for_each_run(const std::function<void(const Run&)>& fn) const;
  std::vector<Run> runs() const;

  // {"dims": [[[local, global, length], ...], ...], "flat": [lo, hi]} ("flat" only when flat).
  nlohmann::json to_json() const;
  // Parses and validates against `global` (segments ascending, inside the shape, local offsets
  // dense from 0, a flat range inside the box); IoError naming `where` otherwise.
  static Region from_json(const nlohmann::json& j, const Shape& global, const std::string& where);
  std::string str() const;
  bool operator==(const Region&) const = default;

 private:
  Shape global_;
  std::vector<std::vector<Segment>> dims_;
  int64_t flat_lo_ = 0, flat_hi_ = -1;
};

// Copy instructions between two pieces of one global tensor: `n` elements at offset `src` of the
// saved piece are the elements at offset `dst` of the wanted piece. Ascending in dst; every
// element both pieces hold appears once.
struct Overlap {
  int64_t src = 0, dst = 0, n = 0;
  bool operator==(const Overlap&) const = default;
};
std::vector<Overlap> overlap(const Region& saved, const Region& wanted);

// One step of a layout, in the order applied: the mesh dimension, its placement, the dimension's
// size and this rank's coordinate along it.
struct MeshStep {
  std::string dim;
  Placement placement;
  int size = 1, coordinate = 0;
};

// A tensor's layout on the mesh (DTensorSpec): its global shape and dtype, the steps that cut it
// and the region this rank holds.
struct Layout {
  Shape global_shape;
  DType dtype = kFloat32;
  std::vector<MeshStep> steps;
  Region region;

  // Region::whole(global_shape), steps empty.
  static Layout whole(const Shape& global_shape, DType dtype);
  // Appends a step; Shard and Flat narrow the region (Flat takes the range [lo, hi) of the current
  // piece's row-major order; Shard uses this rank's coordinate).
  Layout& then(const std::string& dim, Placement p, int size, int coordinate, int64_t flat_lo = 0,
               int64_t flat_hi = -1);
  // Coordinate 0 along every Replicate step: the one holder that writes this piece to a
  // checkpoint and counts it in gradient norms. (Partial pieces: every holder is primary.)
  bool primary() const;
  // The ranks holding the same piece: the product of the Replicate steps' sizes.
  int64_t holders() const;
  // "tp: Shard(0, chunks=3), dp_shard: Flat, dp_replicate: Replicate"
  std::string str() const;
};

// The layouts of a prepared model's tensors, by global name, and by tensor (tied tensors: the
// first name; aliases map every other name to it).
class LayoutTable {
 public:
  // ValueError when `name` is set already.
  void set(const std::string& name, const Tensor& t, Layout layout);
  // A later step's record of `name`: `layout` with the steps recorded for it so far put first
  // (they must not cut it: a pipeline Stage); set() when it has none.
  void extend(const std::string& name, const Tensor& t, Layout layout);
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // nullptr when `t` has no layout here.
  const Layout* find(const Tensor& t) const;
  // IndexError naming the table's size when absent.
  const Layout& at(const std::string& name) const;
  const std::vector<std::pair<std::string, Layout>>& entries() const { return entries_; }
  std::map<std::string, std::string> aliases;  // tied alias -> first name

 private:
  std::vector<std::pair<std::string, Layout>> entries_;
  std::map<std::string, size_t> index_;
  std::map<const TensorImpl*, size_t> by_tensor_;
};

// Where a tensor of a prepared model lies in its global tensor before the data-parallel engine
// cuts it (Note [format-2 strategy seam] in accelerate/strategy.h): the whole tensor when no
// model step cuts it; otherwise this rank's piece as the steps recorded it (ParallelPlan::place,
// parallel/parallelize.h). `primary`: this rank writes pieces shaped like it (a tensor replicated
// along tp is written by tp rank 0 only); `lead`: this rank is at coordinate 0 along every cut
// dimension, and writes what those ranks hold alike.
struct TensorPlace {
  Region region;
  bool primary = true;
  bool lead = true;
  std::string layout;  // informational ("tp: Shard(0)")
};

}  // namespace accel::dist
