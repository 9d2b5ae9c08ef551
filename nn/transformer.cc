#include "nn/transformer.h"

#include <cmath>
#include <sstream>

#include "nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

namespace {

void check_layer_args(const char* op, int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                      double dropout, const std::string& activation) {
  ACCEL_CHECK(d_model > 0 && nhead > 0 && d_model % nhead == 0, ValueError, op, "d_model (",
              d_model, ") must be a positive multiple of nhead (", nhead, ")");
  ACCEL_CHECK(dim_feedforward > 0, ValueError, op, "dim_feedforward must be positive, got ",
              dim_feedforward);
  ACCEL_CHECK(dropout >= 0 && dropout <= 1, ValueError, op, "dropout must be in [0, 1], got ",
              dropout);
  ACCEL_CHECK(activation == "relu" || activation == "gelu", ValueError, op,
              "activation should be relu/gelu, not ", activation);
}

Tensor activate(const std::string& activation, const Tensor& x) {
  return activation == "relu" ? relu(x) : gelu(x);
}

// Whether `mask` is generate_square_subsequent_mask(sz) (float) or its bool form (true above
// the diagonal): torch's _detect_is_causal_mask, which lets the layers skip reading the mask.
bool detect_causal(const std::optional<Tensor>& mask, int64_t sz) {
  if (!mask || !mask->defined()) return false;
  const Tensor& m = *mask;
  if (m.dim() != 2 || m.size(0) != sz || m.size(1) != sz) return false;
  NoGradGuard ng;
  const Tensor ref = Transformer::generate_square_subsequent_mask(
      sz, TensorOptions(m.dtype() == kBool ? kFloat32 : m.dtype(), m.device()));
  if (m.dtype() == kBool) return equal(m, lt(ref, zeros_like(ref)));
  return is_floating(m.dtype()) && equal(m, ref);
}

// The sequence dim of a (L, N, E) / (N, L, E) / (L, E) input.
int64_t seq_len(const Tensor& x, bool batch_first) {
  return x.dim() == 3 && batch_first ? x.size(1) : x.size(0);
}

}  // namespace

// ---------------- TransformerEncoderLayer ----------------

TransformerEncoderLayer::TransformerEncoderLayer(int64_t dm, int64_t nh, int64_t dff, double p,
                                                 const std::string& act, double eps, bool bf,
                                                 bool nf, bool b, Generator* gen)
    : d_model(dm),
      nhead(nh),
      dim_feedforward(dff),
      dropout_p(p),
      layer_norm_eps(eps),
      activation(act),
      batch_first(bf),
      norm_first(nf),
      bias(b),
      gen_(gen) {
  check_layer_args("TransformerEncoderLayer", dm, nh, dff, p, act);
  // torch's registration order: self_attn, linear1, dropout, linear2, norm1, norm2, dropout1,
  // dropout2.
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(dm, nh, p, b, false, false, std::nullopt,
                                                        std::nullopt, bf, gen));
  linear1 = register_module("linear1", std::make_shared<Linear>(dm, dff, b, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(p, gen));
  linear2 = register_module("linear2", std::make_shared<Linear>(dff, dm, b, gen));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(dm, eps, true, b));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(dm, eps, true, b));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p, gen));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p, gen));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, std::optional<Tensor> src_mask,
                                        std::optional<Tensor> src_key_padding_mask,
                                        bool is_causal) {
  ACCEL_CHECK(src.defined(), ValueError, "TransformerEncoderLayer", "src is undefined");
  auto sa = [&](const Tensor& x) {
    auto [y, w] = self_attn->forward(x, x, x, src_key_padding_mask, /*need_weights=*/false,
                                     src_mask, true, is_causal);
    return dropout1->forward(y);
  };
  auto ff = [&](const Tensor& x) {
    return dropout2->forward(
        linear2->forward(dropout->forward(activate(activation, linear1->forward(x)))));
  };
  Tensor x = src;
  if (norm_first) {
    x = add(x, sa(norm1->forward(x)));
    return add(x, ff(norm2->forward(x)));
  }
  x = norm1->forward(add(x, sa(x)));
  return norm2->forward(add(x, ff(x)));
}

std::shared_ptr<TransformerEncoderLayer> TransformerEncoderLayer::clone() const {
  auto c = std::make_shared<TransformerEncoderLayer>(d_model, nhead, dim_feedforward, dropout_p,
                                                     activation, layer_norm_eps, batch_first,
                                                     norm_first, bias, gen_);
  c->load_state_dict(state_dict());
  c->train(is_training());
  return c;
}

std::string TransformerEncoderLayer::extra_repr() const {
  std::ostringstream os;
  os << "d_model=" << d_model << ", nhead=" << nhead << ", dim_feedforward=" << dim_feedforward
     << ", activation=" << activation << ", norm_first=" << (norm_first ? "true" : "false");
  return os.str();
}

