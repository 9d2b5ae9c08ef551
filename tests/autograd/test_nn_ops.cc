// nn / index / join op families: every fused kernel against a composition of simple framework
// ops (f32 and f64, values and gradients), index kernels against naive loops, and one error test
// per misuse (type, message names the op and prints the shapes).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include "accel.h"
#include "core/dispatch.h"  // StubCallRecorder
#include "core/sharded_random.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::check_close;
using accel::test::check_error;
using accel::test::leaves;
using accel::test::max_abs_diff;

namespace {

Generator& gen() {
  static Generator g(424242);
  return g;
}

Tensor rn(const Shape& s, DType dt = kFloat32) { return randn(s, TensorOptions(dt), &gen()); }
Tensor ints(int64_t hi, const Shape& s) { return randint(0, hi, s, TensorOptions(kInt64), &gen()); }

double rtol_for(DType dt) { return dt == kFloat64 ? 1e-10 : 2e-5; }
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : 2e-6; }

// Runs fused and reference on copies of the same inputs; compares outputs and input gradients.
void compare(const std::function<Tensor(const std::vector<Tensor>&)>& fused,
             const std::function<Tensor(const std::vector<Tensor>&)>& reference,
             const std::vector<Tensor>& inputs, double rtol, double atol) {
  std::vector<Tensor> a = leaves(inputs), b = leaves(inputs);
  Tensor ya = fused(a), yb = reference(b);
  check_close(ya, yb, rtol, atol);
  Tensor up = randn(ya.sizes(), TensorOptions(ya.dtype()), &gen());
  std::vector<Tensor> ga = autograd::grad({ya}, a, {up});
  std::vector<Tensor> gb = autograd::grad({yb}, b, {up});
  for (size_t i = 0; i < ga.size(); ++i) {
    INFO("gradient of input ", i);
    check_close(ga[i], gb[i], rtol * 10, atol * 10);
  }
}

// ---- reference compositions of simple ops ----
Tensor ref_softmax(const Tensor& x, int64_t d) {
  Tensor e = exp(sub(x, amax(x.detach(), {d}, true)));
  return div(e, sum(e, {d}, true));
}
Tensor ref_log_softmax(const Tensor& x, int64_t d) {
  Tensor z = sub(x, amax(x.detach(), {d}, true));
  return sub(z, log(sum(exp(z), {d}, true)));
}
Tensor ref_layer_norm(const Tensor& x, int64_t k, const Tensor& w, const Tensor& b, double eps) {
  Shape dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  Tensor m = mean(x, dims, true);
  Tensor c = sub(x, m);
  Tensor v = mean(mul(c, c), dims, true);
  Tensor y = mul(c, rsqrt(add(v, eps)));
  if (w.defined()) y = mul(y, w);
  if (b.defined()) y = add(y, b);
  return y;
}
Tensor ref_rms_norm(const Tensor& x, const Tensor& w, double eps) {
  Tensor y = mul(x, rsqrt(add(mean(mul(x, x), {-1}, true), eps)));
  return w.defined() ? mul(y, w) : y;
}
// Cross-entropy from log_softmax composition + gather, ignored rows masked, mean over valid rows.
Tensor ref_cross_entropy(const Tensor& x, const Tensor& t, int64_t ignore, Reduction r, double ls) {
  Tensor logp = ref_log_softmax(x, 1);
  Tensor valid = ne(t, ignore);
  Tensor safe_t = where(valid, t, tensor(std::vector<int64_t>{0}, {}));
  Tensor nll = neg(gather(logp, 1, safe_t.unsqueeze(1)).squeeze(1));
  Tensor l = nll;
  if (ls > 0) l = add(mul(nll, 1.0 - ls), mul(neg(mean(logp, {1})), ls));
  l = mul(l, valid.to(x.dtype()));
  if (r == Reduction::None) return l;
  if (r == Reduction::Sum) return sum(l);
  return div(sum(l), sum(valid.to(x.dtype())));
}

}  // namespace

// ======================= softmax =======================

TEST_CASE("softmax / log_softmax match the composition, every dim, f32 and f64") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = rn({2, 3, 5, 7}, dt);
    for (int64_t d : {3, 2, 1, 0, -1}) {
      INFO("dtype ", dt, " dim ", d);
      const int64_t dw = d < 0 ? d + 4 : d;
      compare([d](const std::vector<Tensor>& v) { return softmax(v[0], d); },
              [dw](const std::vector<Tensor>& v) { return ref_softmax(v[0], dw); }, {x},
              rtol_for(dt), atol_for(dt));
      compare([d](const std::vector<Tensor>& v) { return log_softmax(v[0], d); },
              [dw](const std::vector<Tensor>& v) { return ref_log_softmax(v[0], dw); }, {x},
              rtol_for(dt), atol_for(dt) * 4);
    }
  }
}

TEST_CASE("softmax: attention-sized rows with a causal -inf mask, parallel path") {
  // (B, H, T, T) rows as in the gpt workload (smaller batch): masked entries are exactly 0.
  const int64_t t = 128;
  Tensor x = rn({4, 2, t, t});
  Tensor mask = logical_not(tril(ones({t, t}, kBool)));
  Tensor xm = masked_fill(x, mask, -INFINITY);
  Tensor y = softmax(xm, -1);
  check_close(y, ref_softmax(xm, 3), 2e-5, 2e-7);
  Tensor top = y.select(0, 0).select(0, 0);
  CHECK(top.select(0, 0).select(0, 1).item() == 0.0);
  CHECK(top.select(0, 0).select(0, 0).item() == doctest::Approx(1.0));
  check_close(sum(y, {-1}), ones({4, 2, t}), 1e-5, 1e-5);
  compare(
      [&](const std::vector<Tensor>& v) { return softmax(masked_fill(v[0], mask, -INFINITY), -1); },
      [&](const std::vector<Tensor>& v) {
        return ref_softmax(masked_fill(v[0], mask, -INFINITY), 3);
      },
      {x}, 2e-5, 2e-7);
  Tensor ls = log_softmax(xm, -1);
  CHECK(std::isinf(ls.select(0, 0).select(0, 0).select(0, 0).select(0, 5).item()));
}

