// Recurrent layers (nn/rnn.h) against PyTorch: outputs, final states and every gradient
// of RNN / LSTM / GRU (2 layers, bidirectional, batch_first both ways, with and without initial
// state and lengths) and of the cells, from the fixture tests/nn/rnn_fixture.safetensors written
// by make_rnn_fixture.py with python3-torch (no Python at test time); PyTorch's state_dict names
// load unchanged. Also float64 gradcheck, the typed calls, packing helpers, dropout and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "accel.h"
#include "autograd/gradcheck.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
namespace rnn = accel::nn::utils::rnn;
using accel::test::close_to;
using accel::test::error_of;
using accel::test::leaf;

namespace {

struct Fixture {
  io::TensorDict t;
  std::vector<std::vector<std::string>> cases;
  Fixture() {
    io::Metadata meta;
    t = io::load_safetensors(std::string(ACCEL_SOURCE_ROOT) + "/tests/nn/rnn_fixture.safetensors",
                             &meta);
    std::stringstream all(meta.at("cases"));
    std::string line;
    while (std::getline(all, line, ';')) {
      std::stringstream ls(line);
      std::vector<std::string> f;
      std::string w;
      while (ls >> w) f.push_back(w);
      cases.push_back(f);
    }
  }
  const Tensor& at(const std::string& k) const {
    auto it = t.find(k);
    REQUIRE_MESSAGE(it != t.end(), "fixture lacks ", k);
    return it->second;
  }
  bool has(const std::string& k) const { return t.count(k) != 0; }
  // name.<param> for every parameter of the case: a PyTorch state_dict.
  io::TensorDict state(const std::string& name) const {
    io::TensorDict sd;
    const std::string p = name + ".";
    for (const auto& [k, v] : t) {
      if (k.rfind(p, 0) != 0) continue;
      const std::string rest = k.substr(p.size());
      if (rest.rfind("weight_", 0) == 0 || rest.rfind("bias_", 0) == 0) sd[rest] = v;
    }
    return sd;
  }
};

const Fixture& fixture() {
  static Fixture f;
  return f;
}

struct Outs {
  Tensor out, h, c;
};

// Runs module m (RNN / LSTM / GRU) the way `packed` says: through PackedSequence or forward's
// lengths argument.
Outs run(nn::Module& m, const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& lengths,
         bool batch_first, bool packed) {
  const int64_t T = x.size(batch_first ? 1 : 0);
  std::optional<Tensor> h = h0.defined() ? std::optional<Tensor>(h0) : std::nullopt;
  std::optional<Tensor> len = lengths.defined() ? std::optional<Tensor>(lengths) : std::nullopt;
  if (auto* lstm = dynamic_cast<nn::LSTM*>(&m)) {
    if (packed) {
      auto p = rnn::pack_padded_sequence(x, lengths, batch_first, false);
      auto [po, hc] = h0.defined() ? (*lstm)(p, std::make_tuple(h0, c0)) : (*lstm)(p);
      Tensor out = std::get<0>(rnn::pad_packed_sequence(po, batch_first, 0.0, T));
      return {out, std::get<0>(hc), std::get<1>(hc)};
    }
    std::optional<Tensor> c = c0.defined() ? std::optional<Tensor>(c0) : std::nullopt;
    auto [out, hc] = (*lstm)(x, h, c, len);
    return {out, std::get<0>(hc), std::get<1>(hc)};
  }
  auto go = [&](auto& mod) -> Outs {
    if (packed) {
      auto p = rnn::pack_padded_sequence(x, lengths, batch_first, false);
      auto [po, hn] = h0.defined() ? mod(p, h0) : mod(p);
      return {std::get<0>(rnn::pad_packed_sequence(po, batch_first, 0.0, T)), hn, Tensor()};
    }
    auto [out, hn] = mod(x, h, len);
    return {out, hn, Tensor()};
  };
  if (auto* gru = dynamic_cast<nn::GRU*>(&m)) return go(*gru);
  return go(dynamic_cast<nn::RNN&>(m));
}

std::shared_ptr<nn::Module> make_layers(const std::vector<std::string>& c, int64_t in,
                                        int64_t hidden) {
  const std::string& kind = c[1];
  const int64_t layers = std::stoi(c[2]);
  const bool bidir = c[3] == "1", bf = c[4] == "1", bias = c[5] == "1";
  if (kind == "LSTM") return std::make_shared<nn::LSTM>(in, hidden, layers, bias, bf, 0.0, bidir);
  if (kind == "GRU") return std::make_shared<nn::GRU>(in, hidden, layers, bias, bf, 0.0, bidir);
  return std::make_shared<nn::RNN>(in, hidden, layers, kind, bias, bf, 0.0, bidir);
}

void check_grads(const Fixture& fx, const std::string& name, nn::Module& m,
                 const std::map<std::string, Tensor>& extra) {
  for (const auto& [pname, p] : m.named_parameters()) {
    INFO(name, ".", pname);
    CHECK(close_to(p.grad(), fx.at(name + ".grad." + pname), 1e-10));
  }
  for (const auto& [k, v] : extra) {
    INFO(name, ".", k);
    CHECK(close_to(v.grad(), fx.at(name + ".grad." + k), 1e-10));
  }
}

}  // namespace

