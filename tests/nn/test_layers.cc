// Layers: BatchNorm running statistics, norms, Embedding, Dropout, activations, losses, and
// causal self-attention (shape, a float64 reference, causality).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::error_of;

namespace {

// Per-channel mean and (biased) variance of an (N, C, H, W) tensor, in double.
void channel_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const std::vector<double> v = x.tolist();
  mean.assign(size_t(C), 0.0);
  var.assign(size_t(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < HW; ++i) mean[size_t(c)] += v[size_t((n * C + c) * HW + i)];
    }
    mean[size_t(c)] /= double(N * HW);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < HW; ++i) {
        const double d = v[size_t((n * C + c) * HW + i)] - mean[size_t(c)];
        var[size_t(c)] += d * d;
      }
    }
    var[size_t(c)] /= double(N * HW);
  }
}

}  // namespace

TEST_CASE("BatchNorm2d: batch statistics in training, running statistics in eval") {
  manual_seed(21);
  nn::BatchNorm2d bn(3);
  CHECK(bn.running_mean.tolist() == std::vector<double>(3, 0.0));
  CHECK(bn.running_var.tolist() == std::vector<double>(3, 1.0));
  Tensor x = add(mul(randn({4, 3, 2, 5}), 2.0), 1.5);  // mean 1.5, var 4
  std::vector<double> mu, var;
  channel_stats(x, mu, var);
  const double n = 4 * 2 * 5;

  Tensor y = bn.forward(x);
  // Normalised with the batch statistics: per channel mean 0, biased variance ~1.
  std::vector<double> ymu, yvar;
  channel_stats(y, ymu, yvar);
  for (int c = 0; c < 3; ++c) {
    CHECK(std::abs(ymu[size_t(c)]) < 1e-5);
    CHECK(yvar[size_t(c)] ==
          doctest::Approx(var[size_t(c)] / (var[size_t(c)] + 1e-5)).epsilon(1e-4));
  }
  // Running statistics: momentum 0.1, unbiased variance.
  const std::vector<double> rm = bn.running_mean.tolist(), rv = bn.running_var.tolist();
  for (int c = 0; c < 3; ++c) {
    CHECK(rm[size_t(c)] == doctest::Approx(0.1 * mu[size_t(c)]).epsilon(1e-5));
    CHECK(rv[size_t(c)] == doctest::Approx(0.9 + 0.1 * var[size_t(c)] * n / (n - 1)).epsilon(1e-5));
  }
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);

  // Gradients reach weight and bias: d sum(y) / d bias_c = N * H * W.
  y.sum().backward();
  CHECK(bn.bias.grad().tolist() == std::vector<double>(3, n));
  CHECK(bn.weight.grad().defined());

  // Eval: (x - running_mean) / sqrt(running_var + eps) * w + b, and no statistics update.
  bn.eval();
  {
    NoGradGuard ng;
    bn.weight.copy_(tensor({1.f, 2.f, 3.f}));
    bn.bias.copy_(tensor({0.f, -1.f, 1.f}));
  }
  Tensor x2 = randn({2, 3, 2, 2});
  Tensor y2 = bn.forward(x2);
  const std::vector<double> xv = x2.tolist(), yv = y2.tolist();
  const double w[3] = {1, 2, 3}, b[3] = {0, -1, 1};
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 4) % 3;
    const double ref = (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
    CHECK(yv[i] == doctest::Approx(ref).epsilon(1e-5));
  }
  CHECK(bn.running_mean.tolist() == rm);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);

  // Errors name the layer and the expected shape.
  CHECK(error_of([&] {
          bn.forward(randn({2, 4, 2, 2}));
        }).find("[BatchNorm2d] expected input (N, C, H, W) with C = 3, got (2, 4, 2, 2)") == 0);
  bn.train();
  CHECK_THROWS_AS(bn.forward(randn({1, 3, 1, 1})), ValueError);
  // Buffers are in the state dict.
  CHECK(bn.state_dict().count("num_batches_tracked"));
}

