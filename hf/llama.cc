// The Llama-style decoder with transformers' names and math (hf/llama.h).
//
// Note [llama precision]
// transformers computes three things of a Llama in float32 whatever the model's dtype: the
// RMSNorm (x.to(float32)), the attention softmax (softmax(..., dtype=float32)) and the rotary
// table (inv_freq and the cos / sin of position * inv_freq in float32). For bf16 / fp16 models
// accel does the same for the RMSNorm (and its softmax keeps float32 statistics); for float32
// models the results agree to float32 rounding. For float64 models transformers would round
// these to float32; accel computes them in float64 (the rotary table always in float64, rounded
// once to the model's dtype), which is what the float64 reference of tests/hf/make_hf_fixture.py
// does and what lets the logits agree to 1e-10.
#include "hf/llama.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "nn/init.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace accel::hf {

namespace {

// nn::Linear initialised as transformers' _init_weights: N(0, std) weight, zero bias.
std::shared_ptr<nn::Linear> make_linear(int64_t in, int64_t out, bool bias, double std,
                                        Generator* gen) {
  auto l = std::make_shared<nn::Linear>(in, out, bias, gen);
  nn::init::normal_(l->weight, 0.0, std, gen);
  if (bias) nn::init::zeros_(l->bias);
  return l;
}

}  // namespace

// ---------------- RMSNorm, rotary embeddings ----------------

LlamaRMSNorm::LlamaRMSNorm(int64_t hidden_size, double eps_) : eps(eps_) {
  ACCEL_CHECK(hidden_size > 0, ValueError, "LlamaRMSNorm", "hidden_size must be positive, got ",
              hidden_size);
  weight = register_parameter("weight", empty({hidden_size}));
  reset_parameters();
}

void LlamaRMSNorm::reset_parameters(Generator*) { nn::init::ones_(weight); }

Tensor LlamaRMSNorm::forward(const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(0), ShapeError,
              "LlamaRMSNorm", "expected input (..., ", weight.size(0), "), got ",
              x.defined() ? x.shape_str() : std::string("an undefined tensor"));
  const DType in = x.dtype();
  const bool half = in == kFloat16 || in == kBFloat16;
  const Tensor h = half ? x.to(kFloat32) : x;  // Note [llama precision]
  const Tensor variance = mean(h * h, {-1}, true);
  const Tensor normed = h * rsqrt(variance + eps);
  return weight * (half ? normed.to(in) : normed);
}

std::string LlamaRMSNorm::extra_repr() const {
  std::ostringstream os;  // (a chain of string + string: GCC 12's false -Wrestrict)
  os << "(" << weight.size(0) << "), eps=" << eps;
  return os.str();
}

std::pair<Tensor, Tensor> rotary_tables(int64_t start, int64_t T, int64_t head_dim, double theta,
                                        DType dtype, Device device) {
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(size_t(half), 0.0);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
  std::vector<double> c(size_t(T * head_dim)), s(size_t(T * head_dim));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < head_dim; ++i) {  // emb = cat(freqs, freqs)
      const double angle = double(start + t) * inv_freq[size_t(i % half)];
      c[size_t(t * head_dim + i)] = std::cos(angle);
      s[size_t(t * head_dim + i)] = std::sin(angle);
    }
  const TensorOptions f64(kFloat64);
  return {tensor(c, {T, head_dim}, f64).to(device).to(dtype),
          tensor(s, {T, head_dim}, f64).to(device).to(dtype)};
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t D = x.size(-1);
  const Tensor rotated = cat({-x.narrow(-1, D / 2, D / 2), x.narrow(-1, 0, D / 2)}, -1);
  return x * cos + rotated * sin;
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, n_rep, T, D}).reshape({B, KV * n_rep, T, D});
}

// ---------------- attention, MLP, decoder layer ----------------

