// GPT-2 with transformers' names and math (hf/gpt2.h).
#include "hf/gpt2.h"

#include <cmath>

#include "nn/init.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace accel::hf {

// ---------------- Conv1D ----------------

Conv1D::Conv1D(int64_t nf, int64_t nx, double std, Generator* gen) : init_std(std) {
  ACCEL_CHECK(nf > 0 && nx > 0, ValueError, "Conv1D", "nf and nx must be positive, got ", nf,
              " and ", nx);
  weight = register_parameter("weight", empty({nx, nf}));
  bias = register_parameter("bias", empty({nf}));
  reset_parameters(gen);
}

void Conv1D::reset_parameters(Generator* gen) {
  nn::init::normal_(weight, 0.0, init_std, gen);
  nn::init::zeros_(bias);
}

Tensor Conv1D::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: tensor parallelism wraps this layer
  ACCEL_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(0), ShapeError, "Conv1D",
              "expected input (..., ", weight.size(0), "), got ",
              x.defined() ? x.shape_str() : std::string("an undefined tensor"));
  // transformers: addmm(bias, x.view(-1, nx), weight).view(..., nf).
  return matmul(x, weight) + bias;
}

std::string Conv1D::extra_repr() const {
  return "nf=" + std::to_string(weight.size(1)) + ", nx=" + std::to_string(weight.size(0));
}

Tensor gpt2_activation(const Tensor& x, const std::string& name) {
  // transformers' ACT2FN: gelu_new and gelu_pytorch_tanh are both the tanh approximation.
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return gelu(x, "tanh");
  if (name == "gelu") return gelu(x);
  if (name == "relu") return relu(x);
  if (name == "silu" || name == "swish") return silu(x);
  ACCEL_THROW(ValueError, "GPT2MLP", "activation_function '", name, "' is not supported");
}

// ---------------- attention, MLP, block ----------------

GPT2Attention::GPT2Attention(const GPT2Config& c, Generator* gen)
    : head_dim(c.head_dim()),
      attn_pdrop(c.attn_pdrop),
      scale_attn_weights(c.scale_attn_weights),
      c_attn(register_module(
          "c_attn", std::make_shared<Conv1D>(3 * c.n_embd, c.n_embd, c.initializer_range, gen))),
      c_proj(register_module("c_proj", std::make_shared<Conv1D>(
                                           c.n_embd, c.n_embd,
                                           c.initializer_range / std::sqrt(2.0 * c.n_layer), gen))),
      attn_dropout(register_module("attn_dropout", std::make_shared<nn::Dropout>(c.attn_pdrop))),
      resid_dropout(
          register_module("resid_dropout", std::make_shared<nn::Dropout>(c.resid_pdrop))) {}

std::tuple<Tensor, Tensor, Tensor> GPT2Attention::forward(const Tensor& x,
                                                          std::optional<Tensor> past_key,
                                                          std::optional<Tensor> past_value) {
  ACCEL_CHECK(x.defined() && x.dim() == 3, ShapeError, "GPT2Attention",
              "expected hidden states (batch, sequence, n_embd), got ",
              x.defined() ? x.shape_str() : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor qkv = (*c_attn)(x);  // (B, T, 3 * H * D), H this rank's heads under tp
  const int64_t width = qkv.size(-1) / 3;
  ACCEL_CHECK(width % head_dim == 0, ShapeError, "GPT2Attention", "c_attn gives ", qkv.size(-1),
              " features, not 3 x a whole number of heads of ", head_dim,
              " (under tensor parallelism n_head must be divisible by the tp size)");
  const int64_t H = width / head_dim;
  auto heads = [&](const Tensor& t) {  // (B, T, H * D) -> (B, H, T, D)
    return t.reshape({B, T, H, head_dim}).permute({0, 2, 1, 3});
  };
  const std::vector<Tensor> parts = split(qkv, width, -1);
  const Tensor q = heads(parts[0]);
  const Tensor k = detail::append_past(past_key, heads(parts[1]));
  const Tensor v = detail::append_past(past_value, heads(parts[2]));
  // scale_attn_weights = false: scores are not divided by sqrt(head_dim).
  const std::optional<double> scale =
      scale_attn_weights ? std::nullopt : std::optional<double>(1.0);
  const Tensor a = detail::causal_attention(q, k, v, is_training() ? attn_pdrop : 0.0, scale);
  const Tensor merged = a.permute({0, 2, 1, 3}).reshape({B, T, H * head_dim});
  return {(*resid_dropout)((*c_proj)(merged)), k, v};
}

std::string GPT2Attention::extra_repr() const { return "head_dim=" + std::to_string(head_dim); }

GPT2MLP::GPT2MLP(const GPT2Config& c, Generator* gen)
    : activation(c.activation_function),
      c_fc(register_module(
          "c_fc", std::make_shared<Conv1D>(c.inner_dim(), c.n_embd, c.initializer_range, gen))),
      c_proj(register_module("c_proj", std::make_shared<Conv1D>(
                                           c.n_embd, c.inner_dim(),
                                           c.initializer_range / std::sqrt(2.0 * c.n_layer), gen))),
      dropout(register_module("dropout", std::make_shared<nn::Dropout>(c.resid_pdrop))) {}

Tensor GPT2MLP::forward(const Tensor& x) {
  return (*dropout)((*c_proj)(gpt2_activation((*c_fc)(x), activation)));
}

GPT2Block::GPT2Block(const GPT2Config& c, Generator* gen)
    : ln_1(
          register_module("ln_1", std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_epsilon))),
      attn(register_module("attn", std::make_shared<GPT2Attention>(c, gen))),
      ln_2(
          register_module("ln_2", std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_epsilon))),
      mlp(register_module("mlp", std::make_shared<GPT2MLP>(c, gen))) {}