TEST_CASE("softmax: numerically stable for large logits, NaN propagates, non-contiguous input") {
  Tensor big = tensor({1000.f, 1001.f, 999.f});
  std::vector<double> y = softmax(big, 0).tolist();
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), s = 1 + e1 + e2;
  CHECK(y[0] == doctest::Approx(e1 / s));
  CHECK(y[1] == doctest::Approx(1 / s));
  CHECK(log_softmax(tensor({-1000.f, 0.f}), 0).tolist()[0] == doctest::Approx(-1000.0));
  CHECK(std::isnan(softmax(tensor({1.f, NAN, 2.f}), 0).tolist()[0]));
  Tensor x = rn({6, 5});
  check_close(softmax(x.t(), 1), ref_softmax(x.t(), 1), 2e-5, 2e-7);
  check_close(softmax(scalar_tensor(3.0), 0), scalar_tensor(1.0), 0, 0);
  // Large rows: exp_f32 against std::exp across a wide range.
  Tensor wide = mul(rn({3, 1000}), 30.0);
  check_close(softmax(wide, 1), softmax(wide.to(kFloat64), 1), 1e-5, 1e-7);
}

TEST_CASE("tanh and gelu(tanh) in float32 match float64 over a wide range (vectorised tanh)") {
  // 80001 points on [-20, 20] (both branches of tanh_f32 and the switch at 0.4), tiny values,
  // signed zeros, infinities and NaN.
  std::vector<double> v;
  for (int i = -40000; i <= 40000; ++i) v.push_back(i * 5e-4);
  for (double t : {1e-30, -1e-20, 1e-8, -3e-4, 0.39999, 0.4, 0.40001, 44.0, 90.0, -1e4}) {
    v.push_back(t);
  }
  const Tensor x64 = tensor(v, {int64_t(v.size())});
  const Tensor x32 = x64.to(kFloat32);
  const Tensor xr = x32.to(kFloat64);  // the float inputs, exactly
  const Tensor t32 = tanh(x32).to(kFloat64), t64 = tanh(xr);
  // |error| <= 4e-7 |tanh| + 1e-37: a few ulps everywhere, relative near 0.
  CHECK_MESSAGE(allclose(t32, t64, 4e-7, 1e-37), "max |diff| = ", max_abs_diff(t32, t64));
  const Tensor g32 = gelu(x32, "tanh").to(kFloat64), g64 = gelu(xr, "tanh");
  CHECK_MESSAGE(allclose(g32, g64, 1e-6, 2e-7), "max |diff| = ", max_abs_diff(g32, g64));
  const Tensor special = tensor(std::vector<double>{0.0, -0.0, INFINITY, -INFINITY, NAN}, {5});
  const Tensor s = tanh(special.to(kFloat32));
  CHECK(s.index({0}).item<float>() == 0.0f);
  CHECK(std::signbit(s.index({1}).item<float>()));
  CHECK(s.index({2}).item<float>() == 1.0f);
  CHECK(s.index({3}).item<float>() == -1.0f);
  CHECK(std::isnan(s.index({4}).item<float>()));
  // The gradient runs the same tanh (GeluTanhGrad).
  const Tensor a32 = x32.detach().requires_grad_(), a64 = xr.detach().requires_grad_();
  sum(gelu(a32, "tanh")).backward();
  sum(gelu(a64, "tanh")).backward();
  const Tensor d32 = a32.grad().to(kFloat64);
  CHECK_MESSAGE(allclose(d32, a64.grad(), 1e-6, 1e-6),
                "max |diff| = ", max_abs_diff(d32, a64.grad()));
}

TEST_CASE("gelu (erf) and its gradient in float32 match float64 over a wide range") {
  // The float32 gradient shares one exp between Phi and phi (gelu_erf_grad_f32 in vec_math.h);
  // 40001 points on [-10, 10], both tails included.
  std::vector<double> v;
  for (int i = -20000; i <= 20000; ++i) v.push_back(i * 5e-4);
  for (double t : {1e-30, -1e-20, 1e-8, -3e-4, 13.0, -13.0, 90.0, -1e4}) v.push_back(t);
  const Tensor xr = tensor(v, {int64_t(v.size())}).to(kFloat32).to(kFloat64);  // float inputs
  const Tensor a32 = xr.to(kFloat32).requires_grad_(), a64 = xr.detach().requires_grad_();
  const Tensor y32 = gelu(a32), y64 = gelu(a64);
  // erf_f32's |error| <= 1.5e-7 (A & S 7.1.26) times |x| / 2: <= 7.5e-7 absolute on [-10, 10].
  CHECK_MESSAGE(allclose(y32.detach().to(kFloat64), y64.detach(), 1e-6, 1e-6),
                "max |diff| = ", max_abs_diff(y32.detach().to(kFloat64), y64.detach()));
  // Weighted sum: every element's gradient scaled differently, so a wrong term shows.
  const Tensor w = linspace(-1.5, 2.5, int64_t(v.size()), TensorOptions(kFloat64));
  sum(mul(y32, w.to(kFloat32))).backward();
  sum(mul(y64, w)).backward();
  const Tensor d32 = a32.grad().to(kFloat64);
  CHECK_MESSAGE(allclose(d32, a64.grad(), 1e-6, 1e-6),
                "max |diff| = ", max_abs_diff(d32, a64.grad()));
}

TEST_CASE("softmax: half and bfloat16 compute in float") {
  Tensor x = rn({4, 33});
  for (DType dt : {kFloat16, kBFloat16}) {
    Tensor y = softmax(x.to(dt), 1);
    CHECK(y.dtype() == dt);
    check_close(y.to(kFloat32), softmax(x.to(dt).to(kFloat32), 1), 1e-2, 1e-3);
    Tensor z = log_softmax(x.to(dt), 0);
    check_close(z.to(kFloat32), log_softmax(x.to(dt).to(kFloat32), 0), 2e-2, 2e-2);
  }
}

// ======================= normalisation =======================

TEST_CASE("layer_norm matches the composition (values, dx, dweight, dbias), f32 and f64") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    // 300 rows of 128: several partial-sum blocks and the parallel path.
    Tensor x = add(mul(rn({3, 100, 128}, dt), 2.0), 5.0);
    Tensor w = rn({128}, dt), b = rn({128}, dt);
    compare([](const std::vector<Tensor>& v) { return layer_norm(v[0], {128}, v[1], v[2]); },
            [](const std::vector<Tensor>& v) { return ref_layer_norm(v[0], 1, v[1], v[2], 1e-5); },
            {x, w, b}, rtol_for(dt) * 10, atol_for(dt) * 10);
    Tensor x2 = rn({4, 3, 5}, dt);
    compare(
        [](const std::vector<Tensor>& v) {
          return layer_norm(v[0], {3, 5}, Tensor(), Tensor(), 1e-3);
        },
        [](const std::vector<Tensor>& v) {
          return ref_layer_norm(v[0], 2, Tensor(), Tensor(), 1e-3);
        },
        {x2}, rtol_for(dt) * 10, atol_for(dt) * 10);
    Tensor w2 = rn({5}, dt);
    compare(
        [](const std::vector<Tensor>& v) { return layer_norm(v[0], {5}, v[1]); },
        [](const std::vector<Tensor>& v) { return ref_layer_norm(v[0], 1, v[1], Tensor(), 1e-5); },
        {x2, w2}, rtol_for(dt) * 10, atol_for(dt) * 10);
  }
}