TEST_CASE("BatchNorm: cumulative average without momentum; BatchNorm1d; no running stats") {
  nn::BatchNorm1d bn(2, 1e-5, std::nullopt);
  Tensor a = tensor({1.f, 10.f, 3.f, 20.f}, TensorOptions()).view({2, 2});  // means (2, 15)
  Tensor b = tensor({5.f, 0.f, 7.f, 2.f}, TensorOptions()).view({2, 2});    // means (6, 1)
  bn.forward(a);
  bn.forward(b);
  CHECK(bn.running_mean.tolist()[0] == doctest::Approx(4.0));
  CHECK(bn.running_mean.tolist()[1] == doctest::Approx(8.0));
  // Unbiased batch variances (2, 50) and (2, 2); the cumulative average is their mean.
  CHECK(bn.running_var.tolist()[0] == doctest::Approx(2.0));
  CHECK(bn.running_var.tolist()[1] == doctest::Approx(26.0));
  CHECK(bn.forward(randn({4, 2, 7})).sizes() == Shape{4, 2, 7});

  nn::BatchNorm2d plain(2, 1e-5, 0.1, false, false);
  CHECK(plain.parameters().empty());
  CHECK(plain.buffers().empty());
  plain.eval();  // still normalises with the batch statistics
  std::vector<double> mu, var;
  Tensor y = plain.forward(randn({3, 2, 2, 2}));
  channel_stats(y, mu, var);
  CHECK(std::abs(mu[0]) < 1e-5);
}

TEST_CASE("LayerNorm and RMSNorm modules") {
  manual_seed(3);
  nn::LayerNorm ln(8);
  Tensor x = randn({2, 3, 8});
  CHECK(allclose(ln.forward(x), layer_norm(x, {8}, ln.weight, ln.bias, 1e-5)));
  nn::LayerNorm ln2(Shape{3, 8}, 1e-5, false);
  CHECK(ln2.parameters().empty());
  CHECK(ln2.forward(x).sizes() == x.sizes());

  nn::RMSNorm rms(8);
  Tensor r = rms.forward(x);
  const std::vector<double> rv = r.tolist();
  for (size_t row = 0; row < 6; ++row) {
    double ms = 0;
    for (size_t i = 0; i < 8; ++i) ms += rv[row * 8 + i] * rv[row * 8 + i];
    CHECK(ms / 8 == doctest::Approx(1.0).epsilon(1e-4));
  }
  // Default eps is the dtype's machine epsilon (PyTorch's eps=None).
  CHECK(allclose(r, rms_norm(x, {8}, rms.weight, 1.1920928955078125e-07)));
  nn::RMSNorm rms2(8, 0.5);
  CHECK(allclose(rms2.forward(x), rms_norm(x, {8}, rms2.weight, 0.5)));
  CHECK_FALSE(allclose(rms2.forward(x), r));
  CHECK_THROWS_AS(ln.forward(randn({2, 7})), ShapeError);
}

TEST_CASE("Embedding, Dropout, activations, Flatten, losses") {
  manual_seed(5);
  nn::Embedding emb(10, 3);
  Tensor idx = tensor(std::vector<int64_t>{0, 9, 9, 2}, Shape{2, 2});
  Tensor e = emb.forward(idx);
  CHECK(e.sizes() == Shape{2, 2, 3});
  CHECK(equal(e[0][1], emb.weight[9]));
  CHECK_THROWS_AS(emb.forward(tensor(std::vector<int64_t>{10}, Shape{1})), IndexError);

  // Dropout: identity in eval; in training, about p zeroed and survivors scaled by 1/(1-p).
  Generator g1(9), g2(9);
  nn::Dropout d1(0.25, &g1), d2(0.25, &g2);
  Tensor x = ones({20000});
  d1.eval();
  CHECK(d1.forward(x).is_same(x));
  d1.train();
  Tensor y1 = d1.forward(x);
  const std::vector<double> v = y1.tolist();
  int64_t zeros_n = 0;
  for (double a : v) {
    if (a == 0) {
      ++zeros_n;
    } else {
      CHECK(a == doctest::Approx(1 / 0.75));
    }
  }
  CHECK(double(zeros_n) / 20000 == doctest::Approx(0.25).epsilon(0.06));
  CHECK(equal(y1, d2.forward(x)));  // same generator seed, same mask
  CHECK_THROWS_AS(nn::Dropout(1.5), ValueError);

  Tensor z = randn({2, 3, 4});
  CHECK(equal(nn::ReLU().forward(z), relu(z)));
  CHECK(equal(nn::GELU().forward(z), gelu(z)));
  CHECK(equal(nn::GELU("tanh").forward(z), gelu(z, "tanh")));
  CHECK(equal(nn::SiLU().forward(z), silu(z)));
  CHECK(equal(nn::Tanh().forward(z), tanh(z)));
  CHECK(equal(nn::Sigmoid().forward(z), sigmoid(z)));
  CHECK(nn::Identity().forward(z).is_same(z));
  CHECK(nn::Flatten().forward(z).sizes() == Shape{2, 12});
  CHECK(nn::Flatten(0, 1).forward(z).sizes() == Shape{6, 4});
  CHECK_THROWS_AS(nn::GELU("fast"), ValueError);

  Tensor logits = randn({4, 5});
  Tensor target = tensor(std::vector<int64_t>{1, 0, 4, 2}, Shape{4});
  CHECK(allclose(nn::CrossEntropyLoss()(logits, target), cross_entropy(logits, target)));
  CHECK(allclose(nn::CrossEntropyLoss(-100, Reduction::Sum, 0.1)(logits, target),
                 cross_entropy(logits, target, -100, Reduction::Sum, 0.1)));
  Tensor lp = log_softmax(logits, 1);
  CHECK(allclose(nn::NLLLoss()(lp, target), nll_loss(lp, target)));
  Tensor t2 = randn({4, 5});
  CHECK(allclose(nn::MSELoss()(logits, t2), mse_loss(logits, t2)));
  Tensor t3 = rand({4, 5});
  CHECK(
      allclose(nn::BCEWithLogitsLoss()(logits, t3), binary_cross_entropy_with_logits(logits, t3)));
}

