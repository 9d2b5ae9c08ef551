// Transformer layers: PyTorch's torch.nn.TransformerEncoderLayer / TransformerDecoderLayer /
// TransformerEncoder / TransformerDecoder / Transformer with the same arguments, defaults,
// shapes, submodule and parameter names (self_attn.in_proj_weight, linear1.weight, norm1.weight,
// layers.0...., encoder.norm.weight, ...) and initialisation, so a PyTorch state_dict loads
// unchanged.
//
// Shapes (S = source length, T = target length, N = batch, E = d_model): src (S, N, E),
// tgt (T, N, E) ((N, S, E), (N, T, E) with batch_first; unbatched (S, E), (T, E) work too).
// Masks follow nn::MultiheadAttention: attn masks (L, S) or (N * nhead, L, S), bool true = NOT
// allowed or float added; key padding masks (N, S), bool true = ignore that position.
// The feed-forward block is linear2(dropout(activation(linear1(x)))), activation "relu" or
// "gelu" (exact, erf); dropout applies in training mode only. Self-attention runs the fused
// scaled_dot_product_attention (need_weights = false, as torch's layers ask).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/attention.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/norm.h"

namespace accel::nn {

// torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
// activation="relu", layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True):
//   norm_first:  x = x + sa(norm1(x)); x = x + ff(norm2(x))
//   otherwise:   x = norm1(x + sa(x)); x = norm2(x + ff(x))
// sa(x) = dropout1(self_attn(x, x, x, attn_mask = src_mask, key_padding_mask)),
// ff(x) = dropout2(linear2(dropout(activation(linear1(x))))).
// forward(src, src_mask, src_key_padding_mask, is_causal = false) -> like src; is_causal is
// torch's hint that src_mask is the causal mask (nn::MultiheadAttention).
class TransformerEncoderLayer : public TypedModule<TransformerEncoderLayer> {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, const std::string& activation = "relu",
                          double layer_norm_eps = 1e-5, bool batch_first = false,
                          bool norm_first = false, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& src, std::optional<Tensor> src_mask = std::nullopt,
                 std::optional<Tensor> src_key_padding_mask = std::nullopt, bool is_causal = false);
  using TypedModule<TransformerEncoderLayer>::operator();
  // A new layer with the same configuration, parameter values and mode (torch's deepcopy in
  // TransformerEncoder).
  std::shared_ptr<TransformerEncoderLayer> clone() const;
  std::string extra_repr() const override;

  int64_t d_model, nhead, dim_feedforward;
  double dropout_p, layer_norm_eps;
  std::string activation;
  bool batch_first, norm_first, bias;
  Child<MultiheadAttention> self_attn;
  Child<Linear> linear1;
  Child<Dropout> dropout;
  Child<Linear> linear2;
  Child<LayerNorm> norm1, norm2;
  Child<Dropout> dropout1, dropout2;

 private:
  Generator* gen_;
};

// torch.nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
// activation="relu", layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True):
//   norm_first:  x = x + sa(norm1(x)); x = x + mha(norm2(x), memory); x = x + ff(norm3(x))
//   otherwise:   x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x))
// mha(x, m) = dropout2(multihead_attn(x, m, m, attn_mask = memory_mask, memory_key_padding_mask)),
// sa and ff as in the encoder layer (ff's output dropout is dropout3).
// forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
// tgt_is_causal = false, memory_is_causal = false) -> like tgt.
class TransformerDecoderLayer : public TypedModule<TransformerDecoderLayer> {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, const std::string& activation = "relu",
                          double layer_norm_eps = 1e-5, bool batch_first = false,
                          bool norm_first = false, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& tgt, const Tensor& memory,
                 std::optional<Tensor> tgt_mask = std::nullopt,
                 std::optional<Tensor> memory_mask = std::nullopt,
                 std::optional<Tensor> tgt_key_padding_mask = std::nullopt,
                 std::optional<Tensor> memory_key_padding_mask = std::nullopt,
                 bool tgt_is_causal = false, bool memory_is_causal = false);
  using TypedModule<TransformerDecoderLayer>::operator();
  std::shared_ptr<TransformerDecoderLayer> clone() const;
  std::string extra_repr() const override;

  int64_t d_model, nhead, dim_feedforward;
  double dropout_p, layer_norm_eps;
  std::string activation;
  bool batch_first, norm_first, bias;
  Child<MultiheadAttention> self_attn, multihead_attn;
  Child<Linear> linear1;
  Child<Dropout> dropout;
  Child<Linear> linear2;
  Child<LayerNorm> norm1, norm2, norm3;
  Child<Dropout> dropout1, dropout2, dropout3;

 private:
  Generator* gen_;
};