TEST_CASE("layer_norm: non-contiguous input, only weight requiring grad, stable for large mean") {
  Tensor x = rn({16, 8});
  Tensor w = rn({16}).requires_grad_();
  Tensor y = layer_norm(x.t(), {16}, w);
  check_close(y, ref_layer_norm(x.t(), 1, w.detach(), Tensor(), 1e-5), 1e-5, 1e-5);
  y.sum().backward();
  check_close(w.grad(), sum(ref_layer_norm(x.t(), 1, Tensor(), Tensor(), 1e-5), {0}), 1e-4, 1e-5);
  // A row with mean 1e4 and unit spread: the two-pass variance keeps full precision.
  Tensor big = add(rn({2, 64}), 1e4);
  // (The input itself only resolves ~1e-3 at 1e4 in float32; a one-pass E[x^2] - E[x]^2 would be
  // off by whole units.)
  check_close(layer_norm(big, {64}), ref_layer_norm(big.to(kFloat64), 1, Tensor(), Tensor(), 1e-5),
              0, 1e-2);
}

TEST_CASE("rms_norm matches the composition, f32 and f64") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    Tensor x = rn({70, 96}, dt), w = rn({96}, dt);
    compare([](const std::vector<Tensor>& v) { return rms_norm(v[0], {96}, v[1], 1e-6); },
            [](const std::vector<Tensor>& v) { return ref_rms_norm(v[0], v[1], 1e-6); }, {x, w},
            rtol_for(dt) * 10, atol_for(dt) * 10);
    compare([](const std::vector<Tensor>& v) { return rms_norm(v[0], {96}); },
            [](const std::vector<Tensor>& v) { return ref_rms_norm(v[0], Tensor(), 1e-6); }, {x},
            rtol_for(dt) * 10, atol_for(dt) * 10);
  }
}

// ======================= losses =======================

TEST_CASE("cross_entropy matches log_softmax + gather: reductions, ignore_index, smoothing") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = mul(rn({300, 37}, dt), 3.0);
    Tensor t = ints(37, {300});
    // Every 7th row ignored.
    for (int64_t i = 0; i < 300; i += 7) t.select(0, i).fill_(-100);
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (double ls : {0.0, 0.1}) {
        INFO("dtype ", dt, " reduction ", int(r), " smoothing ", ls);
        compare(
            [&](const std::vector<Tensor>& v) { return cross_entropy(v[0], t, -100, r, ls); },
            [&](const std::vector<Tensor>& v) { return ref_cross_entropy(v[0], t, -100, r, ls); },
            {x}, rtol_for(dt) * 10, atol_for(dt) * 10);
      }
    }
  }
}

TEST_CASE("cross_entropy: gpt-sized (4096, 256), spatial (N, C, d), unbatched, int32 targets") {
  Tensor x = rn({4096, 256});
  Tensor t = ints(256, {4096});
  compare([&](const std::vector<Tensor>& v) { return cross_entropy(v[0], t); },
          [&](const std::vector<Tensor>& v) {
            return ref_cross_entropy(v[0], t, -100, Reduction::Mean, 0);
          },
          {x}, 2e-5, 1e-7);
  // (N, C, d1, d2) equals the permuted 2-D problem.
  Tensor xs = rn({2, 5, 3, 4});
  Tensor ts = ints(5, {2, 3, 4});
  Tensor flat = xs.permute({0, 2, 3, 1}).reshape({-1, 5});
  check_close(cross_entropy(xs, ts, -100, Reduction::None),
              cross_entropy(flat, ts.reshape({-1}), -100, Reduction::None).reshape({2, 3, 4}), 1e-6,
              1e-6);
  compare(
      [&](const std::vector<Tensor>& v) {
        return cross_entropy(v[0], ts, 1, Reduction::Mean, 0.05);
      },
      [&](const std::vector<Tensor>& v) {
        return ref_cross_entropy(v[0].permute({0, 2, 3, 1}).reshape({-1, 5}), ts.reshape({-1}), 1,
                                 Reduction::Mean, 0.05);
      },
      {xs}, 2e-5, 1e-6);
  Tensor one = rn({6});
  check_close(cross_entropy(one, tensor(std::vector<int64_t>{2}, {})),
              ref_cross_entropy(one.unsqueeze(0), tensor(std::vector<int64_t>{2}, {1}), -100,
                                Reduction::Mean, 0),
              1e-6, 1e-6);
  Tensor t32 = tensor(std::vector<int32_t>{1, 0, 2}, {3});
  Tensor x3 = rn({3, 3});
  check_close(cross_entropy(x3, t32), cross_entropy(x3, t32.to(kInt64)), 0, 0);
  // All rows ignored: mean is 0/0 (NaN), as in PyTorch; sum is 0.
  Tensor all_ign = full({3}, -100, kInt64);
  CHECK(std::isnan(cross_entropy(x3, all_ign).item()));
  CHECK(cross_entropy(x3, all_ign, -100, Reduction::Sum).item() == 0.0);
}

TEST_CASE("nll_loss matches gather, f32 and f64") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor lp = rn({50, 9}, dt);
    Tensor t = ints(9, {50});
    t.select(0, 3).fill_(4);
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      INFO("dtype ", dt, " reduction ", int(r));
      compare([&](const std::vector<Tensor>& v) { return nll_loss(v[0], t, 4, r); },
              [&](const std::vector<Tensor>& v) {
                Tensor valid = ne(t, 4).to(dt);
                Tensor l = mul(neg(gather(v[0], 1, t.unsqueeze(1)).squeeze(1)), valid);
                if (r == Reduction::None) return l;
                if (r == Reduction::Sum) return sum(l);
                return div(sum(l), sum(valid));
              },
              {lp}, rtol_for(dt), atol_for(dt));
    }
  }
  // cross_entropy == nll_loss(log_softmax).
  Tensor x = rn({20, 6});
  Tensor t = ints(6, {20});
  check_close(cross_entropy(x, t), nll_loss(log_softmax(x, 1), t), 1e-6, 1e-6);
}

