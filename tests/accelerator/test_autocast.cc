// Autocast wiring (Note [autocast in ops]): matmul-class ops compute on bf16/fp16-rounded inputs
// (on CPU: the exact values a low-precision kernel with an fp32 accumulator sees), fp32-only ops
// upcast low-precision inputs, gradients reach the float32 master weights, and bf16 training
// through the facade converges like the fp32 run.
#include <cmath>
#include <memory>
#include <vector>

#include <doctest/doctest.h>

#include "autograd/autocast.h"
#include "autograd/nn/activation.h"
#include "autograd/nn/container.h"
#include "autograd/nn/linear.h"
#include "autograd/optim/adam.h"
#include "tests/accelerator/common.h"

using namespace accel;

namespace {

AcceleratorConfig mp_config(MixedPrecision mp) {
  AcceleratorConfig c;
  c.read_env = false;
  c.mixed_precision = mp;
  return c;
}

// Largest |a - b| relative to the largest |b|.
double rel_max_diff(const Tensor& a, const Tensor& b) {
  const double scale = max(abs(b)).item<double>();
  return max(abs(sub(a, b))).item<double>() / (scale > 0 ? scale : 1.0);
}

Tensor rounded(const Tensor& x, DType dt) { return x.to(dt).to(kFloat32); }

}  // namespace

TEST_CASE("autocast bf16: Linear forward computes on bf16-rounded inputs, output float32 on CPU") {
  Accelerator acc(mp_config(MixedPrecision::BF16));
  Generator g(1);
  nn::Linear lin(16, 8, true, &g);
  Tensor x = randn({4, 16}, {}, &g);
  Tensor y32 = lin.forward(x);
  Tensor y;
  {
    auto ac = acc.autocast();
    CHECK(autocast_enabled());
    CHECK(autocast_dtype() == kBFloat16);
    y = lin.forward(x);
  }
  CHECK_FALSE(autocast_enabled());
  CHECK(y.dtype() == kFloat32);
  // Exactly the product of the bf16 values (fp32 accumulation), not the fp32 one.
  Tensor want = linear(rounded(x, kBFloat16), rounded(lin.weight, kBFloat16), rounded(lin.bias, kBFloat16));
  CHECK(equal(y, want));
  CHECK_FALSE(equal(y, y32));
  CHECK(rel_max_diff(y, y32) < 2e-2);  // bf16 has 8 significant bits
  // The parameters themselves stay float32 and untouched.
  CHECK(lin.weight.dtype() == kFloat32);
}

TEST_CASE("autocast: matmul, mm, bmm, conv2d round their inputs; fp16 too; float64 untouched") {
  Generator g(2);
  Tensor a = randn({3, 5}, {}, &g), b = randn({5, 4}, {}, &g);
  Tensor a3 = randn({2, 3, 5}, {}, &g), b3 = randn({2, 5, 4}, {}, &g);
  Tensor xc = randn({1, 2, 6, 6}, {}, &g), wc = randn({3, 2, 3, 3}, {}, &g), bc = randn({3}, {}, &g);
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dt);
    AutocastGuard ac(true, dt);
    CHECK(equal(matmul(a, b), [&] {
      AutocastSuspend off;
      return matmul(rounded(a, dt), rounded(b, dt));
    }()));
    Tensor got_mm = mm(a, b), got_bmm = bmm(a3, b3), got_conv = conv2d(xc, wc, bc, {1, 1}, {1, 1});
    AutocastSuspend off;
    CHECK(equal(got_mm, mm(rounded(a, dt), rounded(b, dt))));
    CHECK_FALSE(equal(got_mm, mm(a, b)));
    CHECK(equal(got_bmm, bmm(rounded(a3, dt), rounded(b3, dt))));
    CHECK(equal(got_conv, conv2d(rounded(xc, dt), rounded(wc, dt), rounded(bc, dt), {1, 1}, {1, 1})));
    CHECK_FALSE(equal(got_conv, conv2d(xc, wc, bc, {1, 1}, {1, 1})));
  }
  // float64 (what gradcheck uses) is left alone, as torch.autocast does.
  Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  Tensor plain = matmul(a64, b64);
  AutocastGuard ac(true, kBFloat16);
  Tensor under = matmul(a64, b64);
  CHECK(under.dtype() == kFloat64);
  CHECK(equal(under, plain));
  // A bf16 activation meets float32 weights: both become bf16 values, no dtype error.
  Tensor mixed = matmul(a.to(kBFloat16), b);
  CHECK(mixed.dtype() == kFloat32);
  AutocastSuspend off;
  CHECK(equal(mixed, matmul(rounded(a, kBFloat16), rounded(b, kBFloat16))));
}

