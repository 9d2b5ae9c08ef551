// config.json of the Hugging Face text models (hf/config.h).
#include "hf/config.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"

namespace accel::hf {

using nlohmann::json;

namespace {

constexpr const char* kOp = "hf.config";

// Readers of one key: absent (or null where the field is optional) keeps the default; a value of
// another type is a ValueError naming the file and the key.
void read(const json& j, const std::string& where, const char* key, int64_t& out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  ACCEL_CHECK(v.is_number_integer(), ValueError, kOp, where, ": \"", key,
              "\" must be an integer, got ", v.dump());
  out = v.get<int64_t>();
}
void read(const json& j, const std::string& where, const char* key, std::optional<int64_t>& out) {
  if (!j.contains(key) || j[key].is_null()) return;
  int64_t v = 0;
  read(j, where, key, v);
  out = v;
}
void read(const json& j, const std::string& where, const char* key, double& out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  ACCEL_CHECK(v.is_number(), ValueError, kOp, where, ": \"", key, "\" must be a number, got ",
              v.dump());
  out = v.get<double>();
}
void read(const json& j, const std::string& where, const char* key, bool& out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  ACCEL_CHECK(v.is_boolean(), ValueError, kOp, where, ": \"", key, "\" must be true or false, got ",
              v.dump());
  out = v.get<bool>();
}
void read(const json& j, const std::string& where, const char* key, std::string& out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  ACCEL_CHECK(v.is_string(), ValueError, kOp, where, ": \"", key, "\" must be a string, got ",
              v.dump());
  out = v.get<std::string>();
}

SpecialTokens read_tokens(const json& j, const std::string& where) {
  SpecialTokens t;
  read(j, where, "bos_token_id", t.bos_token_id);
  read(j, where, "pad_token_id", t.pad_token_id);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& v = j["eos_token_id"];
    if (v.is_array()) {
      for (const json& e : v) {
        ACCEL_CHECK(e.is_number_integer(), ValueError, kOp, where,
                    ": \"eos_token_id\" must be an integer or a list of integers, got ", v.dump());
        t.eos_token_id.push_back(e.get<int64_t>());
      }
    } else {
      int64_t e = 0;
      read(j, where, "eos_token_id", e);
      t.eos_token_id.push_back(e);
    }
  }
  return t;
}

void write_tokens(json& j, const SpecialTokens& t) {
  j["bos_token_id"] = t.bos_token_id ? json(*t.bos_token_id) : json(nullptr);
  j["pad_token_id"] = t.pad_token_id ? json(*t.pad_token_id) : json(nullptr);
  if (t.eos_token_id.size() == 1)
    j["eos_token_id"] = t.eos_token_id[0];
  else if (t.eos_token_id.empty())
    j["eos_token_id"] = nullptr;
  else
    j["eos_token_id"] = t.eos_token_id;
}

// A key whose only value accel computes is `expected` (absent is fine).
template <typename T>
void require_value(const json& j, const std::string& where, const char* key, const T& expected,
                   const char* why) {
  if (!j.contains(key) || j[key].is_null()) return;
  ACCEL_CHECK(j[key] == json(expected), ValueError, kOp, where, ": \"", key, "\" = ", j[key].dump(),
              " is not supported (", why, ")");
}

void check_positive(const std::string& where, const char* key, int64_t v) {
  ACCEL_CHECK(v > 0, ValueError, kOp, where, ": \"", key, "\" must be positive, got ", v);
}

void check_object(const json& j, const std::string& where) {
  ACCEL_CHECK(j.is_object(), ValueError, kOp, where, ": a config must be a JSON object, got ",
              j.type_name());
}

}  // namespace

json read_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file =
      fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  // A config is a few KB; the cap keeps a hostile path (a huge file) from being read whole.
  return parse_config(file_io::read_file(file, kOp, uint64_t(16) << 20), "'" + file + "'");
}

json parse_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ACCEL_THROW(IoError, kOp, where, " is not JSON: ", e.what());
  }
  ACCEL_CHECK(j.is_object(), IoError, kOp, where, " holds a JSON ", j.type_name(),
              ", not an object");
  return j;
}