TEST_CASE("mse_loss and binary_cross_entropy_with_logits") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor a = rn({7, 3}, dt), b = rn({7, 3}, dt);
    Tensor d = sub(a, b);
    check_close(mse_loss(a, b), mean(mul(d, d)), 1e-6, 1e-7);
    check_close(mse_loss(a, b, Reduction::Sum), sum(mul(d, d)), 1e-6, 1e-6);
    check_close(mse_loss(a, b, Reduction::None), mul(d, d), 1e-6, 1e-7);
    // Moderate logits: the naive formula is accurate there.
    Tensor x = rn({40}, dt), t = rand({40}, TensorOptions(dt), &gen());
    compare(
        [](const std::vector<Tensor>& v) { return binary_cross_entropy_with_logits(v[0], v[1]); },
        [](const std::vector<Tensor>& v) {
          Tensor s = sigmoid(v[0]);
          return mean(neg(add(mul(v[1], log(s)), mul(rsub(v[1], 1.0), log(rsub(s, 1.0))))));
        },
        {x, t}, rtol_for(dt) * 100, atol_for(dt) * 100);
  }
  // Extreme logits stay finite; the gradient at exactly 0 is sigmoid(0) - t.
  Tensor x = tensor({-200.f, 200.f, 0.f}).requires_grad_();
  Tensor t = tensor({1.f, 0.f, 0.25f});
  Tensor l = binary_cross_entropy_with_logits(x, t, Reduction::None);
  std::vector<double> lv = l.tolist();
  CHECK(lv[0] == doctest::Approx(200.0));
  CHECK(lv[1] == doctest::Approx(200.0));
  CHECK(lv[2] == doctest::Approx(std::log(2.0)));
  l.sum().backward();
  std::vector<double> g = x.grad().tolist();
  CHECK(g[0] == doctest::Approx(-1.0));
  CHECK(g[1] == doctest::Approx(1.0));
  CHECK(g[2] == doctest::Approx(0.25));
}

TEST_CASE("dropout: inverted scaling, seeded mask, eval / p = 0 / p = 1") {
  Tensor x = ones({200, 100}).requires_grad_();
  Generator g1(11), g2(11);
  Tensor a = dropout(x, 0.3, true, &g1);
  Tensor b = dropout(x, 0.3, true, &g2);
  CHECK(equal(a, b));
  std::vector<double> v = a.tolist();
  int64_t kept = 0;
  for (double e : v) {
    CHECK((e == 0.0 || std::abs(e - 1.0 / 0.7) < 1e-6));
    kept += e != 0.0;
  }
  const double frac = double(kept) / double(v.size());
  CHECK(frac == doctest::Approx(0.7).epsilon(0.03));
  // Different draws from the default generator differ.
  manual_seed(5);
  Tensor c = dropout(x, 0.3, true);
  Tensor d = dropout(x, 0.3, true);
  CHECK_FALSE(equal(c, d));
  manual_seed(5);
  CHECK(equal(dropout(x, 0.3, true), c));
  // Gradient is the same mask and scale.
  a.sum().backward();
  CHECK(equal(x.grad(), a.detach()));
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0, true).is_same(x));
  Tensor xn = tensor({1.f, NAN, INFINITY}).requires_grad_();
  Tensor z = dropout(xn, 1.0, true);
  CHECK(z.tolist() == std::vector<double>{0, 0, 0});
  z.sum().backward();
  CHECK(xn.grad().tolist() == std::vector<double>{0, 0, 0});
}

// Note [dropout mask]: counter-based, so a tensor that is part of a larger one (a tp rank's shard,
// core/sharded_random.h's region) draws its slice of the larger tensor's mask; no region: whole.
TEST_CASE("dropout in a sharded region draws its slice of the full tensor's mask") {
  const Tensor full = ones({2, 8, 6}, TensorOptions(kFloat64));
  manual_seed(3);
  const Tensor want = dropout(full, 0.4, true);
  const Tensor want1d = dropout1d(full, 0.4, true);  // planes (2, 8)
  manual_seed(3);
  const Tensor want_heads = dropout(ones({2, 4, 3, 3}, TensorOptions(kFloat64)), 0.4, true);
  for (int index = 0; index < 4; ++index) {
    ShardedRegion seq;  // (B, T, C) activations, this "rank" holding 2 of 8 positions
    seq.ways = 4;
    seq.index = index;
    seq.dim = 1;
    seq.ndim = 3;
    seq.length = 2;
    ShardedRegionGuard in_region(seq);
    manual_seed(3);
    CHECK(equal(dropout(ones({2, 2, 6}, TensorOptions(kFloat64)), 0.4, true),
                want.narrow(1, 2 * index, 2)));
    CHECK(equal(dropout1d(ones({2, 2, 6}, TensorOptions(kFloat64)), 0.4, true),
                want1d.narrow(1, 2 * index, 2)));
  }
  for (int index = 0; index < 2; ++index) {
    ShardedRegion features;  // the last dim: 3 packed blocks of 1 of each block's 2 columns
    features.ways = 2;
    features.index = index;
    features.length = 3;
    features.chunks = 3;
    features.heads = true;
    ShardedRegionGuard in_region(features);
    manual_seed(3);
    const Tensor mine = dropout(ones({2, 8, 3}, TensorOptions(kFloat64)), 0.4, true);
    CHECK(equal(mine, cat({want.narrow(2, index, 1), want.narrow(2, 2 + index, 1),
                           want.narrow(2, 4 + index, 1)},
                          2)));
    manual_seed(3);
    DrawSiteGuard weights(DrawSite::AttentionWeights);  // heads on dim 1: 2 of 4
    CHECK(equal(dropout(ones({2, 2, 3, 3}, TensorOptions(kFloat64)), 0.4, true),
                want_heads.narrow(1, 2 * index, 2)));
  }
  {  // shapes that do not fit: ValueError naming the op, the shape and the region's source
    ShardedRegion seq;
    seq.ways = 4;
    seq.dim = 1;
    seq.ndim = 3;
    seq.length = 2;
    seq.source = std::make_shared<const std::string>("tensor-parallel rowwise 'proj'");
    ShardedRegionGuard in_region(seq);
    manual_seed(3);
    check_error<ValueError>(
        [&] {
          dropout(ones({4, 6}), 0.4, true);
        },
        {"[dropout]", "(4, 6)", "tensor-parallel rowwise 'proj'",
         "2 of 8 along dim 1 of 3-D activations"});
    check_error<ValueError>(
        [&] {
          dropout2d(ones({2, 3, 2, 2}), 0.4, true);
        },
        {"[dropout2d]", "(2, 3, 2, 2)"});
    DrawSiteGuard weights(DrawSite::AttentionWeights);
    check_error<ValueError>(
        [&] {
          dropout(ones({2, 2, 2, 2}), 0.4, true);
        },
        {"[dropout]", "attention weights", "splits no heads"});
    // A refused draw takes nothing from the generator.
    Generator fresh(3);
    CHECK(default_generator().next_u64() == fresh.next_u64());
  }
  // Outside a region again: whole.
  manual_seed(3);
  CHECK(equal(dropout(full, 0.4, true), want));
}