TEST_CASE("autocast: softmax, norms and losses run in float32 on bf16/fp16 inputs") {
  Generator g(3);
  Tensor x32 = randn({4, 6}, {}, &g);
  Tensor x = x32.to(kBFloat16);
  Tensor xf = x.to(kFloat32);  // the same values in float32
  Tensor w = randn({6}, {}, &g), bias = randn({6}, {}, &g);
  Tensor target = tensor(std::vector<int64_t>{0, 5, 2, 3}, {4});
  Tensor y32 = randn({4, 6}, {}, &g);
  // Outside autocast a bf16 input with a float32 weight is a dtype error.
  CHECK_THROWS_AS(layer_norm(x, {6}, w, bias), DTypeError);
  AutocastGuard ac(true, kBFloat16);
  struct Case {
    const char* name;
    Tensor got, want;
  };
  std::vector<Case> cases;
  {
    Tensor s = softmax(x, 1), ls = log_softmax(x, 1), ln = layer_norm(x, {6}, w, bias),
           rn = rms_norm(x, {6}, w), ce = cross_entropy(x, target), nl = nll_loss(x, target),
           ms = mse_loss(x, y32), bce = binary_cross_entropy_with_logits(x, sigmoid(y32));
    AutocastSuspend off;
    cases = {{"softmax", s, softmax(xf, 1)},
             {"log_softmax", ls, log_softmax(xf, 1)},
             {"layer_norm", ln, layer_norm(xf, {6}, w, bias)},
             {"rms_norm", rn, rms_norm(xf, {6}, w)},
             {"cross_entropy", ce, cross_entropy(xf, target)},
             {"nll_loss", nl, nll_loss(xf, target)},
             {"mse_loss", ms, mse_loss(xf, y32)},
             {"bce_with_logits", bce, binary_cross_entropy_with_logits(xf, sigmoid(y32))}};
  }
  for (auto& c : cases) {
    CAPTURE(c.name);
    CHECK(c.got.dtype() == kFloat32);
    CHECK(equal(c.got, c.want));
  }
  // fp16 inputs likewise.
  Tensor h = x32.to(kFloat16);
  CHECK(softmax(h, 1).dtype() == kFloat32);
}

TEST_CASE("autocast: fused attention takes the composed path, whose matmuls round") {
  Generator g(6);
  Tensor q = randn({1, 2, 5, 8}, {}, &g), k = randn({1, 2, 5, 8}, {}, &g), v = randn({1, 2, 5, 8}, {}, &g);
  Tensor f32 = scaled_dot_product_attention(q, k, v, true);
  auto merged = [](const Tensor& t) { return t.transpose(1, 2).reshape({1, 5, 16}); };
  Tensor qkv = cat({merged(q), merged(k), merged(v)}, 2);  // (B, T, 3C) = [q | k | v]
  AutocastGuard ac(true, kBFloat16);
  Tensor got = scaled_dot_product_attention(q, k, v, true);
  Tensor packed = scaled_dot_product_attention_packed(qkv, 2, true);
  CHECK(got.dtype() == kFloat32);
  CHECK_FALSE(equal(got, f32));
  CHECK(rel_max_diff(got, f32) < 3e-2);
  // The packed form splits [q | k | v] per head: the same values.
  CHECK(allclose(packed, merged(got), 1e-6, 1e-6));
}

namespace {
// x: (B, 8) -> (B, 3)
std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 32, true, &g),
                                          std::make_shared<nn::Tanh>(),
                                          std::make_shared<nn::Linear>(32, 3, true, &g));
}

