// Hugging Face model configurations (config.json) for the text models of hf/ (docs/hf.md).
//
//   nlohmann::json j = hf::read_config("weights/");           // weights/config.json
//   hf::GPT2Config c = hf::GPT2Config::from_json(j);            // transformers' keys and defaults
//
// Each config reads transformers' key names with transformers' defaults (a key absent from the
// file takes the default transformers' config class gives it), keeps the whole object it was
// read from (`raw`, so that save_pretrained writes back the keys accel does not read), and
// refuses what it cannot compute: a key of the wrong type, a size that does not divide, or a
// setting accel does not implement (GPT-2's scale_attn_by_inverse_layer_idx, Llama's
// rope_scaling, an activation it does not know) is a ValueError naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace accel::hf {

// The JSON object of `path`: a config.json file or a directory holding one. IoError naming the
// file when it cannot be read or is not a JSON object.
nlohmann::json read_config(const std::string& path);
// The same for the text of one (read_config's parser; the fuzz target fuzz_hf_config runs it):
// IoError naming `where` unless it is a JSON object.
nlohmann::json parse_config(const std::string& text, const std::string& where);

// The config's "model_type" ("gpt2", "llama"). ValueError naming `where` when it has none or one
// accel does not build (the message lists the supported types).
std::string model_type_of(const nlohmann::json& config, const std::string& where = "config");

// The tokens a config names (bos/eos/pad). eos_token_id may be one id or a list in config.json.
struct SpecialTokens {
  std::optional<int64_t> bos_token_id{};
  std::vector<int64_t> eos_token_id{};
  std::optional<int64_t> pad_token_id{};
};

// transformers.GPT2Config. n_inner unset is 4 * n_embd. activation_function: gelu_new (the
// tanh GELU; also gelu_pytorch_tanh), gelu (erf), relu, silu / swish.
struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  std::optional<int64_t> n_inner{};
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  bool tie_word_embeddings = true;
  SpecialTokens tokens{};
  nlohmann::json raw = nlohmann::json::object();  // the object it was read from

  int64_t inner_dim() const { return n_inner.value_or(4 * n_embd); }
  int64_t head_dim() const { return n_embd / n_head; }
  // Checks every field (ValueError naming `where` and the key).
  void validate(const std::string& where = "GPT2Config") const;
  static GPT2Config from_json(const nlohmann::json& j, const std::string& where = "config");
  // `raw` with every field above written over it (model_type "gpt2").
  nlohmann::json to_json() const;
};

// transformers.LlamaConfig. num_key_value_heads unset is num_attention_heads (no grouping);
// head_dim unset is hidden_size / num_attention_heads. hidden_act: silu only (every Llama).
// rope_scaling must be null (the llama3 / linear / dynamic variants are not implemented).
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  std::optional<int64_t> num_key_value_heads{};
  std::optional<int64_t> head_dim{};
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool attention_bias = false;
  bool mlp_bias = false;
  double attention_dropout = 0.0;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  SpecialTokens tokens{};
  nlohmann::json raw = nlohmann::json::object();

  int64_t kv_heads() const { return num_key_value_heads.value_or(num_attention_heads); }
  int64_t head_size() const { return head_dim.value_or(hidden_size / num_attention_heads); }
  void validate(const std::string& where = "LlamaConfig") const;
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& where = "config");
  nlohmann::json to_json() const;
};

}  // namespace accel::hf