// ======================= indexing =======================

TEST_CASE("embedding: gpt-sized lookups and backward accumulation against loops") {
  const int64_t vocab = 256, dm = 128;
  Tensor w = rn({vocab, dm}).requires_grad_();
  Tensor idx = ints(vocab, {32, 128});
  Tensor out = embedding(w, idx);
  CHECK(out.sizes() == Shape{32, 128, dm});
  std::vector<float> wv = w.detach().to_vector<float>(), ov = out.to_vector<float>();
  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  bool same = true;
  for (size_t i = 0; i < iv.size(); ++i)
    for (int64_t j = 0; j < dm; ++j)
      same = same && ov[i * dm + size_t(j)] == wv[size_t(iv[i] * dm + j)];
  CHECK(same);
  Tensor up = rn(out.sizes());
  out.backward(up);
  std::vector<double> ref(size_t(vocab * dm), 0.0);
  std::vector<float> uv = up.to_vector<float>();
  for (size_t i = 0; i < iv.size(); ++i)
    for (int64_t j = 0; j < dm; ++j) ref[size_t(iv[i] * dm + j)] += uv[i * dm + size_t(j)];
  check_close(w.grad(), tensor(ref, {vocab, dm}), 1e-5, 1e-5);
  // Same as index_select on the flattened indices.
  check_close(embedding(w.detach(), idx),
              index_select(w.detach(), 0, idx.reshape({-1})).reshape({32, 128, dm}), 0, 0);
}

TEST_CASE("index_select / index_add / gather / scatter_add against loops, f32 and f64") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    Tensor x = rn({5, 6, 7}, dt);
    Tensor i1 = tensor(std::vector<int64_t>{4, 0, 4, 2}, {4});
    Tensor s = index_select(x, 1, i1);
    CHECK(s.sizes() == Shape{5, 4, 7});
    CHECK(equal(s.select(1, 2), x.select(1, 4)));
    CHECK(equal(s.select(1, 1), x.select(1, 0)));
    // index_add with duplicates: x + src summed into rows 4 and 0 and 2.
    Tensor src = rn({5, 4, 7}, dt);
    Tensor ia = index_add(x, 1, i1, src);
    check_close(ia.select(1, 4), add(x.select(1, 4), add(src.select(1, 0), src.select(1, 2))), 1e-6,
                1e-6);
    check_close(ia.select(1, 3), x.select(1, 3), 0, 0);
    check_close(ia.select(1, 2), add(x.select(1, 2), src.select(1, 3)), 1e-6, 1e-6);
    // gather along each dim against a loop over a 2-D case.
    Tensor x2 = rn({4, 5}, dt);
    Tensor gi = tensor(std::vector<int64_t>{1, 4, 0, 0, 3, 2}, {3, 2});
    std::vector<double> xv = x2.tolist(), gv = gather(x2, 1, gi).tolist();
    std::vector<int64_t> iv = gi.to_vector<int64_t>();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 2; ++c)
        CHECK(gv[size_t(r * 2 + c)] == xv[size_t(r * 5 + iv[size_t(r * 2 + c)])]);
    Tensor gi0 = tensor(std::vector<int64_t>{1, 3, 0, 0, 3, 2}, {3, 2});
    std::vector<int64_t> iv0 = gi0.to_vector<int64_t>();
    std::vector<double> g0 = gather(x2, 0, gi0).tolist();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 2; ++c)
        CHECK(g0[size_t(r * 2 + c)] == xv[size_t(iv0[size_t(r * 2 + c)] * 5 + c)]);
    // Non-contiguous input.
    CHECK(equal(gather(x2.t(), 0, gi), gather(x2.t().contiguous(), 0, gi)));
  }
}

TEST_CASE("scatter_add: large parallel paths (dim 0 and dim 1) against a loop") {
  for (int64_t dim : {0, 1}) {
    INFO("dim ", dim);
    const int64_t r = 300, c = 200;
    Tensor x = rn({r, c}, kFloat64);
    Tensor src = rn({r, c}, kFloat64);
    Tensor idx = ints(dim == 0 ? r : c, {r, c});
    Tensor out = scatter_add(x, dim, idx, src);
    std::vector<double> ref = x.tolist(), sv = src.tolist();
    std::vector<int64_t> iv = idx.to_vector<int64_t>();
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const int64_t k = iv[size_t(i * c + j)];
        ref[size_t(dim == 0 ? k * c + j : i * c + k)] += sv[size_t(i * c + j)];
      }
    check_close(out, tensor(ref, {r, c}), 1e-12, 1e-12);
    // gather is scatter_add's adjoint: <scatter_add(0, idx, s), y> == <s, gather(y, idx)>.
    Tensor y = rn({r, c}, kFloat64);
    const double lhs = sum(mul(scatter_add(zeros({r, c}, kFloat64), dim, idx, src), y)).item();
    const double rhs = sum(mul(src, gather(y, dim, idx))).item();
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-10));
  }
  // index_add's parallel path over destination rows (few slices, many indices).
  Tensor base = zeros({64, 512}, kFloat64);
  Tensor ii = ints(64, {2000});
  Tensor sa = rn({2000, 512}, kFloat64);
  Tensor got = index_add(base, 0, ii, sa);
  std::vector<double> ref(64 * 512, 0.0), sv = sa.tolist();
  std::vector<int64_t> iv = ii.to_vector<int64_t>();
  for (size_t k = 0; k < iv.size(); ++k)
    for (size_t j = 0; j < 512; ++j) ref[size_t(iv[k]) * 512 + j] += sv[k * 512 + j];
  check_close(got, tensor(ref, {64, 512}), 1e-12, 1e-12);
}

// ======================= joining =======================