std::tuple<Tensor, Tensor, Tensor> GPT2Block::forward(const Tensor& x,
                                                      std::optional<Tensor> past_key,
                                                      std::optional<Tensor> past_value) {
  auto [a, k, v] = (*attn)((*ln_1)(x), past_key, past_value);
  const Tensor h = x + a;
  return {h + (*mlp)((*ln_2)(h)), k, v};
}

// ---------------- GPT2Model, GPT2LMHeadModel ----------------

GPT2Model::GPT2Model(const GPT2Config& c, Generator* gen)
    : config(c),
      wte(register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd, gen))),
      wpe(register_module("wpe", std::make_shared<nn::Embedding>(c.n_positions, c.n_embd, gen))),
      drop(register_module("drop", std::make_shared<nn::Dropout>(c.embd_pdrop))),
      h(register_module("h", std::make_shared<nn::ModuleList>())),
      ln_f(register_module("ln_f",
                           std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_epsilon))) {
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<GPT2Block>(c, gen));
  // transformers' _init_weights: embeddings N(0, initializer_range), not nn.Embedding's N(0, 1).
  nn::init::normal_(wte->weight, 0.0, c.initializer_range, gen);
  nn::init::normal_(wpe->weight, 0.0, c.initializer_range, gen);
}

Tensor GPT2Model::hidden(const Tensor& input_ids, KVCache* cache) {
  const int64_t past = cache ? cache->length() : 0, T = input_ids.size(1);
  const Tensor positions = arange(past, past + T, 1, TensorOptions(kInt64)).to(input_ids.device());
  // (B, T, E) + (T, E): the position embedding broadcasts over the batch.
  Tensor x = (*drop)((*wte)(input_ids) + (*wpe)(positions));
  std::vector<Tensor> keys(h->size()), values(h->size());
  for (size_t i = 0; i < h->size(); ++i) {
    std::optional<Tensor> pk, pv;
    if (past > 0) {
      pk = cache->keys.at(i);
      pv = cache->values.at(i);
    }
    // Through the block's call (a ZeRO-3 unit's wrapper gathers it).
    auto [y, k, v] = (*h->at<GPT2Block>(i))(x, pk, pv);
    x = y;
    keys[i] = k;
    values[i] = v;
  }
  if (cache) {  // only once every layer succeeded: a failed call leaves the cache as it was
    cache->keys = std::move(keys);
    cache->values = std::move(values);
  }
  return (*ln_f)(x);
}

GPT2LMHeadModel::GPT2LMHeadModel(GPT2Config c, Generator* gen) : config(std::move(c)) {
  config.validate("GPT2LMHeadModel");
  transformer = register_module("transformer", std::make_shared<GPT2Model>(config, gen));
  lm_head = register_module(
      "lm_head", std::make_shared<nn::Linear>(config.n_embd, config.vocab_size, false, gen));
  if (config.tie_word_embeddings) {
    lm_head->weight = transformer->wte->weight;  // Note [tied parameters]
  } else {
    nn::init::normal_(lm_head->weight, 0.0, config.initializer_range, gen);
  }
}

bool GPT2LMHeadModel::ignored_on_load(const std::string& name) const {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

Tensor GPT2LMHeadModel::run(const Tensor& input_ids, KVCache* cache) {
  check_call(input_ids, cache, "GPT2LMHeadModel");
  return (*lm_head)(transformer->hidden(input_ids, cache));
}

dist::TpPlan gpt2_tp_plan() {
  return {
      // The attention reads its heads from the shard: equal pieces of whole heads only.
      {"transformer.h.*.attn.c_attn", dist::colwise({.chunks = 3, .require_even = true})},
      {"transformer.h.*.attn.c_proj", dist::rowwise({.require_even = true})},
      {"transformer.h.*.mlp.c_fc", dist::colwise()},
      {"transformer.h.*.mlp.c_proj", dist::rowwise()},
  };
}

}  // namespace accel::hf
