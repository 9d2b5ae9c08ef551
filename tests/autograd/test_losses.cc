// The composed losses against PyTorch (tests/autograd/losses_fixture.txt, written by
// make_losses_fixture.py with python3-torch; no Python at test time): values and gradients, the
// nn loss modules, the errors, and the Categorical distribution (sampling frequencies, log_prob
// and entropy with their gradients).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "accel.h"
#include "autograd/gradcheck.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"
#include "tests/common/util.h"

#ifndef ACCEL_SOURCE_ROOT
#error "ACCEL_SOURCE_ROOT (the repository root) is passed by tests/autograd/meson.build"
#endif

using namespace accel;
using accel::test::check_close;
using accel::test::split;
using accel::test::values_of;

namespace {

Shape shape_of(const std::string& s) {
  Shape r;
  if (s.empty()) return r;
  for (const std::string& e : split(s, ',')) r.push_back(std::stoll(e));
  return r;
}

std::vector<double> doubles(const std::string& s) {
  std::vector<double> v;
  if (s.empty() || s == "-") return v;
  for (const std::string& e : split(s, ',')) v.push_back(std::stod(e));  // reads inf, -inf
  return v;
}

Tensor read_tensor(const std::string& shape, const std::string& values) {
  if (shape == "-") return Tensor();
  return tensor(doubles(values), shape_of(shape));
}

using LossFn = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

// The calls of make_losses_fixture.py, by name.
const std::map<std::string, LossFn>& fixture_calls() {
  static const std::map<std::string, LossFn> calls = {
      {"bce_mean", [](auto& x, auto& t, auto&) { return binary_cross_entropy(x, t); }},
      {"bce_none_weight",
       [](auto& x, auto& t, auto& w) { return binary_cross_entropy(x, t, w, Reduction::None); }},
      {"bce_sum_edges", [](auto& x, auto& t,
                           auto&) { return binary_cross_entropy(x, t, Tensor(), Reduction::Sum); }},
      {"l1_mean", [](auto& x, auto& t, auto&) { return l1_loss(x, t); }},
      {"l1_none", [](auto& x, auto& t, auto&) { return l1_loss(x, t, Reduction::None); }},
      {"smooth_l1_mean_beta05",
       [](auto& x, auto& t, auto&) { return smooth_l1_loss(x, t, Reduction::Mean, 0.5); }},
      {"smooth_l1_none",
       [](auto& x, auto& t, auto&) { return smooth_l1_loss(x, t, Reduction::None); }},
      {"smooth_l1_sum_beta0",
       [](auto& x, auto& t, auto&) { return smooth_l1_loss(x, t, Reduction::Sum, 0.0); }},
      {"huber_mean", [](auto& x, auto& t, auto&) { return huber_loss(x, t); }},
      {"huber_none_delta03",
       [](auto& x, auto& t, auto&) { return huber_loss(x, t, Reduction::None, 0.3); }},
      {"kl_batchmean", [](auto& x, auto& t, auto&) { return kl_div(x, t, Reduction::BatchMean); }},
      {"kl_none_log_target",
       [](auto& x, auto& t, auto&) { return kl_div(x, t, Reduction::None, true); }},
      {"kl_mean_zero_target", [](auto& x, auto& t, auto&) { return kl_div(x, t); }},
      {"kl_sum_log_target",
       [](auto& x, auto& t, auto&) { return kl_div(x, t, Reduction::Sum, true); }},
      {"cos_sim_dim1", [](auto& x, auto& t, auto&) { return cosine_similarity(x, t); }},
      {"cos_sim_broadcast",
       [](auto& x, auto& t, auto&) { return cosine_similarity(x, t, -1, 1e-6); }},
      {"cos_emb_mean_margin01",
       [](auto& x, auto& t, auto& y) { return cosine_embedding_loss(x, t, y, 0.1); }},
      {"cos_emb_none_margin-05",
       [](auto& x, auto& t, auto& y) {
         return cosine_embedding_loss(x, t, y.to(kInt64), -0.5, Reduction::None);
       }},
      {"cos_emb_unbatched_sum",
       [](auto& x, auto& t, auto& y) {
         return cosine_embedding_loss(x, t, y, -0.9, Reduction::Sum);
       }},
  };
  return calls;
}

}  // namespace

