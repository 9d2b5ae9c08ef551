// A Llama-style decoder as transformers builds it (LlamaForCausalLM), with transformers' module
// names, so that a Hugging Face state dict loads and saves unchanged (docs/hf.md):
//
//   model.embed_tokens.weight (vocab, hidden)
//   model.layers.<i>.self_attn.{q,k,v,o}_proj.weight (+ .bias with attention_bias)
//   model.layers.<i>.mlp.{gate,up,down}_proj.weight (+ .bias with mlp_bias)
//   model.layers.<i>.input_layernorm.weight, model.layers.<i>.post_attention_layernorm.weight
//   model.norm.weight                              lm_head.weight (tied with tie_word_embeddings)
//
// RMSNorm, rotary position embeddings (transformers' rotate_half convention, rope_theta),
// grouped-query attention (num_key_value_heads) and the SwiGLU MLP. Note [llama precision] in
// llama.cc: where transformers computes in float32 whatever the model's dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "nn/container.h"
#include "nn/linear.h"
#include "hf/causal_lm.h"
#include "hf/config.h"
#include "parallel/tensor_parallel.h"

namespace accel::hf {

// transformers' LlamaRMSNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)), computed in float32
// for 16-bit inputs (and in the input's dtype for float32 / float64), the product with weight
// in the input's dtype. weight (hidden) = 1.
class LlamaRMSNorm : public nn::Module {
 public:
  explicit LlamaRMSNorm(int64_t hidden_size, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  double eps;
  nn::Parameter weight;
};

// The rotary tables for positions [start, start + T): (cos, sin), each (T, head_dim) with the
// frequencies repeated as cat(freqs, freqs) (transformers' rotate_half layout), inv_freq =
// 1 / theta^(2i / head_dim). Computed in float64 and returned in `dtype` on `device`.
std::pair<Tensor, Tensor> rotary_tables(int64_t start, int64_t T, int64_t head_dim, double theta,
                                        DType dtype, Device device);
// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
// x (B, H, T, D), cos / sin (T, D).
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);
// transformers' repeat_kv: (B, KV, T, D) -> (B, KV * n_rep, T, D), each kv head n_rep times in a
// row (query head h uses kv head h / n_rep).
Tensor repeat_kv(const Tensor& x, int64_t n_rep);

// transformers' LlamaAttention (eager): q / k / v / o projections, rotary embeddings on q and k,
// grouped-query attention, scores scaled by 1 / sqrt(head_dim), causal. The heads it runs are
// read from q_proj's and k_proj's outputs, so tensor parallelism (q / k / v colwise, o
// rowwise) makes it run this rank's query and kv heads.
class LlamaAttention : public nn::TypedModule<LlamaAttention> {
 public:
  LlamaAttention(const LlamaConfig& c, Generator* gen = nullptr);
  // x (B, T, hidden), cos / sin (T, head_dim), cached keys / values (B, KV, S, D) ->
  // (out (B, T, hidden), keys and values (B, KV, S + T, D); Note [kv cache]).
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                             std::optional<Tensor> past_key = std::nullopt,
                                             std::optional<Tensor> past_value = std::nullopt);
  std::string extra_repr() const override;

  int64_t head_dim, num_heads, num_key_value_heads;
  double attention_dropout;
  nn::Child<nn::Linear> q_proj, k_proj, v_proj, o_proj;
};

// transformers' LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(const LlamaConfig& c, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  nn::Child<nn::Linear> gate_proj, up_proj, down_proj;
};

// transformers' LlamaDecoderLayer: x + self_attn(input_layernorm(x)), then
// + mlp(post_attention_layernorm(.)). A ZeRO-3 unit when the model is sharded.
class LlamaDecoderLayer : public nn::TypedModule<LlamaDecoderLayer> {
 public:
  LlamaDecoderLayer(const LlamaConfig& c, Generator* gen = nullptr);
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                             std::optional<Tensor> past_key = std::nullopt,
                                             std::optional<Tensor> past_value = std::nullopt);

  nn::Child<LlamaAttention> self_attn;
  nn::Child<LlamaMLP> mlp;
  nn::Child<LlamaRMSNorm> input_layernorm, post_attention_layernorm;
};

// transformers' LlamaModel: embed_tokens, the layers, the final norm.
class LlamaModel : public nn::Module {
 public:
  LlamaModel(const LlamaConfig& c, Generator* gen = nullptr);
  Tensor forward(const Tensor& input_ids) override { return hidden(input_ids, nullptr); }
  Tensor hidden(const Tensor& input_ids, KVCache* cache);

  LlamaConfig config;
  nn::Child<nn::Embedding> embed_tokens;
  nn::Child<nn::ModuleList> layers;
  nn::Child<LlamaRMSNorm> norm;
};

// transformers' LlamaForCausalLM: LlamaModel and lm_head (hidden -> vocab, no bias), tied to
// embed_tokens with tie_word_embeddings. Initialised as transformers' _init_weights (normal
// initializer_range, biases 0, norms 1) from `gen`.
class LlamaForCausalLM : public CausalLM {
 public:
  explicit LlamaForCausalLM(LlamaConfig c, Generator* gen = nullptr);

  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t num_layers() const override { return config.num_hidden_layers; }
  std::optional<int64_t> max_positions() const override { return std::nullopt; }
  std::string model_type() const override { return "llama"; }
  nlohmann::json config_json() const override { return config.to_json(); }
  std::string base_model_prefix() const override { return "model"; }
  bool ignored_on_load(const std::string& name) const override;

  LlamaConfig config;
  nn::Child<LlamaModel> model;
  nn::Child<nn::Linear> lm_head;

 protected:
  Tensor run(const Tensor& input_ids, KVCache* cache) override;
};

// transformers' base_model_tp_plan for Llama (dist::parallelize, or AcceleratorConfig::tp_plan):
// q / k / v and gate / up colwise, o and down rowwise; embed_tokens, the norms and lm_head
// replicated. num_attention_heads and num_key_value_heads must be divisible by the tp size.
dist::TpPlan llama_tp_plan();

}  // namespace accel::hf
