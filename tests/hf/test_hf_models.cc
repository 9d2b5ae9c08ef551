// Hugging Face text models (hf/): GPT-2 and Llama built from config.json and loaded from
// (sharded) safetensors with transformers' names, against PyTorch references written with the
// same names and math (tests/hf/make_hf_fixture.py; fixtures in tests/hf/fixtures): logits in
// float64 within 1e-10, greedy tokens exactly; the KV-cache path against the full recompute;
// state dicts and config.json round-trip; strict loading and config errors name what is wrong.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "nn/init.h"
#include "hf/hf.h"
#include "tests/hf/common.h"

using namespace accel;
using accel::test::hf_expected;
using accel::test::hf_fixture;
using accel::test::hf_scratch;
using accel::test::max_abs_diff;
using accel::test::same_tokens;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 1e-10;

std::shared_ptr<hf::CausalLM> load64(const std::string& model) {
  return hf::from_pretrained(hf_fixture(model), {.dtype = kFloat64});
}

// Copies a fixture model's folder to a scratch one and returns it.
std::string copy_fixture(const std::string& model, const std::string& tag) {
  const std::string d = hf_scratch(tag);
  for (const auto& e : fs::directory_iterator(hf_fixture(model)))
    fs::copy_file(e.path(), fs::path(d) / e.path().filename());
  return d;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE("GPT-2, Llama and a tied Llama equal PyTorch: logits to 1e-10, greedy tokens exactly") {
  for (const std::string name : {"gpt2", "llama", "llama_tied"}) {
    CAPTURE(name);
    auto model = load64(name);
    CHECK(!model->is_training());  // from_pretrained returns eval mode, as transformers
    const Tensor ids = hf_expected(name + ".input_ids");
    const Tensor logits = (*model)(ids);
    CHECK(logits.dtype() == kFloat64);
    CHECK(max_abs_diff(logits, hf_expected(name + ".logits")) < kTol);
    const Tensor greedy = hf_expected(name + ".greedy");
    const int64_t n = greedy.size(1) - ids.size(1);
    CHECK(same_tokens(hf::generate(*model, ids, {.max_new_tokens = n}), greedy));
    CHECK(
        same_tokens(hf::generate(*model, ids, {.max_new_tokens = n, .use_cache = false}), greedy));
  }
}

TEST_CASE("float32 weights in float32 follow the float64 reference to float32 rounding") {
  auto model = hf::from_pretrained(hf_fixture("llama"));  // transformers' default dtype
  CHECK(model->parameters()[0].dtype() == kFloat32);
  const Tensor logits = (*model)(hf_expected("llama.input_ids"));
  CHECK(logits.dtype() == kFloat32);
  CHECK(max_abs_diff(logits, hf_expected("llama.logits")) < 1e-4);
}

TEST_CASE("the KV-cache path gives the logits of the full recompute") {
  Generator g(3);
  for (const std::string name : {"gpt2", "llama", "llama_tied"}) {
    CAPTURE(name);
    auto model = load64(name);
    const Tensor ids = randint(0, model->vocab_size(), {2, 12}, TensorOptions(kInt64), &g);
    const Tensor full = (*model)(ids);
    hf::KVCache cache;
    // A prompt of 5, then 4 tokens at once after the cache (the bottom-right causal mask), then
    // one at a time.
    const Tensor a = model->forward(ids.narrow(1, 0, 5), cache);
    CHECK(cache.length() == 5);
    CHECK(cache.keys.size() == size_t(model->num_layers()));
    const Tensor b = model->forward(ids.narrow(1, 5, 4), cache);
    CHECK(cache.length() == 9);
    CHECK(max_abs_diff(a, full.narrow(1, 0, 5)) < 1e-12);
    CHECK(max_abs_diff(b, full.narrow(1, 5, 4)) < 1e-12);
    for (int64_t t = 9; t < 12; ++t) {
      const Tensor step = model->forward(ids.narrow(1, t, 1), cache);
      CHECK(max_abs_diff(step, full.narrow(1, t, 1)) < 1e-12);
    }
    CHECK(cache.length() == 12);
  }
  // Llama caches its kv heads (2), not the repeated query heads (4).
  auto llama = load64("llama");
  hf::KVCache cache;
  llama->forward(hf_expected("llama.input_ids"), cache);
  CHECK(cache.keys[0].sizes() == Shape{2, 2, 7, 8});
}

TEST_CASE("a cache that does not fit the call is refused, and a failed call leaves it as it was") {
  auto model = load64("gpt2");
  const Tensor ids = hf_expected("gpt2.input_ids");
  hf::KVCache cache;
  model->forward(ids, cache);
  // Another batch size against this cache.
  CHECK_THROWS_WITH_AS(model->forward(ids.narrow(0, 0, 1), cache),
                       doctest::Contains("for a batch of 1"), ValueError);
  CHECK(cache.length() == 7);
  hf::KVCache partial = cache;
  partial.keys.pop_back();
  CHECK_THROWS_WITH_AS(model->forward(ids, partial), doctest::Contains("holds 1 / 2 layers"),
                       ValueError);
  // n_positions = 64: 60 more positions after 7 do not fit; the cache is untouched.
  const Tensor long_ids = zeros({2, 60}, TensorOptions(kInt64));
  CHECK_THROWS_WITH_AS(model->forward(long_ids, cache), doctest::Contains("positions [7, 67)"),
                       ShapeError);
  CHECK(cache.length() == 7);
}

TEST_CASE("transformers' names and layouts: Conv1D weights (in, out), a tied head, round trips") {
  auto gpt2 = load64("gpt2");
  const nn::TensorDict sd = gpt2->state_dict();
  CHECK(sd.at("transformer.h.0.attn.c_attn.weight").sizes() == Shape{32, 96});  // (in, out)
  CHECK(sd.at("transformer.h.0.attn.c_attn.bias").sizes() == Shape{96});
  CHECK(sd.at("transformer.h.1.mlp.c_fc.weight").sizes() == Shape{32, 128});
  CHECK(sd.at("transformer.h.1.mlp.c_proj.weight").sizes() == Shape{128, 32});
  CHECK(gpt2->tied_aliases().at("lm_head.weight") == "transformer.wte.weight");
  CHECK(sd.at("lm_head.weight").data_ptr() == sd.at("transformer.wte.weight").data_ptr());
  // Every name of the file is a name of the model (and the model adds only the tied head).
  const nn::TensorDict file = nn::load_safetensors(hf_fixture("gpt2") + "/model.safetensors");
  CHECK(sd.size() == file.size() + 1);
  for (const auto& [name, t] : file) {
    CAPTURE(name);
    REQUIRE(sd.count(name));
    CHECK(max_abs_diff(sd.at(name), t) == 0);
  }
  auto llama = load64("llama");
  const nn::TensorDict lsd = llama->state_dict();
  CHECK(lsd.at("model.layers.1.self_attn.k_proj.weight").sizes() == Shape{16, 32});  // 2 kv heads
  CHECK(lsd.at("model.layers.0.mlp.gate_proj.weight").sizes() == Shape{64, 32});
  CHECK(lsd.at("lm_head.weight").data_ptr() != lsd.at("model.embed_tokens.weight").data_ptr());
  CHECK(load64("llama_tied")->tied_aliases().count("lm_head.weight") == 1);

  // save_pretrained writes what transformers writes: the file lacks the tied lm_head.weight, the
  // config keeps the keys accel does not read; reloading gives the same model.
  for (const std::string name : {"gpt2", "llama", "llama_tied"}) {
    CAPTURE(name);
    auto m = load64(name);
    const std::string dir = hf_scratch("save-" + name);
    hf::save_pretrained(*m, dir);
    const nn::TensorDict saved = nn::load_safetensors(dir + "/model.safetensors");
    CHECK(saved.count("lm_head.weight") == (name == "llama" ? 1u : 0u));
    const nlohmann::json cfg = hf::read_config(dir);
    const nlohmann::json original = hf::read_config(hf_fixture(name));
    for (const auto& [key, value] : original.items()) {
      CAPTURE(key);
      CHECK(cfg.at(key) == value);  // nothing lost, nothing changed
    }
    CHECK(cfg["transformers_version"] == "4.40.0");
    auto back = hf::from_pretrained(dir, {.dtype = kFloat64});
    const Tensor ids = hf_expected(name + ".input_ids");
    CHECK(max_abs_diff((*back)(ids), (*m)(ids)) == 0);
    fs::remove_all(dir);
  }
}

TEST_CASE("GPT-2's original files load: names without 'transformer.', causal-mask buffers") {
  // The openai-community/gpt2 files name the tensors of GPT2Model ("h.0.ln_1.weight") and hold
  // the attn.bias buffers, which transformers skips.
  nn::TensorDict legacy;
  for (const auto& [name, t] : nn::load_safetensors(hf_fixture("gpt2") + "/model.safetensors"))
    legacy[name.substr(std::string("transformer.").size())] = t;
  legacy["h.0.attn.bias"] = ones({1, 1, 64, 64});
  legacy["h.1.attn.masked_bias"] = full({}, -1e4);
  const std::string dir = copy_fixture("gpt2", "legacy");
  nn::save_safetensors(dir + "/model.safetensors", legacy);
  auto model = hf::from_pretrained(dir, {.dtype = kFloat64});
  CHECK(max_abs_diff((*model)(hf_expected("gpt2.input_ids")), hf_expected("gpt2.logits")) < kTol);
  fs::remove_all(dir);
}

TEST_CASE("strict loading names the missing, unexpected and mis-shaped tensors") {
  const nn::TensorDict good = nn::load_safetensors(hf_fixture("gpt2") + "/model.safetensors");
  const std::string dir = copy_fixture("gpt2", "strict");
  auto load = [&](const nn::TensorDict& d, bool strict = true) {
    nn::save_safetensors(dir + "/model.safetensors", d);
    auto m = hf::from_config(dir);
    return hf::load_weights(*m, dir, strict);
  };
  nn::TensorDict missing = good;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  CHECK_THROWS_WITH_AS(load(missing),
                       doctest::Contains("missing keys (1): transformer.h.1.mlp.c_fc.bias"),
                       ValueError);
  nn::TensorDict extra = good;
  extra["transformer.h.0.attn.q_proj.weight"] = zeros({4});
  CHECK_THROWS_WITH_AS(load(extra),
                       doctest::Contains("unexpected keys (1): transformer.h.0.attn.q_proj.weight"),
                       ValueError);
  nn::TensorDict shaped = good;
  shaped["transformer.wte.weight"] = zeros({98, 32});
  CHECK_THROWS_WITH_AS(
      load(shaped),
      doctest::Contains(
          "shape mismatch (1): transformer.wte.weight: file (98, 32), model (97, 32)"),
      ValueError);
  // Transposed Conv1D weights (a checkpoint converted for nn::Linear) are refused by shape.
  nn::TensorDict transposed = good;
  transposed["transformer.h.0.attn.c_attn.weight"] =
      good.at("transformer.h.0.attn.c_attn.weight").t().contiguous();
  CHECK_THROWS_WITH_AS(load(transposed), doctest::Contains("file (96, 32), model (32, 96)"),
                       ValueError);
  // Non-strict: the names both have load, the rest is reported; a shape mismatch still refuses.
  const nn::LoadResult r = load(missing, false);
  CHECK(r.missing_keys == std::vector<std::string>{"transformer.h.1.mlp.c_fc.bias"});
  CHECK_THROWS_AS(load(shaped, false), ValueError);
  load(missing, false);
  auto partial = hf::from_pretrained(dir, {.dtype = kFloat64, .strict = false});  // `missing`
  CHECK(partial->parameter("transformer.h.1.mlp.c_fc.bias").abs().sum().item<double>() == 0);
  fs::remove_all(dir);
}

TEST_CASE("a model an engine shards is loaded and saved through the Accelerator, not here") {
  auto model = load64("llama_tied");
  model->set_sharded("acc.load_model");  // what ZeRO-3 marks its model with
  CHECK_THROWS_WITH_AS(hf::load_weights(*model, hf_fixture("llama_tied")),
                       doctest::Contains("load it with the Accelerator's load_model"), ValueError);
  const std::string dir = hf_scratch("sharded-save");
  CHECK_THROWS_WITH_AS(hf::save_pretrained(*model, dir),
                       doctest::Contains("save it with the Accelerator's save_model"), ValueError);
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST_CASE("a sharded set: the index is checked, a shard's tensors are named") {
  const std::string dir = copy_fixture("llama", "sharded");
  // The index maps a tensor to the shard that does not hold it.
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  nlohmann::json idx = hf::read_config(dir + "/model.safetensors.index.json");
  const std::string real = idx["weight_map"]["model.norm.weight"];
  idx["weight_map"]["model.norm.weight"] = real == first ? second : first;
  write_text(dir + "/model.safetensors.index.json", idx.dump());
  auto m = hf::from_config(dir);
  CHECK_THROWS_WITH_AS(hf::load_weights(*m, dir), doctest::Contains("does not hold it"), IoError);
  // A shard missing from the folder.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  CHECK_THROWS_WITH_AS(hf::load_weights(*m, dir), doctest::Contains("model-00002-of-00002"),
                       IoError);
  fs::remove_all(dir);
}

TEST_CASE("config.json: transformers' keys and defaults, errors naming the key") {
  const nlohmann::json g = hf::read_config(hf_fixture("gpt2"));
  const hf::GPT2Config c = hf::GPT2Config::from_json(g);
  CHECK(c.n_embd == 32);
  CHECK(c.inner_dim() == 128);   // n_inner null
  CHECK(c.tie_word_embeddings);  // transformers' default, absent from the file
  CHECK(c.tokens.eos_token_id == std::vector<int64_t>{96});
  const hf::LlamaConfig l = hf::LlamaConfig::from_json(hf::read_config(hf_fixture("llama")));
  CHECK(l.kv_heads() == 2);
  CHECK(l.head_size() == 8);
  CHECK(hf::LlamaConfig::from_json(hf::read_config(hf_fixture("llama_tied"))).rope_theta == 500000);
  nlohmann::json list_eos = hf::read_config(hf_fixture("llama"));
  list_eos["eos_token_id"] = {2, 7};
  CHECK(hf::LlamaConfig::from_json(list_eos).tokens.eos_token_id == std::vector<int64_t>{2, 7});

  auto bad = [](nlohmann::json j, const char* key, nlohmann::json v) {
    j[key] = v;
    return j;
  };
  CHECK_THROWS_WITH_AS(
      hf::from_config(bad(g, "model_type", "bert")),
      doctest::Contains("model_type 'bert' is not supported (supported: gpt2, llama)"), ValueError);
  nlohmann::json untyped = g;
  untyped.erase("model_type");
  CHECK_THROWS_WITH_AS(hf::from_config(untyped), doctest::Contains("no \"model_type\""),
                       ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(g, "n_embd", "32")),
                       doctest::Contains("\"n_embd\" must be an integer, got \"32\""), ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(g, "n_head", 5)),
                       doctest::Contains("n_embd 32 is not divisible by n_head 5"), ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(g, "activation_function", "mish")),
                       doctest::Contains("activation_function 'mish' is not supported"),
                       ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(g, "scale_attn_by_inverse_layer_idx", true)),
                       doctest::Contains("scale_attn_by_inverse_layer_idx"), ValueError);
  const nlohmann::json lj = hf::read_config(hf_fixture("llama"));
  CHECK_THROWS_WITH_AS(hf::from_config(bad(lj, "rope_scaling", {{"rope_type", "llama3"}})),
                       doctest::Contains("\"rope_scaling\""), ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(lj, "num_key_value_heads", 3)),
                       doctest::Contains("not divisible by num_key_value_heads 3"), ValueError);
  CHECK_THROWS_WITH_AS(hf::from_config(bad(lj, "hidden_act", "gelu")),
                       doctest::Contains("hidden_act 'gelu' is not supported"), ValueError);
  const std::string dir = hf_scratch("config");
  write_text(dir + "/config.json", "{\"model_type\": ");
  CHECK_THROWS_WITH_AS(hf::read_config(dir), doctest::Contains("is not JSON"), IoError);
  CHECK_THROWS_WITH_AS(hf::read_config(dir + "/none"), doctest::Contains("none"), IoError);
  fs::remove_all(dir);
}

