// The models accelerate/memory_estimate.h estimates: built-in transformer shapes, safetensors
// headers and live modules.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "accelerate/memory_estimate.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "nn/module.h"

namespace accel::estimate {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The layer index in "...h.3.", "...layers.3.", "...blocks.3." (-1: none).
int64_t layer_of(std::string_view name) {
  for (std::string_view key : {"h.", "layers.", "blocks."}) {
    size_t at = 0;
    while ((at = name.find(key, at)) != std::string_view::npos) {
      const bool starts = at == 0 || name[at - 1] == '.';
      size_t p = at + key.size(), q = p;
      while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
      if (starts && q > p && q < name.size() && name[q] == '.' && q - p < 10)
        return std::stoll(std::string(name.substr(p, q - p)));
      at += key.size();
    }
  }
  return -1;
}

// The dimension tensor parallelism splits (Note [memory estimate]): Megatron-LM's plan as
// examples/models.h gpt_tp_plan and the hf plans apply it, by the tensor's name (GPT-2's Conv1D
// weights are stored (in, out), Linear's (out, in)); for other names 2-D and larger tensors
// count as split along their first dimension, 1-D ones as replicated.
int tp_dim_of(std::string_view name, size_t rank) {
  struct Rule {
    std::string_view suffix;
    int dim;
  };
  static constexpr Rule kRules[] = {
      // GPT-2 (Conv1D, (in, out)): c_attn / c_fc colwise, c_proj rowwise.
      {"c_attn.weight", 1},
      {"c_fc.weight", 1},
      {"c_attn.bias", 0},
      {"c_fc.bias", 0},
      {"c_proj.weight", 0},
      {"c_proj.bias", -1},
      {"wte.weight", 0},
      {"wpe.weight", -1},
      // examples/models.h Gpt (Linear, (out, in)).
      {"qkv.weight", 0},
      {"qkv.bias", 0},
      {"fc_out.weight", 1},
      {"fc_out.bias", -1},
      {"fc.weight", 0},
      {"fc.bias", 0},
      {"proj.weight", 1},
      {"proj.bias", -1},
      {"tok.weight", 0},
      {"pos.weight", -1},
      // Llama.
      {"q_proj.weight", 0},
      {"k_proj.weight", 0},
      {"v_proj.weight", 0},
      {"q_proj.bias", 0},
      {"k_proj.bias", 0},
      {"v_proj.bias", 0},
      {"gate_proj.weight", 0},
      {"up_proj.weight", 0},
      {"o_proj.weight", 1},
      {"down_proj.weight", 1},
      {"o_proj.bias", -1},
      {"down_proj.bias", -1},
      {"embed_tokens.weight", 0},
      // Heads (colwise over the vocabulary).
      {"lm_head.weight", 0},
      {"head.weight", 0},
  };
  for (const Rule& r : kRules)
    if (ends_with(name, r.suffix) &&
        (name.size() == r.suffix.size() || name[name.size() - r.suffix.size() - 1] == '.'))
      return r.dim;
  return rank >= 2 ? 0 : -1;
}

TensorSpec tensor(std::string name, std::vector<int64_t> shape, bool trainable = true) {
  TensorSpec t;
  t.tp_dim = tp_dim_of(name, shape.size());
  t.layer = layer_of(name);
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.trainable = trainable;
  return t;
}

// "layers=2,hidden=64" -> {layers: 2, hidden: 64}; ValueError naming `spec` otherwise.
std::map<std::string, int64_t> read_fields(std::string_view spec, std::string_view fields,
                                           const std::set<std::string>& known) {
  std::map<std::string, int64_t> out;
  std::string_view rest = fields;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::string key(item.substr(0, eq));
    ACCEL_CHECK(
        eq != std::string_view::npos && known.count(key), ValueError, "estimate_memory", "'", spec,
        "': expected name=value fields among ",
        [&] {
          std::string k;
          for (const std::string& n : known) k += (k.empty() ? "" : ", ") + n;
          return k;
        }(),
        ", got '", item, "'");
    const std::string value(item.substr(eq + 1));
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    ACCEL_CHECK(!value.empty() && *end == '\0' && v >= 0 && v <= (int64_t(1) << 40), ValueError,
                "estimate_memory", "'", spec, "': ", key, " must be a count, got '", value, "'");
    out[key] = v;
  }
  return out;
}