TEST_CASE("losses: every fixture case matches PyTorch, value and gradients") {
  std::ifstream f(std::string(ACCEL_SOURCE_ROOT) + "/tests/autograd/losses_fixture.txt");
  REQUIRE_MESSAGE(f.good(), "cannot read the fixture");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> r = split(line, '|');
    REQUIRE(r.size() == 11);
    const std::string& name = r[0];
    INFO(name);
    const auto it = fixture_calls().find(name);
    REQUIRE_MESSAGE(it != fixture_calls().end(), "no call for fixture case ", name);
    Tensor x = read_tensor(r[1], r[2]).requires_grad_(true);
    const bool grad_t = r[10] != "-";
    Tensor t = read_tensor(r[3], r[4]).requires_grad_(grad_t);
    Tensor w = read_tensor(r[5], r[6]);
    Tensor out = it->second(x, t, w);
    CHECK(out.sizes() == shape_of(r[7]));
    check_close(out, doubles(r[8]), 1e-10, 1e-10, name + " value");
    sum(out).backward();
    check_close(x.grad(), doubles(r[9]), 1e-10, 1e-10, name + " d input");
    std::vector<double> dt = doubles(r[10]);
    if (name == "kl_mean_zero_target") {
      // Where the target is 0, torch 1.13 and 2.x give NaN (xlogy(t, t)'s gradient through its
      // second argument, 0 / 0); kl_div takes 0 log 0 as the constant 0, so only -x / numel
      // (from -t x, mean) remains. Every other entry is torch's.
      const std::vector<double> xv = values_of(x.detach());
      for (size_t i = 0; i < dt.size(); ++i) {
        if (std::isnan(dt[i])) dt[i] = -xv[i] / double(xv.size());
      }
    }
    if (grad_t) check_close(t.grad(), dt, 1e-10, 1e-10, name + " d target");
    ++n;
  }
  CHECK(n == int(fixture_calls().size()));
}

TEST_CASE("binary_cross_entropy: clamped ends are finite, weight gets the unweighted loss") {
  Tensor x = tensor(std::vector<double>{0.0, 1.0, 0.25}, {3}).requires_grad_(true);
  Tensor t = tensor(std::vector<double>{1.0, 0.0, 1.0}, {3});
  Tensor l = binary_cross_entropy(x, t, Tensor(), Reduction::None);
  check_close(l, {100.0, 100.0, -std::log(0.25)}, 1e-10, 1e-10, "clamped at -100");
  sum(l).backward();
  for (double g : values_of(x.grad())) CHECK(std::isfinite(g));
  // A weight that requires grad: d(sum w l) / dw = l.
  Tensor w = tensor(std::vector<double>{2.0, 0.5, 1.0}, {3}).requires_grad_(true);
  sum(binary_cross_entropy(x.detach(), t, w, Reduction::None)).backward();
  check_close(w.grad(), values_of(l), 1e-10, 1e-10, "weight gradient");
  // gradcheck through weight and input (away from the ends).
  auto res = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return binary_cross_entropy(in[0], in[1], in[2], Reduction::Mean);
      },
      {tensor(std::vector<double>{0.2, 0.7, 0.4, 0.9}, {2, 2}).requires_grad_(true),
       tensor(std::vector<double>{0.3, 1.0, 0.0, 0.6}, {2, 2}).requires_grad_(true),
       tensor(std::vector<double>{1.5, 0.5}, {2}).requires_grad_(true)});
  CHECK_MESSAGE(res.ok, res.message);
}

