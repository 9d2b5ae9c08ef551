// What the Hugging Face decoders of hf/ share: the causal-LM interface generate() drives, the
// key/value cache of incremental decoding, and the causal attention over a cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/module.h"
#include "core/tensor.h"

namespace accel::hf {

// Note [kv cache]
// transformers' past_key_values: per layer the keys and values of every position seen so far,
// (B, kv_heads, S, head_dim), in the layout the attention uses before grouped-query heads are
// repeated (so a Llama with 8 kv heads caches 8, not its 32 query heads), with the rotary
// embedding already applied to the keys. A forward with a cache takes only the new tokens
// (B, T): their positions continue at length(), their queries attend to the S + T keys (the last
// T of them causally), and the layer's keys and values grow by T (torch.cat, as DynamicCache).
// Under tensor parallelism each rank caches its own heads; under ZeRO-3 nothing changes. The
// cache holds tensors computed without gradient when generate() runs (NoGradGuard); a forward
// with a cache under grad mode keeps the graph through the cached tensors, as in PyTorch.
struct KVCache {
  std::vector<Tensor> keys, values;  // per layer; empty before the first forward
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  void clear() {
    keys.clear();
    values.clear();
  }
};

// A decoder-only language model with transformers' names, built from a config.json (hf/gpt2.h,
// hf/llama.h; hf::from_config / from_pretrained in hf/pretrained.h).
class CausalLM : public nn::Module {
 public:
  // input_ids (B, T) int64 -> logits (B, T, vocab_size): transformers' model(input_ids).logits.
  Tensor forward(const Tensor& input_ids) override { return run(input_ids, nullptr); }
  // The same for new tokens after those `cache` holds (Note [kv cache]); appends to `cache`.
  Tensor forward(const Tensor& input_ids, KVCache& cache) { return run(input_ids, &cache); }

  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_layers() const = 0;
  // The longest sequence the model can take (GPT-2's n_positions); none for rotary models.
  virtual std::optional<int64_t> max_positions() const = 0;
  // "gpt2", "llama": config.json's model_type.
  virtual std::string model_type() const = 0;
  // The config as config.json holds it (what save_pretrained writes).
  virtual nlohmann::json config_json() const = 0;
  // transformers' base_model_prefix ("transformer", "model"): checkpoints of the base model
  // alone (GPT-2's original files) name the tensors without it (hf::load_weights).
  virtual std::string base_model_prefix() const = 0;
  // Names a checkpoint may hold that the model does not (transformers'
  // _keys_to_ignore_on_load_unexpected: GPT-2's causal-mask buffers attn.bias, attn.masked_bias;
  // older Llama files' rotary_emb.inv_freq).
  virtual bool ignored_on_load(const std::string& name) const = 0;

 protected:
  virtual Tensor run(const Tensor& input_ids, KVCache* cache) = 0;
  // ShapeError unless ids is (B, T) int64 (int32 taken too) with T >= 1, the positions
  // [past, past + T) fit max_positions(), and `cache` (when given and not empty) holds
  // num_layers() layers of `past` positions for this batch. `op` names the model.
  void check_call(const Tensor& ids, const KVCache* cache, const char* op) const;
};

namespace detail {

// softmax(q k^T * scale + causal mask) v for queries that are the last T of S positions:
// q (B, H, T, D), k and v (B, H, S, D) with S >= T -> (B, H, T, D). Query i sees keys
// j <= S - T + i (bottom-right aligned; for S == T the usual causal mask, for T == 1 every key).
// dropout_p > 0 drops attention weights (training).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                        std::optional<double> scale = std::nullopt);

// k, v (B, H_kv, T, D) with `past` (B, H_kv, S, D) or undefined -> (B, H_kv, S + T, D).
Tensor append_past(const std::optional<Tensor>& past, const Tensor& now);

}  // namespace detail

}  // namespace accel::hf