TEST_CASE("RNN / LSTM / GRU match PyTorch: outputs, h_n, c_n and every gradient") {
  const Fixture& fx = fixture();
  int layer_cases = 0;
  for (const auto& c : fx.cases) {
    if (c[1].find("Cell") != std::string::npos) continue;
    ++layer_cases;
    const std::string& name = c[0];
    const bool bf = c[4] == "1", has_state = c[6] == "1", has_len = c[7] == "1";
    const bool lstm = c[1] == "LSTM";
    for (bool packed : {false, true}) {
      if (packed && !has_len) continue;
      INFO("case ", name, packed ? " (packed)" : "");
      const Tensor& x_ref = fx.at(name + ".input");
      auto m = make_layers(c, x_ref.size(-1), fx.at(name + ".w_h").size(-1));
      m->to(kFloat64);
      m->load_state_dict(fx.state(name));  // strict: PyTorch's names, shapes, nothing else
      Tensor x = leaf(x_ref);
      Tensor h0 = has_state ? leaf(fx.at(name + ".h0")) : Tensor();
      Tensor c0 = has_state && lstm ? leaf(fx.at(name + ".c0")) : Tensor();
      Tensor len = has_len ? fx.at(name + ".lengths") : Tensor();
      Outs o = run(*m, x, h0, c0, len, bf, packed);
      CHECK(close_to(o.out, fx.at(name + ".out"), 1e-10));
      CHECK(close_to(o.h, fx.at(name + ".h_n"), 1e-10));
      if (lstm) CHECK(close_to(o.c, fx.at(name + ".c_n"), 1e-10));
      Tensor loss = sum(o.out * fx.at(name + ".w_out")) + sum(o.h * fx.at(name + ".w_h"));
      if (lstm) loss = loss + sum(o.c * fx.at(name + ".w_c"));
      loss.backward();
      std::map<std::string, Tensor> extra{{"input", x}};
      if (has_state) extra["h0"] = h0;
      if (has_state && lstm) extra["c0"] = c0;
      check_grads(fx, name, *m, extra);
    }
  }
  CHECK(layer_cases == 16);
}

TEST_CASE("RNNCell / LSTMCell / GRUCell match PyTorch, batched and unbatched") {
  const Fixture& fx = fixture();
  int cells = 0;
  for (const auto& c : fx.cases) {
    if (c[1].find("Cell") == std::string::npos) continue;
    ++cells;
    const std::string& name = c[0];
    INFO("case ", name);
    Tensor x = leaf(fx.at(name + ".input")), h0 = leaf(fx.at(name + ".h0"));
    const int64_t in = x.size(1), H = h0.size(1);
    std::shared_ptr<nn::Module> m;
    Tensor h, cn, c0;
    if (c[1] == "LSTMCell") {
      auto cell = std::make_shared<nn::LSTMCell>(in, H);
      m = cell;
      m->to(kFloat64);
      m->load_state_dict(fx.state(name));
      c0 = leaf(fx.at(name + ".c0"));
      std::tie(h, cn) = (*cell)(x, std::make_tuple(h0, c0));
      // unbatched: one row, same values
      auto [h1, c1] = (*cell)(x[1].detach(), std::make_tuple(h0[1].detach(), c0[1].detach()));
      CHECK(close_to(h1, h[1].detach(), 1e-10));
      CHECK(close_to(c1, cn[1].detach(), 1e-10));
    } else if (c[1] == "GRUCell") {
      auto cell = std::make_shared<nn::GRUCell>(in, H);
      m = cell;
      m->to(kFloat64);
      m->load_state_dict(fx.state(name));
      h = (*cell)(x, h0);
      CHECK(close_to(cell->forward(x[1].detach(), h0[1].detach()), h[1].detach(), 1e-10));
    } else {
      auto cell =
          std::make_shared<nn::RNNCell>(in, H, true, c[1] == "RNNCell_relu" ? "relu" : "tanh");
      m = cell;
      m->to(kFloat64);
      m->load_state_dict(fx.state(name));
      h = (*cell)(x, h0);
    }
    CHECK(close_to(h, fx.at(name + ".h_n"), 1e-10));
    Tensor loss = sum(h * fx.at(name + ".w_h"));
    if (cn.defined()) {
      CHECK(close_to(cn, fx.at(name + ".c_n"), 1e-10));
      loss = loss + sum(cn * fx.at(name + ".w_c"));
    }
    loss.backward();
    std::map<std::string, Tensor> extra{{"input", x}, {"h0", h0}};
    if (c0.defined()) extra["c0"] = c0;
    check_grads(fx, name, *m, extra);
  }
  CHECK(cells == 4);
}

