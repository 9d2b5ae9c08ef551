// Causal multi-head self-attention (GPT-2 style):
//   x: (B, T, C) -> qkv = x W_qkv^T + b: (B, T, 3C) -> q, k, v: (B, H, T, D), D = C / H
//   att = softmax(mask(q k^T / sqrt(D))): (B, H, T, T), position t attends to positions <= t
//   y = att v: (B, H, T, D) -> (B, T, C) -> output projection: (B, T, C)
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "nn/linear.h"
#include "nn/module.h"

namespace accel::nn {

// `gen` initialises qkv and proj; dropout (on the attention weights and on the output, p =
// `dropout`, training only) draws from the default generator, as torch's modules do.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t d_model, int64_t n_heads, bool bias = true, double dropout = 0.0,
                      Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  int64_t d_model, n_heads, head_dim;
  // The heads this module runs: n_heads, or n_heads / tp once dist::parallelize split its heads
  // (qkv then holds this rank's heads' rows of q, k and v, and proj their columns).
  int64_t local_heads;
  Child<Linear> qkv;   // C -> 3C: [q | k | v]
  Child<Linear> proj;  // C -> C
  Child<Dropout> attn_dropout, resid_dropout;

 private:
  // (T, T) bool, true above the diagonal (future positions), rebuilt when T or device change.
  const Tensor& causal_mask(int64_t T, Device device);
  Tensor mask_;
};

// torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
// add_zero_attn=False, kdim=None, vdim=None, batch_first=False): the same arguments, defaults,
// parameter names and initialisation, so a PyTorch state_dict loads unchanged.
//   parameters  in_proj_weight (3E, E) when kdim == vdim == E, else q_proj_weight (E, E),
//               k_proj_weight (E, kdim), v_proj_weight (E, vdim); in_proj_bias (3E) with bias;
//               out_proj.weight (E, E), out_proj.bias (E) with bias
//   init        out_proj as Linear (drawn first, as torch's constructor does), then
//               xavier_uniform_ on the input projections, zero biases
// forward(query, key, value, key_padding_mask, need_weights=true, attn_mask,
//         average_attn_weights=true, is_causal=false) -> (attn_output, attn_weights):
//   query (L, N, E), key (S, N, kdim), value (S, N, vdim) ((N, L, E) ... with batch_first; or
//   unbatched (L, E), (S, kdim), (S, vdim)) -> attn_output like query;
//   key_padding_mask (N, S) (unbatched (S)): bool true = ignore that key, or float added;
//   attn_mask (L, S) or (N * num_heads, L, S): bool true = NOT allowed (torch's convention for
//   this module, the opposite of scaled_dot_product_attention's), or float added;
//   attn_weights (N, L, S) averaged over heads, (N, num_heads, L, S) otherwise, after dropout as
//   torch returns them; an undefined tensor (torch's None) when need_weights is false.
//   is_causal is torch's hint: attn_mask must be given too (ValueError otherwise); without
//   key_padding_mask and need_weights the fused kernel then runs causal and skips the mask.
// need_weights = false runs the fused scaled_dot_product_attention (O(L) memory per row block on
// the CPU); need_weights = true materialises the weights, as torch does. Dropout on the
// attention weights applies in training mode only.
// Not supported: add_bias_kv and add_zero_attn (ValueError when true).
class MultiheadAttention : public TypedModule<MultiheadAttention> {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool add_bias_kv = false, bool add_zero_attn = false,
                     std::optional<int64_t> kdim = std::nullopt,
                     std::optional<int64_t> vdim = std::nullopt, bool batch_first = false,
                     Generator* gen = nullptr);
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     std::optional<Tensor> key_padding_mask = std::nullopt,
                                     bool need_weights = true,
                                     std::optional<Tensor> attn_mask = std::nullopt,
                                     bool average_attn_weights = true, bool is_causal = false);
  using TypedModule<MultiheadAttention>::operator();
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t embed_dim, kdim, vdim, num_heads, head_dim;
  double dropout;
  bool batch_first;
  // Set when kdim == vdim == embed_dim (torch's _qkv_same_embed_dim).
  bool qkv_same_embed_dim;
  Parameter in_proj_weight;                               // (3E, E) or None
  Parameter q_proj_weight, k_proj_weight, v_proj_weight;  // or None
  Parameter in_proj_bias;                                 // (3E) or None
  Child<Linear> out_proj;

 private:
  Generator* gen_;  // dropout
};

}  // namespace accel::nn