// ---------------- TransformerDecoderLayer ----------------

TransformerDecoderLayer::TransformerDecoderLayer(int64_t dm, int64_t nh, int64_t dff, double p,
                                                 const std::string& act, double eps, bool bf,
                                                 bool nf, bool b, Generator* gen)
    : d_model(dm),
      nhead(nh),
      dim_feedforward(dff),
      dropout_p(p),
      layer_norm_eps(eps),
      activation(act),
      batch_first(bf),
      norm_first(nf),
      bias(b),
      gen_(gen) {
  check_layer_args("TransformerDecoderLayer", dm, nh, dff, p, act);
  auto mha = [&] {
    return std::make_shared<MultiheadAttention>(dm, nh, p, b, false, false, std::nullopt,
                                                std::nullopt, bf, gen);
  };
  self_attn = register_module("self_attn", mha());
  multihead_attn = register_module("multihead_attn", mha());
  linear1 = register_module("linear1", std::make_shared<Linear>(dm, dff, b, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(p, gen));
  linear2 = register_module("linear2", std::make_shared<Linear>(dff, dm, b, gen));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(dm, eps, true, b));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(dm, eps, true, b));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(dm, eps, true, b));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p, gen));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p, gen));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(p, gen));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        std::optional<Tensor> tgt_mask,
                                        std::optional<Tensor> memory_mask,
                                        std::optional<Tensor> tgt_key_padding_mask,
                                        std::optional<Tensor> memory_key_padding_mask,
                                        bool tgt_is_causal, bool memory_is_causal) {
  ACCEL_CHECK(tgt.defined() && memory.defined(), ValueError, "TransformerDecoderLayer",
              "tgt and memory must be defined");
  auto sa = [&](const Tensor& x) {
    auto [y, w] =
        self_attn->forward(x, x, x, tgt_key_padding_mask, false, tgt_mask, true, tgt_is_causal);
    return dropout1->forward(y);
  };
  auto mha = [&](const Tensor& x) {
    auto [y, w] = multihead_attn->forward(x, memory, memory, memory_key_padding_mask, false,
                                          memory_mask, true, memory_is_causal);
    return dropout2->forward(y);
  };
  auto ff = [&](const Tensor& x) {
    return dropout3->forward(
        linear2->forward(dropout->forward(activate(activation, linear1->forward(x)))));
  };
  Tensor x = tgt;
  if (norm_first) {
    x = add(x, sa(norm1->forward(x)));
    x = add(x, mha(norm2->forward(x)));
    return add(x, ff(norm3->forward(x)));
  }
  x = norm1->forward(add(x, sa(x)));
  x = norm2->forward(add(x, mha(x)));
  return norm3->forward(add(x, ff(x)));
}

std::shared_ptr<TransformerDecoderLayer> TransformerDecoderLayer::clone() const {
  auto c = std::make_shared<TransformerDecoderLayer>(d_model, nhead, dim_feedforward, dropout_p,
                                                     activation, layer_norm_eps, batch_first,
                                                     norm_first, bias, gen_);
  c->load_state_dict(state_dict());
  c->train(is_training());
  return c;
}

std::string TransformerDecoderLayer::extra_repr() const {
  std::ostringstream os;
  os << "d_model=" << d_model << ", nhead=" << nhead << ", dim_feedforward=" << dim_feedforward
     << ", activation=" << activation << ", norm_first=" << (norm_first ? "true" : "false");
  return os.str();
}

// ---------------- TransformerEncoder / TransformerDecoder ----------------

TransformerEncoder::TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& layer,
                                       int64_t n, std::shared_ptr<LayerNorm> nrm)
    : num_layers(n) {
  ACCEL_CHECK(layer != nullptr && n >= 1, ValueError, "TransformerEncoder",
              "needs an encoder layer and num_layers >= 1, got num_layers = ", n);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n; ++i) layers->push_back(layer->clone());
  if (nrm) norm = register_module("norm", std::move(nrm));
}

Tensor TransformerEncoder::forward(const Tensor& src, std::optional<Tensor> mask,
                                   std::optional<Tensor> src_key_padding_mask, bool is_causal) {
  ACCEL_CHECK(src.defined(), ValueError, "TransformerEncoder", "src is undefined");
  const auto first = layers->at<TransformerEncoderLayer>(0);
  const bool causal = is_causal || detect_causal(mask, seq_len(src, first->batch_first));
  // Each layer through its entry (hooks, an engine's wrapper), as torch calls mod(...).
  Tensor x = src;
  for (size_t i = 0; i < layers->size(); ++i) {
    x = (*layers)[i]->call<Tensor>(x, mask, src_key_padding_mask, causal);
  }
  return norm ? norm->forward(x) : x;
}