struct Builtin {
  std::string_view name;
  Transformer::Kind kind;
  int64_t layers, hidden, heads, kv_heads, intermediate, vocab, positions;
  bool tied;
};
// GPT-2 (openai-community/gpt2*) and Llama 2 (meta-llama/Llama-2-*-hf) shapes.
constexpr Builtin kBuiltins[] = {
    {"gpt2", Transformer::Kind::Gpt, 12, 768, 12, 12, 3072, 50257, 1024, true},
    {"gpt2-medium", Transformer::Kind::Gpt, 24, 1024, 16, 16, 4096, 50257, 1024, true},
    {"gpt2-large", Transformer::Kind::Gpt, 36, 1280, 20, 20, 5120, 50257, 1024, true},
    {"gpt2-xl", Transformer::Kind::Gpt, 48, 1600, 25, 25, 6400, 50257, 1024, true},
    {"llama-7b", Transformer::Kind::Llama, 32, 4096, 32, 32, 11008, 32000, 4096, false},
    {"llama-13b", Transformer::Kind::Llama, 40, 5120, 40, 40, 13824, 32000, 4096, false},
    {"llama-70b", Transformer::Kind::Llama, 80, 8192, 64, 8, 28672, 32000, 4096, false},
};

}  // namespace

ModelSpec gpt_model(const Transformer& a, bool tied, std::string name) {
  ModelSpec m;
  m.name = std::move(name);
  m.arch = a;
  m.arch->kind = Transformer::Kind::Gpt;
  const int64_t C = a.hidden, I = a.intermediate > 0 ? a.intermediate : 4 * a.hidden;
  m.arch->intermediate = I;
  const std::string t = "transformer.";
  m.tensors.push_back(tensor(t + "wte.weight", {a.vocab, C}));
  m.tensors.push_back(tensor(t + "wpe.weight", {a.positions, C}));
  for (int64_t l = 0; l < a.layers; ++l) {
    const std::string h = t + "h." + std::to_string(l) + ".";
    m.tensors.push_back(tensor(h + "ln_1.weight", {C}));
    m.tensors.push_back(tensor(h + "ln_1.bias", {C}));
    m.tensors.push_back(tensor(h + "attn.c_attn.weight", {C, 3 * C}));
    m.tensors.push_back(tensor(h + "attn.c_attn.bias", {3 * C}));
    m.tensors.push_back(tensor(h + "attn.c_proj.weight", {C, C}));
    m.tensors.push_back(tensor(h + "attn.c_proj.bias", {C}));
    m.tensors.push_back(tensor(h + "ln_2.weight", {C}));
    m.tensors.push_back(tensor(h + "ln_2.bias", {C}));
    m.tensors.push_back(tensor(h + "mlp.c_fc.weight", {C, I}));
    m.tensors.push_back(tensor(h + "mlp.c_fc.bias", {I}));
    m.tensors.push_back(tensor(h + "mlp.c_proj.weight", {I, C}));
    m.tensors.push_back(tensor(h + "mlp.c_proj.bias", {C}));
  }
  m.tensors.push_back(tensor(t + "ln_f.weight", {C}));
  m.tensors.push_back(tensor(t + "ln_f.bias", {C}));
  if (!tied) m.tensors.push_back(tensor("lm_head.weight", {a.vocab, C}));
  return m;
}