TEST_CASE("losses: errors name the op, shapes and dtypes") {
  const Tensor p = full({2, 3}, 0.5, TensorOptions(kFloat32));
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Probabilities outside [0, 1] (logits passed to binary_cross_entropy by mistake).
  const std::string m1 = message([&] { binary_cross_entropy(mul(p, 3.0), p); });
  CHECK(m1.find("binary_cross_entropy") != std::string::npos);
  CHECK(m1.find("between 0 and 1") != std::string::npos);
  CHECK_THROWS_AS(binary_cross_entropy(full({2}, NAN, TensorOptions(kFloat32)),
                                       full({2}, 0.5, TensorOptions(kFloat32))),
                  ValueError);
  // Shapes that do not broadcast (torch broadcasts the others, with a warning:
  // tests/nn/test_spellings.cc): both shapes in the message.
  const std::string m2 = message([&] { l1_loss(p, full({2, 2}, 0.5, TensorOptions(kFloat32))); });
  CHECK(m2.find("[l1_loss]") != std::string::npos);
  CHECK(m2.find("(2, 3)") != std::string::npos);
  CHECK(m2.find("(2, 2)") != std::string::npos);
  CHECK_THROWS_AS(huber_loss(p, full({4}, 0.5, TensorOptions(kFloat32))), ShapeError);
  CHECK_THROWS_AS(kl_div(p, full({3, 2}, 0.5, TensorOptions(kFloat32))), ShapeError);
  CHECK_THROWS_AS(binary_cross_entropy(p, p, full({4}, 1.0, TensorOptions(kFloat32))), ShapeError);
  // Integer inputs.
  const std::string m3 = message([&] { l1_loss(ones({2, 3}, TensorOptions(kInt64)), p); });
  CHECK(m3.find("int64") != std::string::npos);
  CHECK_THROWS_AS(smooth_l1_loss(ones({2, 3}, TensorOptions(kInt64)), p), DTypeError);
  // Bad options.
  CHECK_THROWS_AS(smooth_l1_loss(p, p, Reduction::Mean, -1.0), ValueError);
  CHECK_THROWS_AS(huber_loss(p, p, Reduction::Mean, 0.0), ValueError);
  // BatchMean is kl_div's only.
  const std::string m4 = message([&] { mse_loss(p, p, Reduction::BatchMean); });
  CHECK(m4.find("[mse_loss]") != std::string::npos);
  CHECK(m4.find("BatchMean") != std::string::npos);
  CHECK_THROWS_AS(l1_loss(p, p, Reduction::BatchMean), ValueError);
  CHECK_THROWS_AS(cross_entropy(p, zeros({2}, TensorOptions(kInt64)), -100, Reduction::BatchMean),
                  ValueError);
  CHECK_NOTHROW(kl_div(p, p, Reduction::BatchMean));
  // cosine_embedding_loss: target shape against the inputs.
  const std::string m5 =
      message([&] { cosine_embedding_loss(p, p, ones({3}, TensorOptions(kInt64))); });
  CHECK(m5.find("cosine_embedding_loss") != std::string::npos);
  CHECK(m5.find("(2, 3)") != std::string::npos);
  CHECK_THROWS_AS(cosine_embedding_loss(p, p, ones({2}, TensorOptions(kBool))), DTypeError);
  CHECK_THROWS_AS(cosine_similarity(p, full({4}, 1.0, TensorOptions(kFloat32))), ShapeError);
  CHECK_THROWS_AS(cosine_similarity(p, p, 2), IndexError);
}