LlamaAttention::LlamaAttention(const LlamaConfig& c, Generator* gen)
    : head_dim(c.head_size()),
      num_heads(c.num_attention_heads),
      num_key_value_heads(c.kv_heads()),
      attention_dropout(c.attention_dropout) {
  const double std = c.initializer_range;
  const int64_t E = c.hidden_size, D = head_dim;
  q_proj = register_module("q_proj", make_linear(E, num_heads * D, c.attention_bias, std, gen));
  k_proj = register_module("k_proj",
                           make_linear(E, num_key_value_heads * D, c.attention_bias, std, gen));
  v_proj = register_module("v_proj",
                           make_linear(E, num_key_value_heads * D, c.attention_bias, std, gen));
  o_proj = register_module("o_proj", make_linear(num_heads * D, E, c.attention_bias, std, gen));
}

std::tuple<Tensor, Tensor, Tensor> LlamaAttention::forward(const Tensor& x, const Tensor& cos,
                                                           const Tensor& sin,
                                                           std::optional<Tensor> past_key,
                                                           std::optional<Tensor> past_value) {
  ACCEL_CHECK(x.defined() && x.dim() == 3, ShapeError, "LlamaAttention",
              "expected hidden states (batch, sequence, hidden), got ",
              x.defined() ? x.shape_str() : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1), D = head_dim;
  const Tensor q0 = (*q_proj)(x), k0 = (*k_proj)(x), v0 = (*v_proj)(x);
  // This rank's heads under tensor parallelism (all of them otherwise).
  const int64_t H = q0.size(-1) / D, KV = k0.size(-1) / D;
  ACCEL_CHECK(H * D == q0.size(-1) && KV * D == k0.size(-1) && KV > 0 && H % KV == 0, ShapeError,
              "LlamaAttention", "q_proj / k_proj give ", q0.size(-1), " / ", k0.size(-1),
              " features: not whole heads of ", D,
              " with query heads a multiple of kv heads (under tensor parallelism "
              "num_attention_heads and num_key_value_heads must be divisible by the tp size)");
  ACCEL_CHECK(cos.dim() == 2 && cos.size(0) == T && cos.size(1) == D, ShapeError, "LlamaAttention",
              "rotary tables ", cos.shape_str(), " do not fit (", T, ", ", D, ")");
  auto heads = [&](const Tensor& t, int64_t n) {  // (B, T, n * D) -> (B, n, T, D)
    return t.reshape({B, T, n, D}).permute({0, 2, 1, 3});
  };
  const Tensor q = apply_rotary(heads(q0, H), cos, sin);
  const Tensor k = detail::append_past(past_key, apply_rotary(heads(k0, KV), cos, sin));
  const Tensor v = detail::append_past(past_value, heads(v0, KV));
  const Tensor a = detail::causal_attention(q, repeat_kv(k, H / KV), repeat_kv(v, H / KV),
                                            is_training() ? attention_dropout : 0.0);
  return {(*o_proj)(a.permute({0, 2, 1, 3}).reshape({B, T, H * D})), k, v};
}

std::string LlamaAttention::extra_repr() const {
  return "num_heads=" + std::to_string(num_heads) +
         ", num_key_value_heads=" + std::to_string(num_key_value_heads) +
         ", head_dim=" + std::to_string(head_dim);
}

LlamaMLP::LlamaMLP(const LlamaConfig& c, Generator* gen) {
  const double std = c.initializer_range;
  const int64_t E = c.hidden_size, I = c.intermediate_size;
  gate_proj = register_module("gate_proj", make_linear(E, I, c.mlp_bias, std, gen));
  up_proj = register_module("up_proj", make_linear(E, I, c.mlp_bias, std, gen));
  down_proj = register_module("down_proj", make_linear(I, E, c.mlp_bias, std, gen));
}

