// Context parallelism: every sequence of a forward split across the ranks of a cp group, attention
// computed as ring attention over the group (Note [ring attention] in context_parallel.cc).
//
//   AcceleratorConfig c;
//   c.parallelism.cp_size = 2;               // or accel-run --cp_size 2
//   c.cp_plan = models::gpt_cp_plan();       // which modules attend, which take positions
//   Accelerator acc(c);
//   auto [model, opt, loader] = acc.prepare(model, opt, loader);  // batches: this rank's tokens
//
// Without the Accelerator: shard the inputs with cp_shard_sequence and call ring_attention (or
// run a model inside a ContextAttentionGuard, autograd/context_attention.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/device_mesh.h"
#include "comm/process_group.h"
#include "core/tensor.h"

namespace accel::dist {

// Note [zig-zag sequence sharding]
// Causal attention over a sequence cut into c contiguous pieces would give rank c - 1 all the work
// (its queries see every key) and rank 0 almost none. Zig-zag sharding (Megatron's and
// torchtitan's load-balanced sharding) cuts the sequence of T tokens into 2c chunks of L = T / (2c)
// and gives rank r chunks r and 2c - 1 - r, in that order: every rank holds 2L tokens and an equal
// share of the causal work. T must be divisible by 2c (a ShapeError naming the shape otherwise).
// Position p < L of a rank's tokens is global position r L + p, position p >= L is
// (2c - 1 - r) L + p - L.

// The global positions of the `local_len` (= 2L) tokens rank `rank` of `size` holds: int64,
// (local_len).
Tensor cp_positions(int64_t local_len, int rank, int size, Device device = kCPU);
// Rank `rank` of `size`'s tokens of `x`, whose dim `dim` is the whole sequence: the two chunks
// concatenated (differentiable: narrow and cat).
Tensor cp_shard_sequence(const Tensor& x, int64_t dim, int rank, int size);
// The whole sequence along `dim` from every rank's tokens (collective over `group`: an
// all-gather, then the chunks put back in order). Not differentiable: for outputs and checks.
Tensor cp_unshard_sequence(const Tensor& x, int64_t dim, const ProcessGroupPtr& group);

// This rank's place along a mesh's "cp" dimension ({0, 1} without one): what a prepared loader
// cuts its batches by.
struct SequenceSplit {
  int rank = 0;
  int size = 1;
};
SequenceSplit sequence_split(const DeviceMesh& mesh);

// Ring attention over `group` (Note [ring attention] in context_parallel.cc): q, k: (B, H, T, D),
// v: (B, H, T, Dv), each rank's T = 2L tokens in zig-zag order -> (B, H, T, Dv), equal to this
// rank's rows of scaled_dot_product_attention over the whole sequence (causal: each token sees
// the tokens at or before its global position). Collective over `group`, forward and backward.
// A group of one is scaled_dot_product_attention itself.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                      const ProcessGroupPtr& group);

// What the cp step does to a planned module (AcceleratorConfig::cp_plan).
struct CpStyle {
  enum class Kind : uint8_t {
    // Its calls of scaled_dot_product_attention (and the packed form: CausalSelfAttention,
    // MultiheadAttention with need_weights = false, a module of one's own) run ring attention.
    RingAttention,
    // Its first argument holds positions 0..T-1 of this rank's T tokens (a learned position
    // embedding called with arange(T)): they become the tokens' global positions.
    Positions,
  };
  Kind kind = Kind::RingAttention;
  std::string name() const;  // "ring_attention", "positions"
};
CpStyle cp_ring_attention();
CpStyle cp_position_ids();
// Module-name patterns ('*': one path component, as TpPlan's) and their styles. At least one
// RingAttention entry; every pattern must match a module (ValueError naming it otherwise).
using CpPlan = std::vector<std::pair<std::string, CpStyle>>;

namespace detail {
// Tests only: the block backward of the composed ops (what runs off the CPU) on the CPU too.
void set_ring_attention_composed(bool on);
}  // namespace detail

}  // namespace accel::dist