TEST_CASE("cat / stack / split / chunk / tril / triu values") {
  Tensor a = rn({2, 3}), b = rn({4, 3});
  Tensor c = cat({a, b}, 0);
  CHECK(c.sizes() == Shape{6, 3});
  CHECK(equal(c.narrow(0, 0, 2), a));
  CHECK(equal(c.narrow(0, 2, 4), b));
  Tensor d = cat({a.t(), b.t()}, 1);  // non-contiguous inputs
  CHECK(equal(d, c.t()));
  CHECK(equal(cat({a, zeros({0, 3})}, 0), a));
  Tensor s = stack({a, a, a}, 2);
  CHECK(s.sizes() == Shape{2, 3, 3});
  CHECK(equal(s.select(2, 1), a));
  CHECK(stack({a, b.narrow(0, 0, 2)}, 0).sizes() == Shape{2, 2, 3});
  // split / chunk are views sharing storage.
  Tensor x = arange(10).to(kFloat32).reshape({5, 2});
  std::vector<Tensor> p = split(x, 2, 0);
  REQUIRE(p.size() == 3);
  CHECK(p[2].sizes() == Shape{1, 2});
  CHECK(p[1].data_ptr() == static_cast<char*>(x.data_ptr()) + 4 * sizeof(float));
  std::vector<Tensor> q = split(x, std::vector<int64_t>{1, 4}, 0);
  CHECK(q[1].sizes() == Shape{4, 2});
  CHECK(chunk(x, 2, 0).size() == 2);
  CHECK(chunk(x, 2, 0)[1].sizes() == Shape{2, 2});
  CHECK(chunk(x, 4, 1).size() == 2);  // ceil(2 / 4) = 1 per piece, two pieces
  CHECK(equal(cat(split(x, 3, 1 - 1), 0), x));
  // tril / triu with offsets against the index rule.
  Tensor m = add(rn({2, 4, 5}), 10.0);
  for (int64_t k : {-2, 0, 1, 7}) {
    std::vector<double> lo = tril(m, k).tolist(), up = triu(m, k).tolist(), mv = m.tolist();
    for (int64_t bi = 0; bi < 2; ++bi)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          const size_t e = size_t((bi * 4 + i) * 5 + j);
          CHECK(lo[e] == (j - i <= k ? mv[e] : 0.0));
          CHECK(up[e] == (j - i >= k ? mv[e] : 0.0));
        }
  }
  CHECK(equal(tril(ones({3, 3}, kBool)).to(kInt64).sum(), scalar_tensor(int64_t(6), kInt64)));
}

TEST_CASE("cat / stack backward are slices of the gradient") {
  Tensor a = rn({2, 3}).requires_grad_(), b = rn({2, 1}).requires_grad_();
  Tensor c = cat({a, b}, 1);
  Tensor up = rn({2, 4});
  c.backward(up);
  CHECK(equal(a.grad(), up.narrow(1, 0, 3)));
  CHECK(equal(b.grad(), up.narrow(1, 3, 1)));
  Tensor u = rn({3}).requires_grad_(), v = rn({3});  // v does not require grad
  Tensor s = stack({u, v}, 0);
  Tensor up2 = rn({2, 3});
  s.backward(up2);
  CHECK(equal(u.grad(), up2.select(0, 0)));
  CHECK_FALSE(v.grad().defined());
}

TEST_CASE("half and bfloat16: norms, losses, indexing and joining run in float") {
  Tensor x = rn({6, 40}), w = rn({40}), b = rn({40});
  Tensor t = ints(40, {6});
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO("dtype ", dt);
    const double tol = dt == kFloat16 ? 1e-2 : 5e-2;
    Tensor xh = x.to(dt), wh = w.to(dt), bh = b.to(dt);
    Tensor y = layer_norm(xh, {40}, wh, bh);
    CHECK(y.dtype() == dt);
    check_close(y.to(kFloat32), layer_norm(xh.to(kFloat32), {40}, wh.to(kFloat32), bh.to(kFloat32)),
                tol, tol);
    check_close(rms_norm(xh, {40}, wh).to(kFloat32),
                rms_norm(xh.to(kFloat32), {40}, wh.to(kFloat32)), tol, tol);
    Tensor xr = xh.detach().requires_grad_();
    Tensor l = cross_entropy(xr, t);
    check_close(l.to(kFloat32), cross_entropy(xh.to(kFloat32), t), tol, tol);
    l.backward();
    Tensor xf = xh.to(kFloat32).requires_grad_();
    cross_entropy(xf, t).backward();
    check_close(xr.grad().to(kFloat32), xf.grad(), tol, 1e-3);
    Tensor ti = ints(6, {3, 2});
    CHECK(equal(embedding(xh, ti).to(kFloat32), embedding(xh.to(kFloat32), ti)));
    CHECK(equal(cat({xh, xh}, 0).to(kFloat32), cat({xh.to(kFloat32), xh.to(kFloat32)}, 0)));
    CHECK(equal(tril(xh).to(kFloat32), tril(xh.to(kFloat32))));
  }
}

// ======================= errors =======================

TEST_CASE("errors: softmax and normalisation") {
  check_error<DTypeError>([] { softmax(arange(4), 0); }, {"[softmax]", "(4,)"});
  check_error<IndexError>([] { softmax(ones({2, 3}), 2); }, {"[softmax]"});
  check_error<IndexError>([] { log_softmax(ones({2, 3}), -3); }, {"[log_softmax]"});
  check_error<ShapeError>(
      [] {
        layer_norm(ones({2, 3}), {4});
      },
      {"[layer_norm]", "(2, 3)", "(4,)"});
  check_error<ShapeError>(
      [] {
        layer_norm(ones({3}), {2, 3});
      },
      {"[layer_norm]", "(3,)", "(2, 3)"});
  check_error<ShapeError>([] { layer_norm(ones({2, 3}), {}); }, {"[layer_norm]", "(2, 3)"});
  check_error<ShapeError>(
      [] {
        layer_norm(ones({2, 3}), {3}, ones({2}));
      },
      {"[layer_norm]", "weight", "(2,)", "(3,)"});
  check_error<ShapeError>(
      [] {
        layer_norm(ones({2, 3}), {3}, ones({3}), ones({3, 1}));
      },
      {"[layer_norm]", "bias", "(3, 1)"});
  check_error<DTypeError>(
      [] {
        layer_norm(ones({2, 3}), {3}, ones({3}, kFloat64));
      },
      {"[layer_norm]", "weight", "float64", "(3,)"});
  check_error<DTypeError>(
      [] {
        layer_norm(arange(6).reshape({2, 3}), {3});
      },
      {"[layer_norm]", "(2, 3)"});
  check_error<ShapeError>([] { rms_norm(ones({2, 3}), {2}); }, {"[rms_norm]", "(2, 3)", "(2,)"});
  check_error<ShapeError>(
      [] {
        rms_norm(ones({2, 3}), {3}, ones({4}));
      },
      {"[rms_norm]", "weight", "(4,)"});
}