TEST_CASE("Conv1D computes x @ weight + bias with transformers' (nf, nx) arguments") {
  Generator g(1);
  hf::Conv1D c(6, 4, 0.5, &g);  // 6 outputs, 4 inputs: weight (4, 6)
  CHECK(c.weight.sizes() == Shape{4, 6});
  CHECK(c.extra_repr() == "nf=6, nx=4");
  nn::init::normal_(c.bias, 0.0, 1.0, &g);
  const Tensor x = randn({2, 3, 4}, TensorOptions(kFloat64), &g);
  c.to(kFloat64);
  const Tensor want = matmul(x, c.weight) + c.bias;
  CHECK(max_abs_diff(c(x), want) == 0);
  CHECK_THROWS_WITH_AS(c(randn({2, 6})), doctest::Contains("expected input (..., 4)"), ShapeError);
}

TEST_CASE("input_ids that are not (batch, sequence) integers are refused") {
  auto model = load64("llama_tied");
  CHECK_THROWS_WITH_AS((*model)(zeros({2, 3, 4}, TensorOptions(kInt64))),
                       doctest::Contains("expected input_ids (batch, sequence)"), ShapeError);
  CHECK_THROWS_WITH_AS((*model)(zeros({2, 3})), doctest::Contains("must be int64"), DTypeError);
  auto gpt2 = load64("gpt2");
  CHECK_THROWS_WITH_AS((*gpt2)(zeros({1, 65}, TensorOptions(kInt64))),
                       doctest::Contains("do not fit the model's 64 positions"), ShapeError);
}