Tensor LlamaMLP::forward(const Tensor& x) {
  return (*down_proj)(silu((*gate_proj)(x)) * (*up_proj)(x));
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, Generator* gen)
    : self_attn(register_module("self_attn", std::make_shared<LlamaAttention>(c, gen))),
      mlp(register_module("mlp", std::make_shared<LlamaMLP>(c, gen))),
      input_layernorm(register_module(
          "input_layernorm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps))),
      post_attention_layernorm(
          register_module("post_attention_layernorm",
                          std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps))) {}

std::tuple<Tensor, Tensor, Tensor> LlamaDecoderLayer::forward(const Tensor& x, const Tensor& cos,
                                                              const Tensor& sin,
                                                              std::optional<Tensor> past_key,
                                                              std::optional<Tensor> past_value) {
  auto [a, k, v] = (*self_attn)((*input_layernorm)(x), cos, sin, past_key, past_value);
  const Tensor h = x + a;
  return {h + (*mlp)((*post_attention_layernorm)(h)), k, v};
}

// ---------------- LlamaModel, LlamaForCausalLM ----------------

LlamaModel::LlamaModel(const LlamaConfig& c, Generator* gen) : config(c) {
  nn::EmbeddingFields e{.num_embeddings = c.vocab_size, .embedding_dim = c.hidden_size};
  // transformers builds embed_tokens with padding_idx = pad_token_id (its row starts at zero and
  // gets no gradient).
  e.padding_idx = c.tokens.pad_token_id;
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(e, gen));
  nn::init::normal_(embed_tokens->weight, 0.0, c.initializer_range, gen);
  if (e.padding_idx) {
    NoGradGuard ng;
    if (!nn::is_deferred(embed_tokens->weight))
      embed_tokens->weight.select(0, *embed_tokens->padding_idx).zero_();
  }
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<LlamaDecoderLayer>(c, gen));
  norm = register_module("norm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaModel::hidden(const Tensor& input_ids, KVCache* cache) {
  const int64_t past = cache ? cache->length() : 0, T = input_ids.size(1);
  Tensor x = (*embed_tokens)(input_ids);
  const auto [cos, sin] =
      rotary_tables(past, T, config.head_size(), config.rope_theta, x.dtype(), x.device());
  std::vector<Tensor> keys(layers->size()), values(layers->size());
  for (size_t i = 0; i < layers->size(); ++i) {
    std::optional<Tensor> pk, pv;
    if (past > 0) {
      pk = cache->keys.at(i);
      pv = cache->values.at(i);
    }
    auto [y, k, v] = (*layers->at<LlamaDecoderLayer>(i))(x, cos, sin, pk, pv);
    x = y;
    keys[i] = k;
    values[i] = v;
  }
  if (cache) {
    cache->keys = std::move(keys);
    cache->values = std::move(values);
  }
  return (*norm)(x);
}

LlamaForCausalLM::LlamaForCausalLM(LlamaConfig c, Generator* gen) : config(std::move(c)) {
  config.validate("LlamaForCausalLM");
  model = register_module("model", std::make_shared<LlamaModel>(config, gen));
  lm_head = register_module(
      "lm_head", std::make_shared<nn::Linear>(config.hidden_size, config.vocab_size, false, gen));
  if (config.tie_word_embeddings) {
    lm_head->weight = model->embed_tokens->weight;  // Note [tied parameters]
  } else {
    nn::init::normal_(lm_head->weight, 0.0, config.initializer_range, gen);
  }
}

bool LlamaForCausalLM::ignored_on_load(const std::string& name) const {
  const std::string s = ".rotary_emb.inv_freq";
  return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

Tensor LlamaForCausalLM::run(const Tensor& input_ids, KVCache* cache) {
  check_call(input_ids, cache, "LlamaForCausalLM");
  return (*lm_head)(model->hidden(input_ids, cache));
}

dist::TpPlan llama_tp_plan() {
  return {
      // The attention reads its heads from the shards: equal pieces only (whole heads when the
      // head counts divide by tp; a size tp divides may still cut a head: the forward says so).
      {"model.layers.*.self_attn.q_proj", dist::colwise({.require_even = true})},
      {"model.layers.*.self_attn.k_proj", dist::colwise({.require_even = true})},
      {"model.layers.*.self_attn.v_proj", dist::colwise({.require_even = true})},
      {"model.layers.*.self_attn.o_proj", dist::rowwise({.require_even = true})},
      {"model.layers.*.mlp.gate_proj", dist::colwise()},
      {"model.layers.*.mlp.up_proj", dist::colwise()},
      {"model.layers.*.mlp.down_proj", dist::rowwise()},
  };
}

}  // namespace accel::hf