TransformerDecoder::TransformerDecoder(const std::shared_ptr<TransformerDecoderLayer>& layer,
                                       int64_t n, std::shared_ptr<LayerNorm> nrm)
    : num_layers(n) {
  ACCEL_CHECK(layer != nullptr && n >= 1, ValueError, "TransformerDecoder",
              "needs a decoder layer and num_layers >= 1, got num_layers = ", n);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n; ++i) layers->push_back(layer->clone());
  if (nrm) norm = register_module("norm", std::move(nrm));
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory,
                                   std::optional<Tensor> tgt_mask,
                                   std::optional<Tensor> memory_mask,
                                   std::optional<Tensor> tgt_key_padding_mask,
                                   std::optional<Tensor> memory_key_padding_mask,
                                   bool tgt_is_causal, bool memory_is_causal) {
  ACCEL_CHECK(tgt.defined() && memory.defined(), ValueError, "TransformerDecoder",
              "tgt and memory must be defined");
  const auto first = layers->at<TransformerDecoderLayer>(0);
  const bool causal = tgt_is_causal || detect_causal(tgt_mask, seq_len(tgt, first->batch_first));
  Tensor x = tgt;
  for (size_t i = 0; i < layers->size(); ++i) {
    x = (*layers)[i]->call<Tensor>(x, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                                   memory_key_padding_mask, causal, memory_is_causal);
  }
  return norm ? norm->forward(x) : x;
}

// ---------------- Transformer ----------------

Transformer::Transformer(int64_t dm, int64_t nh, int64_t n_enc, int64_t n_dec, int64_t dff,
                         double p, const std::string& act, double eps, bool bf, bool nf, bool b,
                         Generator* gen)
    : d_model(dm), nhead(nh), batch_first(bf) {
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(
                                           std::make_shared<TransformerEncoderLayer>(
                                               dm, nh, dff, p, act, eps, bf, nf, b, gen),
                                           n_enc, std::make_shared<LayerNorm>(dm, eps, true, b)));
  decoder = register_module("decoder", std::make_shared<TransformerDecoder>(
                                           std::make_shared<TransformerDecoderLayer>(
                                               dm, nh, dff, p, act, eps, bf, nf, b, gen),
                                           n_dec, std::make_shared<LayerNorm>(dm, eps, true, b)));
  // torch's _reset_parameters: xavier_uniform_ on every parameter with more than one dim.
  for (Tensor& w : parameters()) {
    if (w.dim() > 1) init::xavier_uniform_(w, 1.0, gen);
  }
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, std::optional<Tensor> src_mask,
                            std::optional<Tensor> tgt_mask, std::optional<Tensor> memory_mask,
                            std::optional<Tensor> src_key_padding_mask,
                            std::optional<Tensor> tgt_key_padding_mask,
                            std::optional<Tensor> memory_key_padding_mask, bool src_is_causal,
                            bool tgt_is_causal, bool memory_is_causal) {
  const char* op = "Transformer";
  ACCEL_CHECK(src.defined() && tgt.defined(), ValueError, op, "src and tgt must be defined");
  const bool batched = src.dim() == 3;
  ACCEL_CHECK(src.dim() == tgt.dim() && (batched || src.dim() == 2), ShapeError, op,
              "src and tgt must both be batched (3-D) or unbatched (2-D), got ", src.sizes(),
              " and ", tgt.sizes());
  const int64_t bd = batch_first ? 0 : 1;
  ACCEL_CHECK(!batched || src.size(bd) == tgt.size(bd), ShapeError, op,
              "the batch number of src and tgt must be equal, got ", src.sizes(), " and ",
              tgt.sizes(), batch_first ? " (batch_first)" : "");
  ACCEL_CHECK(src.size(-1) == d_model && tgt.size(-1) == d_model, ShapeError, op,
              "the feature number of src and tgt must be equal to d_model (", d_model, "), got ",
              src.sizes(), " and ", tgt.sizes());
  const Tensor memory = encoder->forward(src, src_mask, src_key_padding_mask, src_is_causal);
  return decoder->forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                          memory_key_padding_mask, tgt_is_causal, memory_is_causal);
}

Tensor Transformer::generate_square_subsequent_mask(int64_t sz, TensorOptions options) {
  ACCEL_CHECK(sz >= 0, ValueError, "Transformer.generate_square_subsequent_mask",
              "size must be non-negative, got ", sz);
  if (!is_floating(options.dtype)) options.dtype = kFloat32;
  NoGradGuard ng;
  return triu(full({sz, sz}, -INFINITY, options), 1);
}

}  // namespace accel::nn