ModelSpec llama_model(const Transformer& a, bool tied, std::string name) {
  ModelSpec m;
  m.name = std::move(name);
  m.arch = a;
  m.arch->kind = Transformer::Kind::Llama;
  const int64_t H = a.hidden, I = a.intermediate, heads = std::max<int64_t>(1, a.heads);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : heads, D = H / heads;
  m.arch->kv_heads = kv;
  m.tensors.push_back(tensor("model.embed_tokens.weight", {a.vocab, H}));
  for (int64_t l = 0; l < a.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.tensors.push_back(tensor(p + "self_attn.q_proj.weight", {heads * D, H}));
    m.tensors.push_back(tensor(p + "self_attn.k_proj.weight", {kv * D, H}));
    m.tensors.push_back(tensor(p + "self_attn.v_proj.weight", {kv * D, H}));
    m.tensors.push_back(tensor(p + "self_attn.o_proj.weight", {H, heads * D}));
    m.tensors.push_back(tensor(p + "mlp.gate_proj.weight", {I, H}));
    m.tensors.push_back(tensor(p + "mlp.up_proj.weight", {I, H}));
    m.tensors.push_back(tensor(p + "mlp.down_proj.weight", {H, I}));
    m.tensors.push_back(tensor(p + "input_layernorm.weight", {H}));
    m.tensors.push_back(tensor(p + "post_attention_layernorm.weight", {H}));
  }
  m.tensors.push_back(tensor("model.norm.weight", {H}));
  if (!tied) m.tensors.push_back(tensor("lm_head.weight", {a.vocab, H}));
  return m;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> out;
  for (const Builtin& b : kBuiltins) out.emplace_back(b.name);
  return out;
}

ModelSpec builtin_model(std::string_view name) {
  for (const Builtin& b : kBuiltins) {
    if (b.name != name) continue;
    Transformer t{b.kind,     b.layers,       b.hidden, b.heads,
                  b.kv_heads, b.intermediate, b.vocab,  b.positions};
    return b.kind == Transformer::Kind::Gpt ? gpt_model(t, b.tied, std::string(name))
                                            : llama_model(t, b.tied, std::string(name));
  }
  const size_t colon = name.find(':');
  const std::string_view kind = name.substr(0, colon);
  if (colon != std::string_view::npos && (kind == "gpt" || kind == "llama")) {
    const bool gpt = kind == "gpt";
    std::map<std::string, int64_t> f =
        read_fields(name, name.substr(colon + 1),
                    gpt ? std::set<std::string>{"layers", "hidden", "heads", "vocab", "positions",
                                                "tied", "intermediate"}
                        : std::set<std::string>{"layers", "hidden", "heads", "kv_heads",
                                                "intermediate", "vocab", "positions", "tied"});
    for (const char* need : {"layers", "hidden", "heads", "vocab"})
      ACCEL_CHECK(f.count(need) && f[need] > 0, ValueError, "estimate_memory", "'", name,
                  "': give ", need, "=N (N >= 1)");
    ACCEL_CHECK(gpt || (f.count("intermediate") && f["intermediate"] > 0), ValueError,
                "estimate_memory", "'", name, "': give intermediate=N (N >= 1)");
    ACCEL_CHECK(f["hidden"] % f["heads"] == 0, ValueError, "estimate_memory", "'", name,
                "': hidden ", f["hidden"], " is not a multiple of heads ", f["heads"]);
    Transformer t;
    t.layers = f["layers"];
    t.hidden = f["hidden"];
    t.heads = f["heads"];
    t.kv_heads = f.count("kv_heads") ? f["kv_heads"] : t.heads;
    t.intermediate = f.count("intermediate") ? f["intermediate"] : 0;
    t.vocab = f["vocab"];
    t.positions = f.count("positions") ? f["positions"] : 1024;
    const bool tied = f.count("tied") ? f["tied"] != 0 : gpt;
    return gpt ? gpt_model(t, tied, std::string(name)) : llama_model(t, tied, std::string(name));
  }
  std::string known;
  for (const Builtin& b : kBuiltins) known += (known.empty() ? "" : ", ") + std::string(b.name);
  ACCEL_THROW(ValueError, "estimate_memory", "unknown model '", name,
              "': give a .safetensors file, "
              "a model.safetensors.index.json, a folder holding either, one of ",
              known,
              ", or shapes such as gpt:layers=12,hidden=768,heads=12,vocab=50257 or "
              "llama:layers=32,hidden=4096,heads=32,intermediate=11008,vocab=32000");
}