namespace {

// Causal self-attention in double, with loops: x (T, C) for one sequence.
std::vector<double> attention_ref(const std::vector<double>& x, int64_t T, int64_t C, int64_t H,
                                  const std::vector<double>& wqkv, const std::vector<double>& bqkv,
                                  const std::vector<double>& wp, const std::vector<double>& bp) {
  const int64_t D = C / H;
  std::vector<double> qkv(size_t(T * 3 * C));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < 3 * C; ++o) {
      double s = bqkv[size_t(o)];
      for (int64_t i = 0; i < C; ++i) s += x[size_t(t * C + i)] * wqkv[size_t(o * C + i)];
      qkv[size_t(t * 3 * C + o)] = s;
    }
  }
  std::vector<double> y(size_t(T * C), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> w(size_t(t + 1));
      double mx = -1e300;
      for (int64_t u = 0; u <= t; ++u) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) {
          s += qkv[size_t(t * 3 * C + h * D + d)] * qkv[size_t(u * 3 * C + C + h * D + d)];
        }
        w[size_t(u)] = s / std::sqrt(double(D));
        mx = std::max(mx, w[size_t(u)]);
      }
      double z = 0;
      for (auto& a : w) z += (a = std::exp(a - mx));
      for (int64_t d = 0; d < D; ++d) {
        double s = 0;
        for (int64_t u = 0; u <= t; ++u)
          s += w[size_t(u)] / z * qkv[size_t(u * 3 * C + 2 * C + h * D + d)];
        y[size_t(t * C + h * D + d)] = s;
      }
    }
  }
  std::vector<double> out(size_t(T * C));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < C; ++o) {
      double s = bp[size_t(o)];
      for (int64_t i = 0; i < C; ++i) s += y[size_t(t * C + i)] * wp[size_t(o * C + i)];
      out[size_t(t * C + o)] = s;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("CausalSelfAttention: shape, float64 reference, causality, gradients") {
  manual_seed(8);
  const int64_t B = 2, T = 5, C = 8, H = 2;
  nn::CausalSelfAttention attn(C, H);
  attn.to(kFloat64);
  CHECK(attn.named_parameters().size() == 4);  // qkv.weight/bias, proj.weight/bias
  CHECK(attn.parameter("qkv.weight").sizes() == Shape{3 * C, C});
  Tensor x = randn({B, T, C}, kFloat64);
  Tensor y = attn.forward(x);  // (B, T, C)
  CHECK(y.sizes() == Shape{B, T, C});

  const std::vector<double> xv = x.tolist(), yv = y.tolist();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> xb(xv.begin() + b * T * C, xv.begin() + (b + 1) * T * C);
    const std::vector<double> ref =
        attention_ref(xb, T, C, H, attn.qkv->weight.tolist(), attn.qkv->bias.tolist(),
                      attn.proj->weight.tolist(), attn.proj->bias.tolist());
    for (int64_t i = 0; i < T * C; ++i) {
      CHECK(yv[size_t(b * T * C + i)] == doctest::Approx(ref[size_t(i)]).epsilon(1e-10));
    }
  }

  // Changing token t0 leaves outputs before t0 exactly unchanged and changes t0 onward.
  const int64_t t0 = 3;
  Tensor x2 = x.clone();
  {
    NoGradGuard ng;
    x2.select(1, t0).add_(ones({B, C}, kFloat64));
  }
  const std::vector<double> y2 = attn.forward(x2).tolist();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      bool same = true;
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = size_t((b * T + t) * C + c);
        same = same && yv[i] == y2[i];
      }
      INFO("b " << b << " t " << t);
      CHECK(same == (t < t0));
    }
  }

  // Gradients reach every parameter and the input; the input gradient at t is zero for losses
  // that only read earlier positions.
  Tensor xg = x.clone().requires_grad_();
  attn.forward(xg).narrow(1, 0, 2).sum().backward();
  for (const auto& [n, p] : attn.named_parameters()) {
    INFO(n);
    CHECK(p.grad().defined());
  }
  const std::vector<double> gx = xg.grad().tolist();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 2; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) CHECK(gx[size_t((b * T + t) * C + c)] == 0.0);
    }
  }
  CHECK(error_of([&] {
          attn.forward(randn({2, 5, 6}, kFloat64));
        }).find("[CausalSelfAttention] expected input (B, T, 8), got (2, 5, 6)") == 0);
  CHECK_THROWS_AS(nn::CausalSelfAttention(10, 3), ValueError);
  // Works with a sequence length different from the first call (the mask is rebuilt).
  CHECK(attn.forward(randn({1, 2, C}, kFloat64)).sizes() == Shape{1, 2, C});
}