TEST_CASE("errors: losses") {
  Tensor x = ones({4, 5});
  Tensor t = tensor(std::vector<int64_t>{0, 1, 2, 3}, {4});
  check_error<IndexError>(
      [&] {
        cross_entropy(x, tensor(std::vector<int64_t>{0, 5, 1, 1}, {4}));
      },
      {"[cross_entropy]", "target 5", "5 classes"});
  check_error<IndexError>(
      [&] {
        cross_entropy(x, tensor(std::vector<int64_t>{0, -1, 1, 1}, {4}));
      },
      {"[cross_entropy]", "target -1"});
  check_error<ShapeError>([&] { cross_entropy(x, ones({3}, kInt64)); },
                          {"[cross_entropy]", "(4, 5)", "(3,)", "(4,)"});
  check_error<ShapeError>(
      [&] {
        cross_entropy(ones({2, 3, 4}), ones({2, 3}, kInt64));
      },
      {"[cross_entropy]", "(2, 3, 4)", "(2, 4)"});
  check_error<ShapeError>([&] { cross_entropy(ones({3}), t); },
                          {"[cross_entropy]", "(3,)", "0-dim"});
  check_error<ShapeError>([&] { cross_entropy(ones({}), t); }, {"[cross_entropy]", "()"});
  check_error<ShapeError>(
      [&] {
        cross_entropy(ones({4, 0}), t);
      },
      {"[cross_entropy]", "(4, 0)", "no classes"});
  check_error<DTypeError>([&] { cross_entropy(x, ones({4})); },
                          {"[cross_entropy]", "target", "float32", "(4,)"});
  check_error<DTypeError>(
      [&] {
        cross_entropy(ones({4, 5}, kInt64), t);
      },
      {"[cross_entropy]", "(4, 5)"});
  check_error<ValueError>([&] { cross_entropy(x, t, -100, Reduction::Mean, 1.5); },
                          {"[cross_entropy]", "1.5"});
  check_error<IndexError>(
      [&] {
        nll_loss(x, tensor(std::vector<int64_t>{0, 1, 9, 1}, {4}));
      },
      {"[nll_loss]", "target 9", "5 classes"});
  check_error<ShapeError>([&] { nll_loss(x, ones({5}, kInt64)); },
                          {"[nll_loss]", "(4, 5)", "(5,)"});
  check_error<ShapeError>(  // (4, 1) against (4) broadcasts, as torch (with its warning)
      [&] {
        mse_loss(ones({4, 2}), ones({3}));
      },
      {"[mse_loss]", "(4, 2)", "(3,)"});
  check_error<DTypeError>([&] { mse_loss(arange(4), ones({4})); }, {"[mse_loss]"});
  check_error<ShapeError>(
      [&] {
        binary_cross_entropy_with_logits(ones({3}), ones({3, 1}));
      },
      {"[binary_cross_entropy_with_logits]", "(3, 1)", "(3,)"});
  check_error<DTypeError>([&] { binary_cross_entropy_with_logits(ones({3}), arange(3)); },
                          {"[binary_cross_entropy_with_logits]", "int64"});
  check_error<ValueError>([&] { dropout(x, 1.5, true); }, {"[dropout]", "1.5", "(4, 5)"});
  check_error<ValueError>([&] { dropout(x, -0.1, false); }, {"[dropout]"});
  check_error<DTypeError>([&] { dropout(arange(4), 0.5, true); }, {"[dropout]", "(4,)"});
}

TEST_CASE("errors: indexing") {
  Tensor w = ones({10, 4});
  check_error<IndexError>(
      [&] {
        embedding(w, tensor(std::vector<int64_t>{1, 10}, {2}));
      },
      {"[embedding]", "index 10", "size 10", "(10, 4)"});
  check_error<IndexError>([&] { embedding(w, tensor(std::vector<int64_t>{-1}, {1})); },
                          {"[embedding]", "index -1"});
  check_error<DTypeError>([&] { embedding(w, ones({2})); }, {"[embedding]", "float32", "(2,)"});
  check_error<ShapeError>([&] { embedding(ones({10}), tensor(std::vector<int64_t>{1}, {1})); },
                          {"[embedding]", "(10,)"});
  Tensor x = ones({3, 4});
  Tensor i2 = tensor(std::vector<int64_t>{0, 1}, {2});
  check_error<IndexError>([&] { index_select(x, 0, tensor(std::vector<int64_t>{3}, {1})); },
                          {"[index_select]", "index 3", "size 3", "(3, 4)"});
  check_error<IndexError>([&] { index_select(x, 2, i2); }, {"[index_select]"});
  check_error<ShapeError>(
      [&] {
        index_select(x, 0, ones({2, 1}, kInt64));
      },
      {"[index_select]", "(2, 1)"});
  check_error<DTypeError>([&] { index_select(x, 0, ones({2})); }, {"[index_select]", "float32"});
  check_error<ShapeError>(
      [&] {
        index_add(x, 0, i2, ones({3, 4}));
      },
      {"[index_add]", "(3, 4)", "(2, 4)"});
  check_error<DTypeError>(
      [&] {
        index_add(x, 0, i2, ones({2, 4}, kFloat64));
      },
      {"[index_add]", "float64"});
  check_error<IndexError>(
      [&] {
        index_add(x, 1, tensor(std::vector<int64_t>{4, 0}, {2}), ones({3, 2}));
      },
      {"[index_add]", "index 4", "size 4"});
  check_error<ShapeError>([&] { gather(x, 1, ones({3}, kInt64)); }, {"[gather]", "(3,)", "(3, 4)"});
  check_error<ShapeError>(
      [&] {
        gather(x, 1, zeros({4, 2}, kInt64));
      },
      {"[gather]", "(4, 2)", "(3, 4)"});
  check_error<IndexError>(
      [&] {
        gather(x, 1, full({3, 2}, 4, kInt64));
      },
      {"[gather]", "index 4", "size 4"});
  check_error<IndexError>(
      [&] {
        gather(x, 0, full({1, 1}, -1, kInt64));
      },
      {"[gather]", "index -1"});
  check_error<IndexError>([&] { gather(x, -3, zeros({1, 1}, kInt64)); }, {"[gather]"});
  check_error<ShapeError>(
      [&] {
        scatter_add(x, 0, zeros({2, 3}, kInt64), ones({1, 3}));
      },
      {"[scatter_add]", "(2, 3)", "(1, 3)"});
  check_error<ShapeError>(
      [&] {
        scatter_add(x, 0, zeros({2, 5}, kInt64), ones({2, 5}));
      },
      {"[scatter_add]", "(2, 5)", "(3, 4)"});
  check_error<IndexError>(
      [&] {
        scatter_add(x, 0, full({1, 2}, 3, kInt64), ones({1, 2}));
      },
      {"[scatter_add]", "index 3", "size 3"});
  check_error<DTypeError>(
      [&] {
        scatter_add(x, 0, zeros({1, 2}, kInt64), ones({1, 2}, kFloat64));
      },
      {"[scatter_add]", "float64"});
}

