// MultiheadAttention and the Transformer layers (autograd/nn/attention.h, transformer.h) against
// PyTorch: outputs, attention weights and the gradient of every parameter and input, in float64
// to 1e-10, from the fixture tests/nn/attention_fixture.safetensors written by
// make_attention_fixture.py with python3-torch (no Python at test time); PyTorch's state_dict
// names load unchanged. Also the causal-mask detection, typed calls, dropout and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "accel.h"

using namespace accel;

namespace {

constexpr int64_t E = 6, H = 2, DFF = 10;  // make_attention_fixture.py's sizes

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double max_diff(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a.to(kFloat64), b.to(kFloat64)))).item<double>();
}

const nn::TensorDict& fixture() {
  static nn::TensorDict t = nn::load_safetensors(std::string(ACCEL_SOURCE_ROOT) +
                                                 "/tests/nn/attention_fixture.safetensors");
  return t;
}
const Tensor& fx(const std::string& k) {
  auto it = fixture().find(k);
  REQUIRE_MESSAGE(it != fixture().end(), "fixture lacks ", k);
  return it->second;
}
bool has(const std::string& k) { return fixture().count(k) != 0; }

void check_close(const std::string& what, const Tensor& got, const Tensor& want) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.sizes() == want.sizes());
  CHECK_MESSAGE(max_diff(got, want) <= 1e-10, "max |diff| = ", max_diff(got, want));
}

// Loads case `name`'s parameters into m (float64, strict: every torch name must match), gives
// run() the case's inputs (floating ones as fresh leaves; masks as stored) and compares the
// output, the weights when the case has them, and every gradient.
using Inputs = std::map<std::string, Tensor>;
using Run = std::function<std::pair<Tensor, Tensor>(const Inputs&)>;

void check_case(const std::string& name, nn::Module& m, const std::vector<std::string>& input_names,
                const Run& run) {
  INFO("case ", name);
  m.to(kFloat64);
  nn::TensorDict sd;
  for (const auto& [k, v] : m.state_dict()) sd[k] = fx(name + "." + k);
  m.load_state_dict(sd);
  // Every parameter torch has a gradient for is one of ours (by name).
  std::set<std::string> ours;
  for (const auto& [k, v] : m.named_parameters()) ours.insert(k);
  const std::string gp = name + ".grad.";
  size_t torch_params = 0;
  for (const auto& [k, v] : fixture()) {
    if (k.rfind(gp, 0) != 0) continue;
    const std::string rest = k.substr(gp.size());
    if (std::find(input_names.begin(), input_names.end(), rest) != input_names.end()) continue;
    CHECK_MESSAGE(ours.count(rest) == 1, "torch parameter ", rest, " is not ours");
    ++torch_params;
  }
  CHECK(torch_params == ours.size());

  Inputs in;
  std::vector<Tensor> wrt;
  std::vector<std::string> wrt_names;
  for (const std::string& n : input_names) {
    if (!has(name + "." + n)) continue;
    Tensor t = fx(name + "." + n);
    if (has(gp + n)) {
      t = t.clone().requires_grad_();
      wrt.push_back(t);
      wrt_names.push_back(n);
    }
    in[n] = t;
  }
  auto [out, weights] = run(in);
  check_close("output", out, fx(name + ".out"));
  Tensor loss = sum(mul(out, fx(name + ".w_out")));
  if (has(name + ".weights")) {
    check_close("attention weights", weights, fx(name + ".weights"));
    loss = add(loss, sum(mul(weights, fx(name + ".w_weights"))));
  } else {
    CHECK_FALSE(weights.defined());
  }
  for (const auto& [k, p] : m.named_parameters()) {
    wrt.push_back(p);
    wrt_names.push_back(k);
  }
  std::vector<Tensor> grads = autograd::grad({loss}, wrt);
  for (size_t i = 0; i < wrt.size(); ++i) {
    check_close("gradient of " + wrt_names[i], grads[i], fx(gp + wrt_names[i]));
  }
}

std::optional<Tensor> opt(const Inputs& in, const std::string& k) {
  auto it = in.find(k);
  if (it == in.end()) return std::nullopt;
  return it->second;
}