std::string model_type_of(const json& config, const std::string& where) {
  check_object(config, where);
  ACCEL_CHECK(config.contains("model_type") && config["model_type"].is_string(), ValueError, kOp,
              where,
              ": no \"model_type\" string (transformers' config.json names one; supported: "
              "gpt2, llama)");
  const std::string t = config["model_type"].get<std::string>();
  ACCEL_CHECK(t == "gpt2" || t == "llama", ValueError, kOp, where, ": model_type '", t,
              "' is not supported (supported: gpt2, llama)");
  return t;
}

// ---------------- GPT-2 ----------------

void GPT2Config::validate(const std::string& where) const {
  check_positive(where, "vocab_size", vocab_size);
  check_positive(where, "n_positions", n_positions);
  check_positive(where, "n_embd", n_embd);
  check_positive(where, "n_layer", n_layer);
  check_positive(where, "n_head", n_head);
  check_positive(where, "n_inner", inner_dim());
  ACCEL_CHECK(n_embd % n_head == 0, ValueError, kOp, where, ": n_embd ", n_embd,
              " is not divisible by n_head ", n_head);
  ACCEL_CHECK(activation_function == "gelu_new" || activation_function == "gelu_pytorch_tanh" ||
                  activation_function == "gelu" || activation_function == "relu" ||
                  activation_function == "silu" || activation_function == "swish",
              ValueError, kOp, where, ": activation_function '", activation_function,
              "' is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu, silu, swish)");
  for (double p : {resid_pdrop, embd_pdrop, attn_pdrop})
    ACCEL_CHECK(p >= 0 && p < 1, ValueError, kOp, where,
                ": a dropout probability must be in [0, 1), got ", p);
  ACCEL_CHECK(layer_norm_epsilon >= 0, ValueError, kOp, where,
              ": layer_norm_epsilon must be >= 0, got ", layer_norm_epsilon);
}

GPT2Config GPT2Config::from_json(const json& j, const std::string& where) {
  check_object(j, where);
  if (j.contains("model_type"))
    ACCEL_CHECK(j["model_type"] == "gpt2", ValueError, kOp, where, ": model_type ",
                j["model_type"].dump(), " is not gpt2");
  GPT2Config c;
  read(j, where, "vocab_size", c.vocab_size);
  read(j, where, "n_positions", c.n_positions);
  read(j, where, "n_embd", c.n_embd);
  read(j, where, "n_layer", c.n_layer);
  read(j, where, "n_head", c.n_head);
  read(j, where, "n_inner", c.n_inner);
  read(j, where, "activation_function", c.activation_function);
  read(j, where, "resid_pdrop", c.resid_pdrop);
  read(j, where, "embd_pdrop", c.embd_pdrop);
  read(j, where, "attn_pdrop", c.attn_pdrop);
  read(j, where, "layer_norm_epsilon", c.layer_norm_epsilon);
  read(j, where, "initializer_range", c.initializer_range);
  read(j, where, "scale_attn_weights", c.scale_attn_weights);
  read(j, where, "tie_word_embeddings", c.tie_word_embeddings);
  // Settings that change the math and that accel does not implement.
  require_value(j, where, "scale_attn_by_inverse_layer_idx", false, "not implemented");
  require_value(j, where, "add_cross_attention", false, "GPT2LMHeadModel here is decoder-only");
  c.tokens = read_tokens(j, where);
  c.raw = j;
  c.validate(where);
  return c;
}

json GPT2Config::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  j["model_type"] = "gpt2";
  if (!j.contains("architectures")) j["architectures"] = {"GPT2LMHeadModel"};
  j["vocab_size"] = vocab_size;
  j["n_positions"] = n_positions;
  j["n_embd"] = n_embd;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_inner"] = n_inner ? json(*n_inner) : json(nullptr);
  j["activation_function"] = activation_function;
  j["resid_pdrop"] = resid_pdrop;
  j["embd_pdrop"] = embd_pdrop;
  j["attn_pdrop"] = attn_pdrop;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["initializer_range"] = initializer_range;
  j["scale_attn_weights"] = scale_attn_weights;
  j["tie_word_embeddings"] = tie_word_embeddings;
  write_tokens(j, tokens);
  return j;
}