namespace {

// A GPT-2 or Llama layout by transformers' names (with or without the transformer. / model.
// prefixes), for the activations; the head counts are not in the shapes (GPT-2 heads of 64,
// Llama heads of 128 assumed: they only count the attention's log-sum-exp).
std::optional<Transformer> recognise(const std::vector<TensorSpec>& ts) {
  auto find = [&](std::string_view suffix) -> const TensorSpec* {
    for (const TensorSpec& t : ts)
      if (ends_with(t.name, suffix)) return &t;
    return nullptr;
  };
  int64_t layers = 0;
  for (const TensorSpec& t : ts) layers = std::max(layers, t.layer + 1);
  if (layers == 0) return std::nullopt;
  Transformer a;
  a.layers = layers;
  if (const TensorSpec* wte = find("wte.weight"); wte && wte->shape.size() == 2) {
    const TensorSpec* wpe = find("wpe.weight");
    const TensorSpec* fc = find("mlp.c_fc.weight");
    a.kind = Transformer::Kind::Gpt;
    a.vocab = wte->shape[0];
    a.hidden = wte->shape[1];
    a.heads = a.kv_heads = std::max<int64_t>(1, a.hidden / 64);
    a.intermediate = fc && fc->shape.size() == 2 ? fc->shape[1] : 4 * a.hidden;
    a.positions = wpe && !wpe->shape.empty() ? wpe->shape[0] : 1024;
    return a;
  }
  // examples/models.h Gpt: tok, pos, blocks.N.{ln1, attn.qkv, attn.proj, ln2, fc, fc_out}.
  if (const TensorSpec* tok = find("tok.weight"); tok && tok->shape.size() == 2) {
    const TensorSpec* pos = find("pos.weight");
    const TensorSpec* fc = find("fc.weight");
    a.kind = Transformer::Kind::Gpt;
    a.vocab = tok->shape[0];
    a.hidden = tok->shape[1];
    a.heads = a.kv_heads = std::max<int64_t>(1, a.hidden / 64);
    a.intermediate = fc && fc->shape.size() == 2 ? fc->shape[0] : 4 * a.hidden;
    a.positions = pos && !pos->shape.empty() ? pos->shape[0] : 1024;
    return a;
  }
  const TensorSpec* emb = find("embed_tokens.weight");
  const TensorSpec* gate = find("mlp.gate_proj.weight");
  const TensorSpec* k = find("self_attn.k_proj.weight");
  if (emb && gate && emb->shape.size() == 2 && gate->shape.size() == 2) {
    a.kind = Transformer::Kind::Llama;
    a.vocab = emb->shape[0];
    a.hidden = emb->shape[1];
    a.heads = std::max<int64_t>(1, a.hidden / 128);
    a.kv_heads = k && !k->shape.empty() ? std::max<int64_t>(1, k->shape[0] / 128) : a.heads;
    a.intermediate = gate->shape[0];
    a.positions = 4096;
    return a;
  }
  return std::nullopt;
}

}  // namespace

ModelSpec model_from_safetensors(const std::string& path) {
  const io::SafetensorsCheckpoint ckpt(path);  // headers only
  ModelSpec m;
  m.name = path;
  std::set<std::string> dtypes;
  for (const std::string& name : ckpt.names()) {
    // A tied alias (Note [tied tensors in files]) is stored under the name it reads: count once.
    if (!ckpt.file_of(name).contains(name)) continue;
    const io::SafetensorsFile::Info& info = ckpt.info(name);
    dtypes.insert(std::string(dtype_safetensors_name(info.dtype)));
    std::vector<int64_t> shape(info.shape.begin(), info.shape.end());
    m.tensors.push_back(tensor(name, std::move(shape), is_floating(info.dtype)));
  }
  for (const std::string& d : dtypes) m.stored_dtype += (m.stored_dtype.empty() ? "" : "+") + d;
  m.arch = recognise(m.tensors);
  return m;
}

ModelSpec model_from_module(const nn::Module& module, std::string name) {
  ModelSpec m;
  m.name = std::move(name);
  for (const auto& [n, p] : module.named_parameters()) {
    std::vector<int64_t> shape(p.sizes().begin(), p.sizes().end());
    m.tensors.push_back(tensor(n, std::move(shape), p.requires_grad()));
  }
  for (const auto& [n, b] : module.named_buffers()) {
    std::vector<int64_t> shape(b.sizes().begin(), b.sizes().end());
    m.tensors.push_back(tensor(n, std::move(shape), false));
  }
  m.arch = recognise(m.tensors);
  return m;
}

}  // namespace accel::estimate