TEST_CASE("errors: joining") {
  check_error<ValueError>([] { cat({}, 0); }, {"[cat]", "non-empty"});
  check_error<ShapeError>(
      [] {
        cat({ones({2, 3}), ones({2, 4})}, 0);
      },
      {"[cat]", "(2, 4)", "(2, 3)"});
  check_error<ShapeError>([] { cat({ones({2, 3}), ones({2, 3, 1})}, 0); }, {"[cat]", "(2, 3, 1)"});
  check_error<ShapeError>([] { cat({ones({}), ones({})}, 0); }, {"[cat]", "zero-dimensional"});
  check_error<DTypeError>(
      [] {
        cat({ones({2}), ones({2}, kFloat64)}, 0);
      },
      {"[cat]", "float64", "(2,)"});
  check_error<IndexError>([] { cat({ones({2}), ones({2})}, 1); }, {"[cat]"});
  check_error<ValueError>([] { stack({}, 0); }, {"[stack]"});
  check_error<ShapeError>(
      [] {
        stack({ones({2, 3}), ones({3, 2})}, 0);
      },
      {"[stack]", "(3, 2)", "(2, 3)"});
  check_error<DTypeError>([] { stack({ones({2}), arange(2)}, 0); }, {"[stack]", "int64"});
  check_error<IndexError>([] { stack({ones({2}), ones({2})}, 2); }, {"[stack]"});
  check_error<ValueError>([] { split(ones({4}), 0, 0); }, {"[split]", "(4,)"});
  check_error<ShapeError>(
      [] {
        split(ones({4, 2}), std::vector<int64_t>{1, 2}, 0);
      },
      {"[split]", "(4, 2)", "sum to 3"});
  check_error<ShapeError>([] { split(ones({}), 1, 0); }, {"[split]", "0-dim"});
  check_error<ValueError>([] { chunk(ones({4}), 0, 0); }, {"[chunk]"});
  check_error<ShapeError>([] { tril(ones({3})); }, {"[tril]", "(3,)"});
  check_error<ShapeError>([] { triu(ones({})); }, {"[triu]", "()"});
}

TEST_CASE("errors: devices") {
  // Host memory labelled as a CUDA tensor: the device checks run before any kernel touches it.
  static int64_t buf[16] = {};
  const Device cuda = Device::cuda(0);
  Tensor g = from_blob(buf, {2, 4}, kFloat32, cuda);
  Tensor gi = from_blob(buf, {2}, kInt64, cuda);
  check_error<DeviceError>([&] { cat({ones({2, 4}), g}, 0); }, {"[cat]", "cuda", "(2, 4)"});
  check_error<DeviceError>([&] { stack({ones({2, 4}), g}, 0); }, {"[stack]", "cuda"});
  check_error<DeviceError>(
      [&] {
        layer_norm(ones({2, 4}), {4}, from_blob(buf, {4}, kFloat32, cuda));
      },
      {"[layer_norm]", "cuda", "(4,)"});
  check_error<DeviceError>(
      [&] {
        rms_norm(ones({2, 4}), {4}, from_blob(buf, {4}, kFloat32, cuda));
      },
      {"[rms_norm]", "cuda"});
  check_error<DeviceError>(
      [&] {
        cross_entropy(ones({2, 4}), gi);
      },
      {"[cross_entropy]", "cuda", "(2,)"});
  check_error<DeviceError>([&] { nll_loss(ones({2, 4}), gi); }, {"[nll_loss]", "cuda"});
  check_error<DeviceError>([&] { mse_loss(ones({2, 4}), g); }, {"[mse_loss]", "cuda"});
  check_error<DeviceError>(
      [&] {
        binary_cross_entropy_with_logits(ones({2, 4}), g);
      },
      {"[binary_cross_entropy_with_logits]", "cuda"});
  check_error<DeviceError>([&] { embedding(ones({4, 2}), gi); }, {"[embedding]", "cuda", "(2,)"});
  check_error<DeviceError>([&] { index_select(ones({4, 2}), 0, gi); }, {"[index_select]", "cuda"});
  check_error<DeviceError>(
      [&] {
        gather(ones({2, 4}), 0, from_blob(buf, {1, 2}, kInt64, cuda));
      },
      {"[gather]", "cuda"});
  check_error<DeviceError>(
      [&] {
        scatter_add(ones({2, 4}), 0, zeros({1, 2}, kInt64), from_blob(buf, {1, 2}, kFloat32, cuda));
      },
      {"[scatter_add]", "cuda"});
  check_error<DeviceError>(
      [&] {
        index_add(ones({2, 4}), 0, zeros({1}, kInt64), from_blob(buf, {1, 4}, kFloat32, cuda));
      },
      {"[index_add]", "cuda"});
}

// Shape checks live in the ops (autograd/ops/*.cc), not in the kernels (kernels/stubs/*.h): an
// extreme over an empty dim is refused by the op with its own name, before any kernel runs.
TEST_CASE("reductions over an empty dim: the op refuses max/min/argmax, sums give the identity") {
  const Tensor x = rn({3, 0});
  check_error<ShapeError>([&] { amax(x, {1}); }, {"[amax]", "(3, 0)"});
  check_error<ShapeError>([&] { amin(x, {1}); }, {"[amin]", "(3, 0)"});
  check_error<ShapeError>([&] { max(x, int64_t(1)); }, {"[max_dim]", "(3, 0)"});
  check_error<ShapeError>([&] { min(x, int64_t(1)); }, {"[min_dim]", "(3, 0)"});
  check_error<ShapeError>([&] { argmax(x, 1); }, {"[argmax]", "(3, 0)"});
  check_error<ShapeError>([&] { argmin(x, 1); }, {"[argmin]", "(3, 0)"});
  StubCallRecorder rec;  // none of the refused calls reached reduce_stub
  check_error<ShapeError>([&] { argmax(x, 1); }, {"[argmax]"});
  CHECK(rec.calls().empty());
  // Sum, mean and prod over the empty dim: 0, NaN and 1 per row, like PyTorch.
  CHECK(sum(x, {1}).tolist() == std::vector<double>{0, 0, 0});
  CHECK(prod(x, {1}).tolist() == std::vector<double>{1, 1, 1});
  for (double m : mean(x, {1}).tolist()) CHECK(std::isnan(m));
  // An empty output needs no check: max over dim 1 of (0, 4) is (0,).
  CHECK(std::get<0>(max(rn({0, 4}), int64_t(1))).sizes() == Shape{0});
}