TEST_CASE("losses: modules hold torch's defaults and forward to the functions") {
  manual_seed(3);
  Tensor x = rand({4, 3}, TensorOptions(kFloat64));
  Tensor y = rand({4, 3}, TensorOptions(kFloat64));
  CHECK(equal(nn::L1Loss()(x, y), l1_loss(x, y)));
  CHECK(equal(nn::SmoothL1Loss(Reduction::Sum, 0.2)(x, y),
              smooth_l1_loss(x, y, Reduction::Sum, 0.2)));
  CHECK(nn::SmoothL1Loss().beta == 1.0);
  CHECK(nn::HuberLoss().delta == 1.0);
  CHECK(equal(nn::HuberLoss(Reduction::None, 0.1)(x, y), huber_loss(x, y, Reduction::None, 0.1)));
  CHECK(nn::KLDivLoss().reduction == Reduction::Mean);
  CHECK(!nn::KLDivLoss().log_target);
  Tensor lx = log(x);
  CHECK(equal(nn::KLDivLoss(Reduction::BatchMean)(lx, y), kl_div(lx, y, Reduction::BatchMean)));
  CHECK(equal(nn::CosineSimilarity()(x, y), cosine_similarity(x, y, 1)));
  CHECK(nn::CosineSimilarity().eps == 1e-8);
  Tensor target = tensor(std::vector<int64_t>{1, -1, 1, -1}, {4});
  CHECK(nn::CosineEmbeddingLoss().margin == 0.0);
  CHECK(
      equal(nn::CosineEmbeddingLoss(0.2)(x, y, target), cosine_embedding_loss(x, y, target, 0.2)));
  // BCELoss's weight is a buffer: in state_dict and converted by to().
  nn::BCELoss bce(tensor(std::vector<double>{1.0, 2.0, 3.0}, {3}));
  CHECK(equal(bce(x, y), binary_cross_entropy(x, y, bce.weight)));
  CHECK(bce.named_buffers().size() == 1);
  bce.to(kFloat32);
  CHECK(bce.weight.dtype() == kFloat32);
  CHECK(nn::BCELoss().named_buffers().empty());
  // CrossEntropyLoss: class weights, probability targets, label smoothing.
  Tensor logits = rand({4, 3}, TensorOptions(kFloat64));
  Tensor probs = softmax(rand({4, 3}, TensorOptions(kFloat64)), 1);
  Tensor cls = tensor(std::vector<int64_t>{0, 2, 1, 2}, {4});
  Tensor cw = tensor(std::vector<double>{0.5, 1.0, 2.0}, {3});
  nn::CrossEntropyLoss ce(cw, -100, Reduction::Mean, 0.1);
  CHECK(equal(ce(logits, cls), cross_entropy(logits, cls, cw, -100, Reduction::Mean, 0.1)));
  CHECK(equal(ce(logits, probs), cross_entropy(logits, probs, cw, -100, Reduction::Mean, 0.1)));
  CHECK(equal(nn::CrossEntropyLoss(-100, Reduction::Sum, 0.2)(logits, probs),
              cross_entropy(logits, probs, -100, Reduction::Sum, 0.2)));
  CHECK(ce.named_buffers().size() == 1);
  CHECK(nn::CrossEntropyLoss().named_buffers().empty());
}

// ---------------- Categorical ----------------

TEST_CASE("Categorical: probs and logits normalised, both ways agree") {
  Tensor w = tensor(std::vector<double>{1, 2, 3, 4, 0, 4}, {2, 3});
  auto d = distributions::Categorical::from_probs(w);
  check_close(d.probs(), {1.0 / 6, 2.0 / 6, 3.0 / 6, 0.5, 0.0, 0.5}, 1e-10, 1e-10, "probs");
  CHECK(d.batch_shape() == Shape{2});
  CHECK(d.num_events() == 3);
  auto e = distributions::Categorical::from_logits(log(w.narrow(0, 0, 1)));
  check_close(e.probs(), {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-10, 1e-10, "probs from logits");
  check_close(exp(e.logits()), {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-10, 1e-10, "normalised logits");
  // entropy: -sum p log p, 0 log 0 = 0 (the second row has a zero category).
  const double h0 =
      -(1.0 / 6 * std::log(1.0 / 6) + 2.0 / 6 * std::log(2.0 / 6) + 0.5 * std::log(0.5));
  check_close(d.entropy(), {h0, std::log(2.0)}, 1e-10, 1e-10, "entropy");
  // A -inf logit is a zero-probability category; its entropy stays finite.
  Tensor li = tensor(std::vector<double>{0.0, -INFINITY, 0.0}, {3});
  check_close(distributions::Categorical::from_logits(li).entropy(), {std::log(2.0)}, 1e-10, 1e-10,
              "entropy with -inf");
  // log_prob broadcasts value against the batch shape: (4, 1) x (2) -> (4, 2).
  Tensor v = tensor(std::vector<int64_t>{0, 1, 2, 2}, {4, 1});
  Tensor lp = d.log_prob(v);
  CHECK(lp.sizes() == Shape{4, 2});
  check_close(lp.select(1, 0), {std::log(1.0 / 6), std::log(2.0 / 6), std::log(0.5), std::log(0.5)},
              1e-10, 1e-10, "log_prob row 0");
  CHECK(values_of(lp.select(1, 1))[0] == doctest::Approx(std::log(0.5)));
}

TEST_CASE("Categorical: log_prob and entropy are differentiable to logits and probs") {
  Tensor logits = tensor(std::vector<double>{0.3, -1.2, 0.8, 0.1, 0.5, -0.4, 1.1, 0.0}, {2, 4});
  Tensor v = tensor(std::vector<int64_t>{3, 1, 0, 2, 2, 0}, {3, 2});
  auto r1 = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        auto d = distributions::Categorical::from_logits(in[0]);
        return add(sum(d.log_prob(v)), sum(d.entropy()));
      },
      {logits.clone().requires_grad_(true)});
  CHECK_MESSAGE(r1.ok, r1.message);
  Tensor probs = softmax(logits, 1).detach();
  auto r2 = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        auto d = distributions::Categorical::from_probs(in[0]);
        return add(sum(d.log_prob(v)), sum(d.entropy()));
      },
      {probs.clone().requires_grad_(true)});
  CHECK_MESSAGE(r2.ok, r2.message);
  // The REINFORCE gradient by hand: d log p_a / d logits = onehot(a) - p.
  Tensor l = logits.clone().requires_grad_(true);
  auto d = distributions::Categorical::from_logits(l);
  d.log_prob(tensor(std::vector<int64_t>{2, 0}, {2})).sum().backward();
  const std::vector<double> p = values_of(softmax(logits, 1));
  const std::vector<double> g = values_of(l.grad());
  for (size_t i = 0; i < 8; ++i) {
    const double onehot = (i == 2 || i == 4) ? 1.0 : 0.0;
    CHECK(g[i] == doctest::Approx(onehot - p[i]).epsilon(1e-12));
  }
}