// torch.nn.TransformerEncoder(encoder_layer, num_layers, norm=None): num_layers copies of
// encoder_layer (same initial values, as torch's deepcopy; the layer given is not registered)
// as layers.0 ... layers.{n-1}, then norm when given.
// forward(src, mask, src_key_padding_mask, is_causal = false) -> like src. As torch does for
// is_causal=None, a float mask equal to generate_square_subsequent_mask(S) (or a bool mask equal
// to its true-above-the-diagonal form) is recognised as causal, and the layers then run the
// fused kernel's causal path without reading the mask.
class TransformerEncoder : public TypedModule<TransformerEncoder> {
 public:
  TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& encoder_layer,
                     int64_t num_layers, std::shared_ptr<LayerNorm> norm = nullptr);
  Tensor forward(const Tensor& src, std::optional<Tensor> mask = std::nullopt,
                 std::optional<Tensor> src_key_padding_mask = std::nullopt, bool is_causal = false);
  using TypedModule<TransformerEncoder>::operator();

  int64_t num_layers;
  Child<ModuleList> layers;
  Child<LayerNorm> norm;  // null without
};

// torch.nn.TransformerDecoder(decoder_layer, num_layers, norm=None), as TransformerEncoder.
// forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
// tgt_is_causal = false, memory_is_causal = false) -> like tgt (tgt_mask recognised as causal
// as in TransformerEncoder).
class TransformerDecoder : public TypedModule<TransformerDecoder> {
 public:
  TransformerDecoder(const std::shared_ptr<TransformerDecoderLayer>& decoder_layer,
                     int64_t num_layers, std::shared_ptr<LayerNorm> norm = nullptr);
  Tensor forward(const Tensor& tgt, const Tensor& memory,
                 std::optional<Tensor> tgt_mask = std::nullopt,
                 std::optional<Tensor> memory_mask = std::nullopt,
                 std::optional<Tensor> tgt_key_padding_mask = std::nullopt,
                 std::optional<Tensor> memory_key_padding_mask = std::nullopt,
                 bool tgt_is_causal = false, bool memory_is_causal = false);
  using TypedModule<TransformerDecoder>::operator();

  int64_t num_layers;
  Child<ModuleList> layers;
  Child<LayerNorm> norm;
};

// torch.nn.Transformer(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
// dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
// custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True):
// encoder = TransformerEncoder(layer, num_encoder_layers, LayerNorm(d_model)), decoder likewise;
// then every parameter with more than one dim is re-drawn xavier_uniform_, as torch does.
// Custom encoder/decoder are not supported. forward(src, tgt, src_mask, tgt_mask, memory_mask,
// src_key_padding_mask, tgt_key_padding_mask, memory_key_padding_mask, src_is_causal = false,
// tgt_is_causal = false, memory_is_causal = false) -> like tgt.
class Transformer : public TypedModule<Transformer> {
 public:
  Transformer(int64_t d_model = 512, int64_t nhead = 8, int64_t num_encoder_layers = 6,
              int64_t num_decoder_layers = 6, int64_t dim_feedforward = 2048, double dropout = 0.1,
              const std::string& activation = "relu", double layer_norm_eps = 1e-5,
              bool batch_first = false, bool norm_first = false, bool bias = true,
              Generator* gen = nullptr);
  Tensor forward(const Tensor& src, const Tensor& tgt,
                 std::optional<Tensor> src_mask = std::nullopt,
                 std::optional<Tensor> tgt_mask = std::nullopt,
                 std::optional<Tensor> memory_mask = std::nullopt,
                 std::optional<Tensor> src_key_padding_mask = std::nullopt,
                 std::optional<Tensor> tgt_key_padding_mask = std::nullopt,
                 std::optional<Tensor> memory_key_padding_mask = std::nullopt,
                 bool src_is_causal = false, bool tgt_is_causal = false,
                 bool memory_is_causal = false);
  using TypedModule<Transformer>::operator();
  // torch.nn.Transformer.generate_square_subsequent_mask(sz): (sz, sz) float, -inf above the
  // diagonal (j > i), 0 elsewhere.
  static Tensor generate_square_subsequent_mask(int64_t sz, TensorOptions options = {});

  int64_t d_model, nhead;
  bool batch_first;
  Child<TransformerEncoder> encoder;
  Child<TransformerDecoder> decoder;
};

}  // namespace accel::nn