TEST_CASE("parameter names, shapes, order and initialisation are PyTorch's") {
  Generator g(3);
  nn::LSTM lstm(5, 16, 2, true, false, 0.0, true, &g);
  std::vector<std::string> names;
  for (const auto& [n, p] : lstm.named_parameters()) names.push_back(n);
  const std::vector<std::string> want = {
      "weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",         "bias_hh_l0",
      "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse",
      "weight_ih_l1",         "weight_hh_l1",         "bias_ih_l1",         "bias_hh_l1",
      "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"};
  CHECK(names == want);
  CHECK(lstm.parameter("weight_ih_l0").sizes() == Shape{64, 5});
  CHECK(lstm.parameter("weight_ih_l1").sizes() == Shape{64, 32});
  CHECK(lstm.parameter("weight_hh_l1_reverse").sizes() == Shape{64, 16});
  CHECK(lstm.parameter("bias_hh_l0").sizes() == Shape{64});
  for (const Tensor& p : lstm.parameters()) {
    CHECK(max(abs(p)).item() <= 0.25);  // 1/sqrt(16)
    CHECK(max(abs(p)).item() > 0.2);    // uniform over the whole range, not a constant
  }
  nn::GRU gru(5, 4, 1, false);
  CHECK(gru.named_parameters().size() == 2);
  CHECK(gru.parameter("weight_hh_l0").sizes() == Shape{12, 4});
  nn::RNN r(5, 4);
  CHECK(r.parameter("weight_ih_l0").sizes() == Shape{4, 5});
  nn::LSTMCell cell(3, 2);
  CHECK(cell.parameter("weight_ih").sizes() == Shape{8, 3});
  CHECK(cell.parameter("bias_hh").sizes() == Shape{8});
  std::ostringstream os;
  os << lstm;
  CHECK(os.str().find("LSTM(5, 16, num_layers=2, bidirectional=true)") != std::string::npos);
  Generator a(11), b(11);
  nn::GRU g1(3, 4, 2, true, false, 0.0, false, &a), g2(3, 4, 2, true, false, 0.0, false, &b);
  for (size_t i = 0; i < g1.parameters().size(); ++i)
    CHECK(close_to(g1.parameters()[i], g2.parameters()[i], 0));
}