// Linearly separable 3-class data: label = argmax(x @ teacher).
std::vector<Tensor> make_classes(int64_t n) {
  Generator g(9);
  Tensor x = randn({n, 8}, {}, &g);
  Tensor teacher = randn({8, 3}, {}, &g);
  Tensor y = argmax(matmul(x, teacher), 1);
  return {x, y};
}
}  // namespace

TEST_CASE("autocast bf16: float32 loss and weight gradients, close to the fp32 run") {
  auto data = make_classes(64);
  auto grads_of = [&](bool autocast) {
    auto mlp = make_mlp(4);
    Accelerator acc(mp_config(autocast ? MixedPrecision::BF16 : MixedPrecision::No));
    acc.prepare_model(mlp);
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = cross_entropy(mlp->forward(data[0]), data[1]);
    }
    CHECK(loss.dtype() == kFloat32);
    acc.backward(loss);
    std::vector<Tensor> gs;
    for (auto& p : mlp->parameters()) {
      CHECK(p.dtype() == kFloat32);
      REQUIRE(p.grad().defined());
      CHECK(p.grad().dtype() == kFloat32);
      gs.push_back(p.grad().clone());
    }
    return std::make_pair(loss.item<double>(), gs);
  };
  auto [loss32, g32] = grads_of(false);
  auto [loss16, g16] = grads_of(true);
  CHECK(loss16 == doctest::Approx(loss32).epsilon(2e-2));
  CHECK(loss16 != loss32);
  REQUIRE(g16.size() == g32.size());
  for (size_t i = 0; i < g16.size(); ++i) {
    CAPTURE(i);
    CHECK(rel_max_diff(g16[i], g32[i]) < 5e-2);
    CHECK_FALSE(equal(g16[i], g32[i]));
  }
  // backward() suspends autocast: called inside the scope it gives the same gradients.
  auto mlp = make_mlp(4);
  Accelerator acc(mp_config(MixedPrecision::BF16));
  acc.prepare_model(mlp);
  {
    auto ac = acc.autocast();
    acc.backward(cross_entropy(mlp->forward(data[0]), data[1]));
  }
  std::vector<Tensor> inside;
  for (auto& p : mlp->parameters()) inside.push_back(p.grad());
  for (size_t i = 0; i < inside.size(); ++i) CHECK(equal(inside[i], g16[i]));
}

TEST_CASE("mixed_precision=bf16: a tiny MLP trains through the facade and converges") {
  auto data = make_classes(256);
  auto train = [&](MixedPrecision mp) {
    Accelerator acc(mp_config(mp));
    auto mlp = make_mlp(5);
    optim::AdamWOptions o;
    o.lr = 1e-2;
    auto opt = std::make_shared<optim::AdamW>(mlp->parameters(), o);
    data::DataLoaderOptions lo;
    lo.batch_size = 32;
    lo.shuffle = true;
    lo.seed = 2;
    auto loader = std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{data[0], data[1]}), lo);
    auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
    std::vector<double> epoch_loss;
    for (int e = 0; e < 15; ++e) {
      double total = 0;
      int n = 0;
      for (auto& b : *aloader) {
        Tensor loss;
        {
          auto ac = acc.autocast();
          loss = cross_entropy(model->forward(b[0]), b[1]);
        }
        acc.backward(loss);
        aopt->step();
        aopt->zero_grad();
        total += loss.item<double>();
        ++n;
      }
      epoch_loss.push_back(total / n);
    }
    Tensor pred = argmax(model->forward(data[0]), 1);
    const double accuracy = eq(pred, data[1]).to(kFloat32).mean().item<double>();
    return std::make_pair(epoch_loss, accuracy);
  };
  auto [bf16, acc16] = train(MixedPrecision::BF16);
  auto [fp32, acc32] = train(MixedPrecision::No);
  MESSAGE("bf16 loss " << bf16.front() << " -> " << bf16.back() << ", accuracy " << acc16
                       << "; fp32 " << fp32.front() << " -> " << fp32.back() << ", " << acc32);
  CHECK(bf16.back() < 0.25 * bf16.front());
  CHECK(acc16 > 0.9);
  CHECK(std::abs(bf16.back() - fp32.back()) < 0.1);
  CHECK(bf16 != fp32);  // autocast really changed the arithmetic
}