TEST_CASE("Categorical: sample frequencies follow probs (fixed seed, generous bounds)") {
  Tensor w = tensor(std::vector<double>{0.1, 0.2, 0.7, 0.5, 0.0, 0.5}, {2, 3});
  auto d = distributions::Categorical::from_probs(w);
  Generator gen(77);
  Tensor s = d.sample({20000}, &gen);
  CHECK(s.sizes() == Shape{20000, 2});
  CHECK(s.dtype() == kInt64);
  const std::vector<int64_t> v = s.contiguous().to_vector<int64_t>();
  double count[2][3] = {};
  for (size_t i = 0; i < v.size(); ++i) count[i % 2][v[i]] += 1;
  const double want[2][3] = {{0.1, 0.2, 0.7}, {0.5, 0.0, 0.5}};
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 3; ++k) CHECK(std::abs(count[r][k] / 20000 - want[r][k]) < 0.02);  // ~6 sd
  CHECK(count[1][1] == 0);  // zero probability: never drawn
  // The same seed gives the same samples; sample_shape {} gives the batch shape.
  Generator g2(77);
  CHECK(equal(d.sample({20000}, &g2), s));
  CHECK(d.sample({}, &gen).sizes() == Shape{2});
  CHECK(d.sample({2, 3}, &gen).sizes() == Shape{2, 3, 2});
}

TEST_CASE("Categorical: invalid arguments name Categorical") {
  using distributions::Categorical;
  CHECK_THROWS_AS(Categorical::from_probs(tensor(std::vector<double>{0.5, -0.1}, {2})), ValueError);
  CHECK_THROWS_AS(Categorical::from_probs(zeros({2, 3}, TensorOptions(kFloat64))), ValueError);
  CHECK_THROWS_AS(Categorical::from_probs(tensor(std::vector<double>{NAN, 1.0}, {2})), ValueError);
  CHECK_THROWS_AS(Categorical::from_logits(tensor(std::vector<double>{NAN, 1.0}, {2})), ValueError);
  CHECK_THROWS_AS(Categorical::from_probs(ones({3}, TensorOptions(kInt64))), DTypeError);
  CHECK_THROWS_AS(Categorical::from_probs(ones({}, TensorOptions(kFloat64))), ShapeError);
  auto d = Categorical::from_logits(zeros({2, 3}, TensorOptions(kFloat64)));
  try {
    d.log_prob(tensor(std::vector<int64_t>{0, 3}, {2}));
    FAIL("no error for a value outside the support");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("Categorical.log_prob") != std::string::npos);
  }
  CHECK_THROWS_AS(d.log_prob(tensor(std::vector<double>{0.0, 1.0}, {2})), DTypeError);
  CHECK_THROWS_AS(d.log_prob(tensor(std::vector<int64_t>{0, 1, 2}, {3})), ShapeError);
}