TEST_CASE("typed calls: tuple state, optional state, Module pointer, hooks, unbatched") {
  Generator g(5);
  auto lstm = std::make_shared<nn::LSTM>(3, 4, 2, true, true, 0.0, true, &g);
  Tensor x = randn({2, 5, 3}, {}, &g);
  Tensor h0 = randn({4, 2, 4}, {}, &g), c0 = randn({4, 2, 4}, {}, &g);
  auto [y, hc] = (*lstm)(x, std::make_tuple(h0, c0));
  CHECK(y.sizes() == Shape{2, 5, 8});
  CHECK(std::get<0>(hc).sizes() == Shape{4, 2, 4});
  CHECK(std::get<1>(hc).sizes() == Shape{4, 2, 4});
  auto [y2, hc2] = lstm->forward(x, h0, c0);
  CHECK(close_to(y, y2, 0));
  std::optional<nn::LSTM::State> state;
  auto [y3, hc3] = (*lstm)(x, state);  // None: zeros
  auto [y4, hc4] = (*lstm)(x);
  CHECK(close_to(y3, y4, 0));
  CHECK(!close_to(y3, y, 1e-6));
  state = hc;
  auto [y5, hc5] = (*lstm)(x, state);
  auto [y6, hc6] = (*lstm)(x, hc);
  CHECK(close_to(y5, y6, 0));
  // a hidden state carried from batch to batch, None at first (word_language_model's loop)
  std::optional<nn::LSTM::State> hidden;
  Tensor o1, o2;
  std::tie(o1, hidden) = (*lstm)(x, hidden);
  REQUIRE(hidden.has_value());
  std::tie(o2, hidden) = (*lstm)(x, hidden);
  CHECK(close_to(o1, y4, 0));
  CHECK(close_to(o2, std::get<0>(lstm->forward(x, std::get<0>(hc4), std::get<1>(hc4))), 0));
  // through a Module pointer, the type-erased call
  std::shared_ptr<nn::Module> any = lstm;
  auto r = any->call<std::tuple<Tensor, std::tuple<Tensor, Tensor>>>(x, h0, c0);
  CHECK(close_to(std::get<0>(r), y, 0));
  // hooks see the tensors and run on the typed path
  int seen = 0;
  auto handle = lstm->register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        seen = int(in.size() * 10 + out.size());
      });
  auto [y7, hc7] = (*lstm)(x, std::make_tuple(h0, c0));
  CHECK(seen == 33);  // the arguments given (x, h0, c0) in; output, h_n, c_n out
  CHECK(close_to(y7, y, 0));
  handle.remove();
  // unbatched input (L, in) and state (layers * D, H): the batch-of-one result, squeezed
  auto [yu, hcu] = (*lstm)(x[0], std::make_tuple(h0.select(1, 0), c0.select(1, 0)));
  CHECK(close_to(yu, y[0], 1e-6));
  CHECK(close_to(std::get<1>(hcu), std::get<1>(hc).select(1, 0), 1e-6));
  // GRU / RNN: (output, h_n)
  nn::GRU gru(3, 4, 1, true, false, 0.0, false, &g);
  auto [gy, gh] = gru(x.transpose(0, 1));
  CHECK(gy.sizes() == Shape{5, 2, 4});
  CHECK(close_to(gh[0], gy[4], 0));  // one direction, no lengths: h_n is the last output
}

TEST_CASE("lengths: outputs past a length are zero, h_n is the state at the last valid step") {
  Generator g(7);
  for (bool bidir : {false, true}) {
    nn::GRU gru(3, 4, 2, true, false, 0.0, bidir, &g);
    Tensor x = randn({6, 3, 3}, {}, &g);
    const std::vector<int64_t> len = {6, 2, 4};
    auto [y, h] = gru(x, std::nullopt, tensor(len, {3}));
    for (int64_t b = 0; b < 3; ++b) {
      // each sequence alone, cut at its length, gives the same output and final state
      Tensor xb = x.narrow(0, 0, len[size_t(b)]).narrow(1, b, 1);
      auto [yb, hb] = gru(xb);
      CHECK(close_to(y.narrow(1, b, 1).narrow(0, 0, len[size_t(b)]), yb, 1e-6));
      CHECK(close_to(h.narrow(1, b, 1), hb, 1e-6));
      if (len[size_t(b)] < 6)
        CHECK(max(abs(y.narrow(1, b, 1).narrow(0, len[size_t(b)], 6 - len[size_t(b)]))).item() ==
              0.0);
    }
  }
}

