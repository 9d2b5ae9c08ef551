// MultiheadAttention and the Transformer layers (nn/attention.h, transformer.h) against
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
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::check_close;
using accel::test::error_of;
using accel::test::max_abs_diff;

namespace {

constexpr int64_t E = 6, H = 2, DFF = 10;  // make_attention_fixture.py's sizes

const io::TensorDict& fixture() {
  static io::TensorDict t = io::load_safetensors(std::string(ACCEL_SOURCE_ROOT) +
                                                 "/tests/nn/attention_fixture.safetensors");
  return t;
}
const Tensor& fx(const std::string& k) {
  auto it = fixture().find(k);
  REQUIRE_MESSAGE(it != fixture().end(), "fixture lacks ", k);
  return it->second;
}
bool has(const std::string& k) { return fixture().count(k) != 0; }

// Loads case `name`'s parameters into m (float64, strict: every torch name must match), gives
// run() the case's inputs (floating ones as fresh leaves; masks as stored) and compares the
// output, the weights when the case has them, and every gradient.
using Inputs = std::map<std::string, Tensor>;
using Run = std::function<std::pair<Tensor, Tensor>(const Inputs&)>;

void check_case(const std::string& name, nn::Module& m, const std::vector<std::string>& input_names,
                const Run& run) {
  INFO("case ", name);
  m.to(kFloat64);
  io::TensorDict sd;
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
  check_close(out, fx(name + ".out"), 0, 1e-10, "output");
  Tensor loss = sum(mul(out, fx(name + ".w_out")));
  if (has(name + ".weights")) {
    check_close(weights, fx(name + ".weights"), 0, 1e-10, "attention weights");
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
    check_close(grads[i], fx(gp + wrt_names[i]), 0, 1e-10, "gradient of " + wrt_names[i]);
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
    auto m = std::make_shared<nn::MultiheadAttention>(E, H, 0.0, true, false, false, c.kdim, c.vdim,
                                                      c.batch_first);
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
                 return std::make_pair((*m)(in.at("tgt"), in.at("memory"), opt(in, "tgt_mask"),
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

TEST_CASE("MultiheadAttention: fused and materialised paths, causal hint, dropout, erased call") {
  manual_seed(3);
  auto m = std::make_shared<nn::MultiheadAttention>(8, 2, 0.0, true, false, false, std::nullopt,
                                                    std::nullopt, true);
  m->to(kFloat64);
  Tensor x = randn({3, 7, 8}, TensorOptions(kFloat64));
  Tensor causal = nn::Transformer::generate_square_subsequent_mask(7, TensorOptions(kFloat64));
  // need_weights = false runs the fused kernel; true the materialised ops: same output.
  auto [y_fused, none] = (*m)(x, x, x, std::nullopt, false, causal);
  auto [y_mat, w] = (*m)(x, x, x, std::nullopt, true, causal);
  CHECK_FALSE(none.defined());
  CHECK(w.sizes() == Shape{3, 7, 7});
  CHECK(max_abs_diff(y_fused, y_mat) < 1e-12);
  // The causal hint (mask skipped, kernel causal) and a bool mask (true = not allowed) agree.
  auto [y_hint, n2] = (*m)(x, x, x, std::nullopt, false, causal, true, true);
  CHECK(max_abs_diff(y_hint, y_fused) < 1e-12);
  Tensor future = lt(causal, zeros_like(causal));
  auto [y_bool, n3] = (*m)(x, x, x, std::nullopt, false, future);
  CHECK(max_abs_diff(y_bool, y_fused) < 1e-12);
  // Future keys do not reach earlier queries; without the mask they do.
  Tensor x2 = x.clone();
  x2.narrow(1, 6, 1).fill_(3.0);
  auto [y2, n4] = (*m)(x2, x2, x2, std::nullopt, false, causal);
  CHECK(max_abs_diff(y2.narrow(1, 0, 6), y_fused.narrow(1, 0, 6)) < 1e-12);
  auto [y3, n5] = (*m)(x2, x2, x2, std::nullopt, false);
  auto [y4, n6] = (*m)(x, x, x, std::nullopt, false);
  CHECK(max_abs_diff(y3.narrow(1, 0, 6), y4.narrow(1, 0, 6)) > 1e-3);
  // Through a Module pointer (type-erased call), every argument given.
  nn::Module& base = *m;
  auto [ye, we] =
      base.call<std::tuple<Tensor, Tensor>>(x, x, x, std::nullopt, false, causal, true, false);
  CHECK(max_abs_diff(ye, y_fused) < 1e-12);
  CHECK_FALSE(we.defined());
  // Dropout on the attention weights: training only.
  auto d = std::make_shared<nn::MultiheadAttention>(8, 2, 0.5);
  d->to(kFloat64);
  Tensor xs = x.transpose(0, 1);  // (L, N, E)
  d->eval();
  auto [e1, ew1] = (*d)(xs, xs, xs);
  auto [e2, ew2] = (*d)(xs, xs, xs, std::nullopt, false);
  CHECK(max_abs_diff(e1, e2) < 1e-12);
  d->train();
  auto [t1, tw1] = (*d)(xs, xs, xs, std::nullopt, false);
  CHECK(max_abs_diff(t1, e1) > 1e-3);
}

TEST_CASE("MultiheadAttention: parameter names, init and errors") {
  manual_seed(4);
  nn::MultiheadAttention same(8, 2);
  std::vector<std::string> names;
  for (const auto& [k, v] : same.named_parameters()) names.push_back(k);
  CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                          "out_proj.bias"});
  // xavier_uniform_ bound sqrt(6 / (8 + 24)); biases zero.
  CHECK(max(abs(same.in_proj_weight)).item<double>() <= std::sqrt(6.0 / 32) + 1e-7);
  CHECK(max(abs(same.in_proj_bias)).item<double>() == 0.0);
  CHECK(max(abs(same.out_proj->bias)).item<double>() == 0.0);
  nn::MultiheadAttention cross(8, 2, 0.0, false, false, false, 5, 3);
  names.clear();
  for (const auto& [k, v] : cross.named_parameters()) names.push_back(k);
  CHECK(names == std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                          "out_proj.weight"});
  CHECK(cross.k_proj_weight.sizes() == Shape{8, 5});

  Tensor x = randn({4, 2, 8});
  CHECK(error_of([&] {
          same(x, x, x, std::nullopt, false, std::nullopt, true, true);
        }).find("[MultiheadAttention] is_causal") != std::string::npos);
  CHECK(error_of([] { nn::MultiheadAttention(8, 3); }).find("num_heads (3)") != std::string::npos);
  CHECK(error_of([] { nn::MultiheadAttention(8, 2, 0.0, true, true); }).find("add_bias_kv") !=
        std::string::npos);
  const std::string shape_err = error_of([&] { same(randn({4, 2, 6}), x, x); });
  CHECK(shape_err.find("(4, 2, 6)") != std::string::npos);
  const std::string mask_err = error_of([&] {
    same(x, x, x, std::nullopt, true, ones({3, 4}, TensorOptions(kBool)));
  });
  CHECK(mask_err.find("attn_mask (L, S) = (4, 4)") != std::string::npos);
  const std::string kpm_err = error_of([&] { same(x, x, x, ones({2, 5}, TensorOptions(kBool))); });
  CHECK(kpm_err.find("key_padding_mask (N, S) = (2, 4)") != std::string::npos);
  CHECK(error_of([] {
          nn::TransformerEncoderLayer(8, 2, 16, 0.1, "tanh");
        }).find("activation should be relu/gelu, not tanh") != std::string::npos);
}

TEST_CASE("TransformerEncoder: cloned layers, causal mask detection, eval dropout") {
  manual_seed(5);
  auto layer = std::make_shared<nn::TransformerEncoderLayer>(8, 2, 16);  // dropout 0.1
  nn::TransformerEncoder enc(layer, 2);
  // torch deep-copies the layer: both start with its values.
  CHECK(equal(enc.parameter("layers.0.linear1.weight"), layer->linear1->weight));
  CHECK(
      equal(enc.parameter("layers.1.self_attn.in_proj_weight"), layer->self_attn->in_proj_weight));
  CHECK_FALSE(enc.named_parameters().empty());
  enc.eval();
  enc.to(kFloat64);
  Tensor src = randn({6, 3, 8}, TensorOptions(kFloat64));
  Tensor m = nn::Transformer::generate_square_subsequent_mask(6, TensorOptions(kFloat64));
  CHECK(m.sizes() == Shape{6, 6});
  CHECK(m.tolist()[1] == -INFINITY);  // (0, 1)
  CHECK(m.tolist()[6] == 0.0);        // (1, 0)
  Tensor by_mask = enc(src, m);
  Tensor by_hint = enc(src, m, std::nullopt, true);
  Tensor by_bool = enc(src, lt(m, zeros_like(m)));
  CHECK(max_abs_diff(by_mask, by_hint) < 1e-12);
  CHECK(max_abs_diff(by_mask, by_bool) < 1e-12);
  // Eval: dropout off, deterministic; a non-causal mask gives something else.
  CHECK(max_abs_diff(enc(src, m), by_mask) == 0.0);
  CHECK(max_abs_diff(enc(src), by_mask) > 1e-3);
  // Training with dropout 0.1 draws masks.
  enc.train();
  CHECK(max_abs_diff(enc(src, m), by_mask) > 1e-6);
}