TEST_CASE("the tp plans record Conv1D's transposed shard dims; a non-linear layer is refused") {
  // A group of one (none): nothing is cut, but the plan is checked and recorded as at any size.
  auto gpt2 = hf::from_config(hf_fixture("gpt2"));
  dist::parallelize(gpt2, nullptr, hf::gpt2_tp_plan());
  const auto shards = dist::tp_shards(*gpt2);
  CHECK(shards.at("transformer.h.0.attn.c_attn.weight").dim == 1);  // (in, out): columns
  CHECK(shards.at("transformer.h.0.attn.c_attn.weight").chunks == 3);
  CHECK(shards.at("transformer.h.0.attn.c_attn.bias").dim == 0);
  CHECK(shards.at("transformer.h.1.mlp.c_proj.weight").dim == 0);  // rowwise: rows
  CHECK(shards.count("transformer.h.1.mlp.c_proj.bias") == 0);     // replicated
  CHECK(shards.count("transformer.wte.weight") == 0);
  auto llama = hf::from_config(hf_fixture("llama"));
  dist::parallelize(llama, nullptr, hf::tp_plan_for(*llama));
  CHECK(dist::tp_shards(*llama).at("model.layers.1.self_attn.o_proj.weight").dim == 1);
  CHECK(dist::tp_shards(*llama).at("model.layers.1.mlp.up_proj.weight").dim == 0);
  auto other = hf::from_config(hf_fixture("gpt2"));
  CHECK_THROWS_WITH_AS(dist::parallelize(other, nullptr, {{"transformer.ln_f", dist::colwise()}}),
                       doctest::Contains("needs an nn::Linear (or a TransposedLinear"), ValueError);
}