TEST_CASE("float64 gradcheck of a tiny LSTM and GRU (bidirectional, 2 layers, lengths)") {
  Generator g(9);
  auto lstm = std::make_shared<nn::LSTM>(2, 2, 2, true, false, 0.0, true, &g);
  auto gru = std::make_shared<nn::GRU>(2, 2, 2, true, true, 0.0, true, &g);
  lstm->to(kFloat64);
  gru->to(kFloat64);
  Tensor x = randn({3, 2, 2}, {kFloat64}, &g).requires_grad_();
  Tensor h0 = randn({4, 2, 2}, {kFloat64}, &g).requires_grad_();
  Tensor c0 = randn({4, 2, 2}, {kFloat64}, &g).requires_grad_();
  Tensor len = tensor(std::vector<int64_t>{2, 3}, {2});
  for (bool with_len : {true, false}) {  // lengths: the per-op loop; none: the fused layer
    INFO("lengths ", with_len);
    std::vector<Tensor> in = {x, h0, c0};
    for (const Tensor& p : lstm->parameters()) in.push_back(p);
    auto res = autograd::gradcheck(
        [&](const std::vector<Tensor>& v) {
          auto [y, hc] =
              lstm->forward(v[0], v[1], v[2], with_len ? std::optional<Tensor>(len) : std::nullopt);
          return cat(
              {y.reshape({-1}), std::get<0>(hc).reshape({-1}), std::get<1>(hc).reshape({-1})});
        },
        in);
    CHECK_MESSAGE(res.ok, res.message);
  }
  {
    Tensor xb = randn({2, 3, 2}, {kFloat64}, &g).requires_grad_();  // batch_first (N=2, L=3)
    std::vector<Tensor> in = {xb, h0};
    for (const Tensor& p : gru->parameters()) in.push_back(p);
    auto res = autograd::gradcheck(
        [&](const std::vector<Tensor>& v) {
          auto [y, h] = gru->forward(v[0], v[1]);
          return cat({y.reshape({-1}), h.reshape({-1})});
        },
        in);
    CHECK_MESSAGE(res.ok, res.message);
  }
}

TEST_CASE("dropout between layers, in training mode only") {
  Generator g(13);
  nn::LSTM lstm(3, 8, 2, true, false, 0.5, false, &g);
  nn::LSTM plain(3, 8, 2, true, false, 0.0, false, &g);
  plain.load_state_dict(lstm.state_dict());
  Tensor x = randn({4, 2, 3}, {}, &g);
  auto [y_train, s1] = lstm(x);
  auto [y_plain, s2] = plain(x);
  CHECK(!close_to(y_train, y_plain, 1e-6));
  lstm.eval();
  auto [y_eval, s3] = lstm(x);
  CHECK(close_to(y_eval, y_plain, 0));
  // one layer: nothing between layers, dropout has no effect
  nn::GRU one(3, 8, 1, true, false, 0.5, false, &g);
  auto [a, ha] = one(x);
  auto [b, hb] = one(x);
  CHECK(close_to(a, b, 0));
}

TEST_CASE("pad_sequence, pack_padded_sequence, pad_packed_sequence") {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, {}).reshape({3, 2});
  Tensor b = tensor({7, 8}, {}).reshape({1, 2});
  a.requires_grad_();
  Tensor p = rnn::pad_sequence({a, b}, false, -1.0);  // (3, 2, 2)
  CHECK(p.sizes() == Shape{3, 2, 2});
  CHECK(p.tolist() == std::vector<double>{1, 2, 7, 8, 3, 4, -1, -1, 5, 6, -1, -1});
  Tensor pb = rnn::pad_sequence({a, b}, true);  // (2, 3, 2)
  CHECK(pb.sizes() == Shape{2, 3, 2});
  CHECK(pb[1].tolist() == std::vector<double>{7, 8, 0, 0, 0, 0});
  sum(p * 2.0).backward();
  CHECK(a.grad().tolist() == std::vector<double>(6, 2.0));
  // pack narrows to the longest length; unpack refills padding and honours total_length
  Tensor x = arange(0, 12, 1, {kFloat32}).reshape({2, 3, 2});  // batch_first (N=2, L=3, 2)
  auto packed = rnn::pack_padded_sequence(x, std::vector<int64_t>{2, 1}, true);
  CHECK(packed.padded.sizes() == Shape{2, 2, 2});
  auto [un, lens] = rnn::pad_packed_sequence(packed, true, 9.0, 4);
  CHECK(un.sizes() == Shape{2, 4, 2});
  CHECK(un.tolist() == std::vector<double>{0, 1, 2, 3, 9, 9, 9, 9, 6, 7, 9, 9, 9, 9, 9, 9});
  CHECK(lens.tolist() == std::vector<double>{2, 1});
  auto seq = rnn::pack_sequence({a.detach(), b});
  CHECK(seq.padded.sizes() == Shape{3, 2, 2});
  CHECK(seq.lengths.tolist() == std::vector<double>{3, 1});
}

