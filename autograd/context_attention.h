// Attention over a sequence split across ranks (Note [context attention]).
#pragma once

#include <functional>
#include <string>

#include "core/tensor.h"

namespace accel {

// Note [context attention]
// Context parallelism (parallel/context_parallel.h) splits every sequence of a forward across the
// ranks of its cp group: each rank's attention must then see the keys and values of every rank,
// which the fused kernel of one process cannot. The cp step installs, around each attention
// module it is given, a scope in which scaled_dot_product_attention and its packed form call
// `attend` instead (ring attention over the group); everything else in the module runs on the
// rank's tokens as it is. Inside the scope an attention the ring cannot compute (an attn_mask,
// dropout on the weights, weights materialised by a module) is a ValueError naming `what`: it
// would otherwise attend within the rank's chunk only, without a word.
struct ContextAttention {
  // q: (B, H, T, D), k: (B, H, T, D), v: (B, H, T, Dv): this rank's tokens -> (B, H, T, Dv).
  std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       double scale)>
      attend;
  std::string what;  // "context parallelism (cp 2) in 'blocks.0.attn'"
};

// Rank `rank` of `size`'s tokens of `x` along `dim`, whose length the caller has checked is a
// multiple of 2 x size: chunks rank and 2 size - 1 - rank of 2 size, concatenated (Note [zig-zag
// sequence sharding] in parallel/context_parallel.h; differentiable). Here, below both of its
// users: parallel's cp_shard_sequence and data's prepared loaders.
Tensor zigzag_part(const Tensor& x, int64_t dim, int rank, int size);

// The scope on this thread (null outside one).
const ContextAttention* context_attention();

// Sets `ca` on this thread for its lifetime (nested scopes restore the outer one).
class ContextAttentionGuard {
 public:
  explicit ContextAttentionGuard(const ContextAttention* ca);
  ~ContextAttentionGuard();
  ContextAttentionGuard(const ContextAttentionGuard&) = delete;
  ContextAttentionGuard& operator=(const ContextAttentionGuard&) = delete;

 private:
  const ContextAttention* saved_;
};

}  // namespace accel