TEST_CASE("Conv2d, MaxPool2d, AvgPool2d and the cnn workload model") {
  manual_seed(13);
  nn::Conv2d conv(3, 8, 3, 1, 1);
  CHECK(conv.weight.sizes() == Shape{8, 3, 3, 3});
  // PyTorch default init: bound 1/sqrt(fan_in), fan_in = 3 * 3 * 3.
  const double bound = 1.0 / std::sqrt(27.0);
  for (double v : conv.weight.tolist()) CHECK(std::abs(v) <= bound);
  for (double v : conv.bias.tolist()) CHECK(std::abs(v) <= bound);
  Tensor x = randn({2, 3, 6, 6});
  CHECK(allclose(conv.forward(x), conv2d(x, conv.weight, conv.bias, {1, 1}, {1, 1})));
  nn::Conv2d strided(3, 4, {3, 2}, 2, 0, 1, 1, false);
  CHECK(strided.forward(x).sizes() == Shape{2, 4, 2, 3});
  CHECK_FALSE(strided.bias.defined());
  nn::Conv2d grouped(4, 8, 1, 1, 0, 1, 2);
  CHECK(grouped.weight.sizes() == Shape{8, 2, 1, 1});
  CHECK(error_of([&] {
          conv.forward(randn({2, 4, 6, 6}));
        }).find("[Conv2d] expected input (N, 3, H, W), got (2, 4, 6, 6)") == 0);
  CHECK_THROWS_AS(nn::Conv2d(3, 8, 3, 1, 0, 1, 2), ValueError);
  CHECK_THROWS_AS(nn::Conv2d(3, 8, 0), ValueError);
  CHECK(error_of([&] {
          nn::Conv2d(3, 8, 3, {1, 0});
        }).find("[Conv2d] stride must be >= 1, got (1, 0)") == 0);

  nn::MaxPool2d mp(2);
  CHECK(equal(mp.forward(x), max_pool2d(x, {2, 2}, {2, 2})));
  nn::AvgPool2d ap(3, 1, 1, false);
  CHECK(allclose(ap.forward(x), avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false)));
  CHECK(ap.forward(x).sizes() == x.sizes());
  CHECK(mp.repr() ==
        "MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1), "
        "ceil_mode=false)");

  // The `cnn` workload of WORKLOADS.md.
  auto cnn = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(3136, 128),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(128, 10));
  CHECK(cnn->num_parameters() == 320 + 18496 + 401536 + 1290);
  Tensor img = rand({2, 1, 28, 28});
  Tensor logits = cnn->forward(img);
  CHECK(logits.sizes() == Shape{2, 10});
  cross_entropy(logits, tensor(std::vector<int64_t>{3, 7}, Shape{2})).backward();
  for (const auto& [n, p] : cnn->named_parameters()) {
    INFO(n);
    CHECK(p.grad().defined());
  }
}