struct MhaCase {
  const char* name;
  std::optional<int64_t> kdim, vdim;
  bool batch_first, self_attn, need_weights, average;
};

struct LayerCase {
  const char* name;
  bool norm_first;
  const char* activation;
  bool batch_first;
};

}  // namespace

TEST_CASE("MultiheadAttention matches PyTorch (self/cross, kdim/vdim, masks, weights)") {
  const MhaCase cases[] = {
      {"mha_self", {}, {}, false, true, true, true},
      {"mha_self_masks", {}, {}, false, true, false, true},
      {"mha_cross_kvdim", 5, 3, true, false, true, false},
      {"mha_cross", {}, {}, false, false, true, true},
      {"mha_cross_float", {}, {}, false, false, false, true},
      {"mha_unbatched", {}, {}, false, false, true, true},
  };
  for (const MhaCase& c : cases) {
    manual_seed(1);
    auto m = std::make_shared<nn::MultiheadAttention>(E, H, 0.0, true, false, false, c.kdim,
                                                      c.vdim, c.batch_first);
    check_case(c.name, *m, {"query", "key", "value", "attn_mask", "key_padding_mask"},
               [&](const Inputs& in) {
                 const Tensor& q = in.at("query");
                 const Tensor& k = c.self_attn ? q : in.at("key");
                 const Tensor& v = c.self_attn ? q : in.at("value");
                 auto [y, w] = (*m)(q, k, v, opt(in, "key_padding_mask"), c.need_weights,
                                    opt(in, "attn_mask"), c.average);
                 return std::make_pair(y, w);
               });
  }
}

TEST_CASE("TransformerEncoder matches PyTorch (2 layers, norm_first both ways, masks)") {
  const LayerCase cases[] = {
      {"enc_post_relu_causal", false, "relu", false},
      {"enc_pre_gelu_causal_kpm", true, "gelu", true},
      {"enc_post_gelu_bool", false, "gelu", false},
      {"enc_pre_relu_none", true, "relu", false},
  };
  for (const LayerCase& c : cases) {
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(E, H, DFF, 0.0, c.activation, 1e-5,
                                                               c.batch_first, c.norm_first);
    auto m = std::make_shared<nn::TransformerEncoder>(layer, 2, std::make_shared<nn::LayerNorm>(E));
    check_case(c.name, *m, {"src", "src_mask", "src_key_padding_mask"}, [&](const Inputs& in) {
      return std::make_pair(
          (*m)(in.at("src"), opt(in, "src_mask"), opt(in, "src_key_padding_mask")), Tensor());
    });
  }
}

TEST_CASE("TransformerDecoder and Transformer match PyTorch") {
  const LayerCase cases[] = {
      {"dec_post_relu", false, "relu", false},
      {"dec_pre_gelu_masks", true, "gelu", true},
  };
  for (const LayerCase& c : cases) {
    auto layer = std::make_shared<nn::TransformerDecoderLayer>(E, H, DFF, 0.0, c.activation, 1e-5,
                                                               c.batch_first, c.norm_first);
    auto m = std::make_shared<nn::TransformerDecoder>(layer, 2, std::make_shared<nn::LayerNorm>(E));
    check_case(c.name, *m,
               {"tgt", "memory", "tgt_mask", "memory_mask", "tgt_key_padding_mask",
                "memory_key_padding_mask"},
               [&](const Inputs& in) {
                 return std::make_pair(
                     (*m)(in.at("tgt"), in.at("memory"), opt(in, "tgt_mask"),
                          opt(in, "memory_mask"), opt(in, "tgt_key_padding_mask"),
                          opt(in, "memory_key_padding_mask")),
                     Tensor());
               });
  }
  auto t = std::make_shared<nn::Transformer>(E, H, 1, 1, DFF, 0.0, "gelu", 1e-5, true);
  check_case("transformer", *t, {"src", "tgt", "tgt_mask"}, [&](const Inputs& in) {
    return std::make_pair((*t)(in.at("src"), in.at("tgt"), std::nullopt, opt(in, "tgt_mask")),
                          Tensor());
  });
}