// ---------------- Llama ----------------

void LlamaConfig::validate(const std::string& where) const {
  check_positive(where, "vocab_size", vocab_size);
  check_positive(where, "hidden_size", hidden_size);
  check_positive(where, "intermediate_size", intermediate_size);
  check_positive(where, "num_hidden_layers", num_hidden_layers);
  check_positive(where, "num_attention_heads", num_attention_heads);
  check_positive(where, "num_key_value_heads", kv_heads());
  check_positive(where, "max_position_embeddings", max_position_embeddings);
  ACCEL_CHECK(head_dim || hidden_size % num_attention_heads == 0, ValueError, kOp, where,
              ": hidden_size ", hidden_size, " is not divisible by num_attention_heads ",
              num_attention_heads, " (and no head_dim is given)");
  check_positive(where, "head_dim", head_size());
  ACCEL_CHECK(head_size() % 2 == 0, ValueError, kOp, where,
              ": the rotary embedding needs an even head_dim, got ", head_size());
  ACCEL_CHECK(num_attention_heads % kv_heads() == 0, ValueError, kOp, where,
              ": num_attention_heads ", num_attention_heads,
              " is not divisible by num_key_value_heads ", kv_heads());
  ACCEL_CHECK(hidden_act == "silu", ValueError, kOp, where, ": hidden_act '", hidden_act,
              "' is not supported (silu)");
  ACCEL_CHECK(rope_theta > 0, ValueError, kOp, where, ": rope_theta must be positive, got ",
              rope_theta);
  ACCEL_CHECK(rms_norm_eps >= 0, ValueError, kOp, where, ": rms_norm_eps must be >= 0, got ",
              rms_norm_eps);
  ACCEL_CHECK(attention_dropout >= 0 && attention_dropout < 1, ValueError, kOp, where,
              ": attention_dropout must be in [0, 1), got ", attention_dropout);
}

LlamaConfig LlamaConfig::from_json(const json& j, const std::string& where) {
  check_object(j, where);
  if (j.contains("model_type"))
    ACCEL_CHECK(j["model_type"] == "llama", ValueError, kOp, where, ": model_type ",
                j["model_type"].dump(), " is not llama");
  LlamaConfig c;
  read(j, where, "vocab_size", c.vocab_size);
  read(j, where, "hidden_size", c.hidden_size);
  read(j, where, "intermediate_size", c.intermediate_size);
  read(j, where, "num_hidden_layers", c.num_hidden_layers);
  read(j, where, "num_attention_heads", c.num_attention_heads);
  read(j, where, "num_key_value_heads", c.num_key_value_heads);
  read(j, where, "head_dim", c.head_dim);
  read(j, where, "hidden_act", c.hidden_act);
  read(j, where, "max_position_embeddings", c.max_position_embeddings);
  read(j, where, "rms_norm_eps", c.rms_norm_eps);
  read(j, where, "rope_theta", c.rope_theta);
  read(j, where, "attention_bias", c.attention_bias);
  read(j, where, "mlp_bias", c.mlp_bias);
  read(j, where, "attention_dropout", c.attention_dropout);
  read(j, where, "tie_word_embeddings", c.tie_word_embeddings);
  read(j, where, "initializer_range", c.initializer_range);
  ACCEL_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), ValueError, kOp, where,
              ": \"rope_scaling\" = ", j.contains("rope_scaling") ? j["rope_scaling"].dump() : "",
              " is not supported (only plain rotary embeddings, rope_scaling null)");
  c.tokens = read_tokens(j, where);
  c.raw = j;
  c.validate(where);
  return c;
}

json LlamaConfig::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  j["model_type"] = "llama";
  if (!j.contains("architectures")) j["architectures"] = {"LlamaForCausalLM"};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = kv_heads();
  if (head_dim) j["head_dim"] = *head_dim;
  j["hidden_act"] = hidden_act;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = attention_bias;
  j["mlp_bias"] = mlp_bias;
  j["attention_dropout"] = attention_dropout;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  write_tokens(j, tokens);
  return j;
}

}  // namespace accel::hf