TEST_CASE("errors name the module and the shapes") {
  nn::LSTM lstm(3, 4, 2);
  nn::GRU gru(3, 4, 1, true, true);
  Tensor x = randn({5, 2, 3});
  std::string e = error_of([&] { lstm(randn({2, 5, 3, 1})); });
  CHECK(e.find("[LSTM]") != std::string::npos);
  CHECK(e.find("(seq_len, batch, 3)") != std::string::npos);
  CHECK(e.find("(2, 5, 3, 1)") != std::string::npos);
  e = error_of([&] { gru(randn({2, 5, 7})); });
  CHECK(e.find("[GRU]") != std::string::npos);
  CHECK(e.find("(batch, seq_len, 3)") != std::string::npos);
  CHECK(e.find("(2, 5, 7)") != std::string::npos);
  e = error_of([&] { lstm(x, std::make_tuple(zeros({2, 2, 5}), zeros({2, 2, 4}))); });
  CHECK(e.find("[LSTM] expected h_0 (2, 2, 4)") != std::string::npos);
  CHECK(e.find("got (2, 2, 5)") != std::string::npos);
  e = error_of([&] { lstm(x, zeros({2, 2, 4}), std::nullopt); });
  CHECK(e.find("h_0 and c_0 are given together") != std::string::npos);
  e = error_of([&] {
    gru(randn({2, 5, 3}), std::nullopt, tensor(std::vector<int64_t>{5, 6}, {2}));
  });
  CHECK(e.find("[GRU] lengths[1] = 6 is outside [1, 5]") != std::string::npos);
  e = error_of([&] { gru(randn({2, 5, 3}), std::nullopt, tensor(std::vector<int64_t>{5}, {1})); });
  CHECK(e.find("lengths must be (batch) = (2)") != std::string::npos);
  nn::GRUCell cell(3, 4);
  e = error_of([&] { cell(randn({2, 3}), randn({2, 5})); });
  CHECK(e.find("[GRUCell] expected hx (2, 4)") != std::string::npos);
  e = error_of([&] { cell(randn({2, 2})); });
  CHECK(e.find("[GRUCell] expected input (batch, 3)") != std::string::npos);
  e = error_of([] { nn::RNN r(3, 4, 1, "sigmoid"); });
  CHECK(e.find("[RNN] nonlinearity must be") != std::string::npos);
  e = error_of([] { rnn::pad_sequence({randn({2, 3}), randn({2, 4})}); });
  CHECK(e.find("[pad_sequence] sequence 1") != std::string::npos);
  e = error_of([] { rnn::pack_padded_sequence(randn({4, 2, 3}), std::vector<int64_t>{2, 4}); });
  CHECK(e.find("enforce_sorted") != std::string::npos);
  CHECK(error_of([] {
          rnn::pack_padded_sequence(randn({4, 2, 3}), std::vector<int64_t>{2, 4}, false, false);
        }).empty());
}

TEST_CASE("autocast: bf16 projections, float32 parameters get float32 gradients close to fp32's") {
  for (bool gru_mode : {false, true}) {
    INFO("gru ", gru_mode);
    Generator g(21);
    std::shared_ptr<nn::Module> m;
    if (gru_mode)
      m = std::make_shared<nn::GRU>(8, 16, 2, true, false, 0.0, true, &g);
    else
      m = std::make_shared<nn::LSTM>(8, 16, 2, true, false, 0.0, true, &g);
    Tensor x = randn({5, 3, 8}, {}, &g);
    auto out_of = [&] {
      return gru_mode ? std::get<0>((*std::static_pointer_cast<nn::GRU>(m))(x))
                      : std::get<0>((*std::static_pointer_cast<nn::LSTM>(m))(x));
    };
    sum(out_of() * out_of().detach()).backward();
    std::vector<Tensor> ref;
    for (const Tensor& p : m->parameters()) ref.push_back(p.grad().clone());
    m->zero_grad();
    Tensor y;
    {
      AutocastGuard bf16(true, kBFloat16);
      y = out_of();
    }
    sum(y * y.detach()).backward();
    const auto params = m->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(params[i].grad().defined());
      CHECK(params[i].grad().dtype() == kFloat32);
      const double err = max(abs(params[i].grad() - ref[i])).item();
      CHECK(err <= 0.05 * (max(abs(ref[i])).item() + 1e-3));
    }
  }
}
