// GPT-2 as transformers builds it (GPT2LMHeadModel), with transformers' module names, so that a
// Hugging Face state dict loads, and saves, unchanged (docs/hf.md):
//
//   transformer.wte.weight (vocab, n_embd)         transformer.wpe.weight (n_positions, n_embd)
//   transformer.h.<i>.ln_1.{weight,bias}           transformer.h.<i>.attn.c_attn.{weight,bias}
//   transformer.h.<i>.attn.c_proj.{weight,bias}    transformer.h.<i>.ln_2.{weight,bias}
//   transformer.h.<i>.mlp.c_fc.{weight,bias}       transformer.h.<i>.mlp.c_proj.{weight,bias}
//   transformer.ln_f.{weight,bias}                 lm_head.weight (tied to transformer.wte.weight)
//
// The projections are transformers' Conv1D: the weight is stored (in, out), transposed against
// nn::Linear, and applied as x @ weight + bias; c_attn packs [q | k | v] along its outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "nn/container.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "hf/causal_lm.h"
#include "hf/config.h"
#include "parallel/tensor_parallel.h"

namespace accel::hf {

// transformers.pytorch_utils.Conv1D(nf, nx) (the argument order is transformers': outputs
// first): weight (nx, nf) ~ N(0, init_std), bias (nf) zeros. x (..., nx) -> (..., nf) =
// x @ weight + bias. Its sizes are read from the weight, so that tensor parallelism can shard it
// in place (Note [transposed linear layers] in parallel/tensor_parallel.h).
class Conv1D : public nn::Module, public dist::TransposedLinear {
 public:
  Conv1D(int64_t nf, int64_t nx, double init_std = 0.02, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;  // "nf=96, nx=32"
  Tensor transposed_weight() const override { return weight; }
  Tensor transposed_bias() const override { return bias; }

  double init_std;
  nn::Parameter weight;  // (nx, nf)
  nn::Parameter bias;    // (nf)
};

// The activation of a GPT-2 MLP by transformers' name (ValueError for another one).
Tensor gpt2_activation(const Tensor& x, const std::string& name);

// transformers' GPT2Attention (eager): heads of n_embd / n_head, scores scaled by 1 / sqrt(head
// dim) (scale_attn_weights), causal, attention dropout attn_pdrop and residual dropout
// resid_pdrop in training. The heads it runs are read from c_attn's output, so a tensor-parallel
// c_attn (colwise, chunks 3) makes it run this rank's heads.
class GPT2Attention : public nn::TypedModule<GPT2Attention> {
 public:
  GPT2Attention(const GPT2Config& c, Generator* gen = nullptr);
  // x (B, T, n_embd), cached keys / values (B, H, S, D) -> (out (B, T, n_embd), keys and values
  // (B, H, S + T, D): the cache after this call; Note [kv cache] in hf/causal_lm.h).
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x,
                                             std::optional<Tensor> past_key = std::nullopt,
                                             std::optional<Tensor> past_value = std::nullopt);
  std::string extra_repr() const override;

  int64_t head_dim;
  double attn_pdrop;
  bool scale_attn_weights;
  nn::Child<Conv1D> c_attn, c_proj;
  nn::Child<nn::Dropout> attn_dropout, resid_dropout;
};

// transformers' GPT2MLP: c_proj(act(c_fc(x))), dropout resid_pdrop.
class GPT2MLP : public nn::Module {
 public:
  GPT2MLP(const GPT2Config& c, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  std::string activation;
  nn::Child<Conv1D> c_fc, c_proj;
  nn::Child<nn::Dropout> dropout;
};

// transformers' GPT2Block: x + attn(ln_1(x)), then + mlp(ln_2(.)). A ZeRO-3 unit when the model
// is sharded (an entry of transformer.h).
class GPT2Block : public nn::TypedModule<GPT2Block> {
 public:
  GPT2Block(const GPT2Config& c, Generator* gen = nullptr);
  // x (B, T, n_embd) -> (hidden, keys, values) as GPT2Attention.
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x,
                                             std::optional<Tensor> past_key = std::nullopt,
                                             std::optional<Tensor> past_value = std::nullopt);

  nn::Child<nn::LayerNorm> ln_1;
  nn::Child<GPT2Attention> attn;
  nn::Child<nn::LayerNorm> ln_2;
  nn::Child<GPT2MLP> mlp;
};

// transformers' GPT2Model: token and position embeddings, the blocks, the final LayerNorm.
class GPT2Model : public nn::Module {
 public:
  GPT2Model(const GPT2Config& c, Generator* gen = nullptr);
  // input_ids (B, T) -> hidden states (B, T, n_embd).
  Tensor forward(const Tensor& input_ids) override { return hidden(input_ids, nullptr); }
  // The same with a cache (Note [kv cache]): positions start at cache->length().
  Tensor hidden(const Tensor& input_ids, KVCache* cache);

  GPT2Config config;
  nn::Child<nn::Embedding> wte, wpe;
  nn::Child<nn::Dropout> drop;
  nn::Child<nn::ModuleList> h;
  nn::Child<nn::LayerNorm> ln_f;
};

// transformers' GPT2LMHeadModel: GPT2Model and lm_head (n_embd -> vocab, no bias), tied to wte
// when tie_word_embeddings (the default). Initialised as transformers' _init_weights (normal
// initializer_range; c_proj weights initializer_range / sqrt(2 n_layer); LayerNorm 1, 0) from
// `gen`; under nn::DeferredInit nothing is drawn (load weights into it).
class GPT2LMHeadModel : public CausalLM {
 public:
  explicit GPT2LMHeadModel(GPT2Config c, Generator* gen = nullptr);

  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t num_layers() const override { return config.n_layer; }
  std::optional<int64_t> max_positions() const override { return config.n_positions; }
  std::string model_type() const override { return "gpt2"; }
  nlohmann::json config_json() const override { return config.to_json(); }
  std::string base_model_prefix() const override { return "transformer"; }
  bool ignored_on_load(const std::string& name) const override;

  GPT2Config config;
  nn::Child<GPT2Model> transformer;
  nn::Child<nn::Linear> lm_head;

 protected:
  Tensor run(const Tensor& input_ids, KVCache* cache) override;
};

// Megatron-style tensor parallelism for GPT2LMHeadModel (dist::parallelize, or
// AcceleratorConfig::tp_plan with tp_size > 1): each block's attention split by heads (c_attn
// colwise with chunks = 3, as its [q | k | v] is packed, and c_proj rowwise) and its MLP (c_fc
// colwise, c_proj rowwise); the Conv1D weights are sharded along their transposed dims. The
// embeddings, LayerNorms and the tied lm_head stay replicated. n_head must be divisible by the
// tp size.
dist::TpPlan gpt2_tp_plan();

}  // namespace accel::hf
