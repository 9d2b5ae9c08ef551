// Random draws that follow an element's place in the tensor one process would hold: counter-based
// bits, and the layout of the activations where tensor parallelism shards them, which dropout reads
// to draw each element's mask from its global position (Note [dropout under tensor parallelism] in
// parallel/tp_random.cc; Note [dropout mask] in autograd/ops/activation.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/shape.h"

namespace accel {

// Value `index` of the random stream `key`: SplitMix64's output number index + 1 from seed key, so
// any element's bits come without drawing the ones before it (a counter-based generator, as
// Philox is for torch's CUDA dropout).
inline uint64_t counter_bits(uint64_t key, uint64_t index) {
  uint64_t z = key + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Where this rank's elements sit in the tensor one process would hold: along `dim`, this rank's
// length is `chunks` equal blocks of n, and block c holds the global indices
// [(c * ways + index) * n, (c * ways + index + 1) * n) of a dimension `ways` times longer; the
// other dimensions are whole. ways 1: the tensor is whole.
struct ShardLayout {
  int64_t dim = 0;
  int64_t ways = 1;
  int64_t index = 0;
  int64_t chunks = 1;
};

// What a random op draws for; its caller says so with DrawSiteGuard.
enum class DrawSite : uint8_t {
  Elements,          // an activation, laid out as the region says
  AttentionWeights,  // softmax weights (B, H, L, S): heads on dim 1
};

// How tensor parallelism has laid out the activations at this point of a forward, on this thread
// (set by the styles of parallel/tensor_parallel.h as their outputs leave them): ways 1 where they
// are whole, that is outside tensor parallelism or replicated over it.
struct ShardedRegion {
  int ways = 1;
  int index = 0;
  // dim >= 0: that dim of activations of rank `ndim` (a sequence: dim 1 of (B, T, C));
  // dim < 0: counted from the end, any rank (the features of a colwise output: -1).
  int64_t dim = -1;
  int64_t ndim = 0;
  int64_t length = 0;  // this rank's length along dim
  int64_t chunks = 1;  // packed blocks along dim (a colwise [q | k | v] output: 3)
  // Attention weights (B, H, L, S) computed in the region hold this rank's heads (between a
  // colwise and a rowwise layer: the heads are split).
  bool heads = false;
  // The ranks' pieces differ in size (torch.chunk's uneven split: parallel/tensor_parallel.cc
  // Note [uneven tp shards]): where an element sits is not drawn here, so random ops refuse.
  bool uneven = false;
  // The style and module whose output opened the region ("tensor-parallel rowwise
  // 'blocks.0.attn.proj' (sequence parallel)"), for errors.
  std::shared_ptr<const std::string> source;
};

// This thread's region, and setting it (parallel/ does, and activation checkpointing's
// recompute puts back the one its forward saw).
const ShardedRegion& sharded_region();
void set_sharded_region(ShardedRegion region);
DrawSite draw_site();
// Random draws made through draw_layout on this thread so far (tp's generator check counts them).
uint64_t sharded_draw_count();

// Sets `region` (or `site`) on this thread for its lifetime, then puts the previous one back.
class ShardedRegionGuard {
 public:
  explicit ShardedRegionGuard(ShardedRegion region);
  ~ShardedRegionGuard();
  ShardedRegionGuard(const ShardedRegionGuard&) = delete;
  ShardedRegionGuard& operator=(const ShardedRegionGuard&) = delete;

 private:
  ShardedRegion saved_;
};
class DrawSiteGuard {
 public:
  explicit DrawSiteGuard(DrawSite site);
  ~DrawSiteGuard();
  DrawSiteGuard(const DrawSiteGuard&) = delete;
  DrawSiteGuard& operator=(const DrawSiteGuard&) = delete;

 private:
  DrawSite saved_;
};

// Where the elements of a random op's input of `shape` sit, in this thread's region at this
// thread's site: whole outside a region; else the region's layout when the shape fits it (rank
// and length along the region's dim; 4-D with heads for attention weights). A shape that does not
// fit is a ValueError naming `op`, the shape and the region's source: its mask cannot be drawn as
// one process would draw it. Counts as one draw (sharded_draw_count).
ShardLayout draw_layout(const char* op, const Shape& shape);

}  // namespace accel
