// Double backward (Note [double backward] in autograd/engine.h): the API (create_graph on
// Tensor::backward, autograd::backward and autograd::grad, retain_graph's default, allow_unused),
// grad of grad on leaves, history of .grad, version checks, in-place ops, checkpointing and the
// fused LSTM under create_graph, and three uses against PyTorch (double_backward_fixture.txt,
// written by make_double_backward_fixture.py with python3-torch): a WGAN-GP critic step, a MAML
// inner step, Hessian-vector products.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "accel.h"
#include "autograd/gradcheck.h"
#include "tests/common/check.h"

#ifndef ACCEL_SOURCE_ROOT
#error "ACCEL_SOURCE_ROOT (the repository root) is passed by tests/autograd/meson.build"
#endif

using namespace accel;
using accel::test::check_close;

namespace {

Tensor f64(std::vector<double> v, Shape s) { return tensor(v, s).to(kFloat64); }

Tensor leaf(std::vector<double> v, Shape s) {
  return f64(std::move(v), std::move(s)).requires_grad_(true);
}

// The fixture: name -> float64 tensor.
const std::map<std::string, Tensor>& fixture() {
  static const std::map<std::string, Tensor> all = [] {
    std::map<std::string, Tensor> m;
    std::ifstream f(std::string(ACCEL_SOURCE_ROOT) + "/tests/autograd/double_backward_fixture.txt");
    REQUIRE_MESSAGE(f.good(), "cannot read double_backward_fixture.txt");
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::stringstream ss(line);
      std::string name, shape, values, item;
      std::getline(ss, name, '|');
      std::getline(ss, shape, '|');
      std::getline(ss, values, '|');
      Shape s;
      std::stringstream sh(shape);
      while (std::getline(sh, item, ',')) s.push_back(std::stoll(item));
      std::vector<double> v;
      std::stringstream vs(values);
      while (std::getline(vs, item, ',')) v.push_back(std::stod(item));
      m[name] = tensor(v, s).to(kFloat64);
    }
    return m;
  }();
  return all;
}

Tensor fx(const std::string& name, bool grad = false) {
  const auto it = fixture().find(name);
  REQUIRE_MESSAGE(it != fixture().end(), "fixture has no ", name);
  Tensor t = it->second.clone();
  if (grad) t.requires_grad_(true);
  return t;
}

}  // namespace

TEST_CASE("double backward: backward(create_graph) leaves .grad with history") {
  Tensor x = leaf({0.5, -1.5, 2.0}, {3});
  sum(pow(x, 3.0)).backward(Tensor(), std::nullopt, /*create_graph=*/true);
  const Tensor g = x.grad();
  REQUIRE(g.defined());
  CHECK(g.requires_grad());
  CHECK(g.grad_fn() != nullptr);
  check_close(g, f64({0.75, 6.75, 12.0}, {3}), 1e-12, 1e-12);  // 3 x^2
  x.zero_grad();
  sum(g).backward();
  check_close(x.grad(), f64({3.0, -9.0, 12.0}, {3}), 1e-12, 1e-12);  // 6 x
  // Without create_graph .grad has no history (and the accumulation is in place, as before).
  Tensor z = leaf({1.0, 2.0}, {2});
  sum(pow(z, 3.0)).backward();
  CHECK_FALSE(z.grad().requires_grad());
  CHECK(z.grad().grad_fn() == nullptr);
  // A second create_graph backward sums out of place, keeping the history of both.
  Tensor w = leaf({1.0, 2.0}, {2});
  sum(mul(w, w)).backward(Tensor(), std::nullopt, true);
  sum(pow(w, 3.0)).backward(Tensor(), std::nullopt, true);
  const Tensor gw = w.grad();  // 2 w + 3 w^2
  check_close(gw, f64({5.0, 16.0}, {2}), 1e-12, 1e-12);
  CHECK(autograd::grad({sum(gw)}, {w})[0].to_vector<double>() == std::vector<double>{8.0, 14.0});
  // As in torch, a leaf and a .grad with history reference each other until .grad is reset.
  w.zero_grad();
}

TEST_CASE("double backward: grad(create_graph), third order, Hessian of a quadratic") {
  Tensor x = leaf({0.5, -1.0, 2.0}, {3});
  const Tensor y = sum(pow(x, 4.0));
  const Tensor g1 = autograd::grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  CHECK(g1.requires_grad());
  check_close(g1, f64({0.5, -4.0, 32.0}, {3}), 1e-12, 1e-12);  // 4 x^3
  const Tensor g2 = autograd::grad({sum(g1)}, {x}, {}, std::nullopt, true)[0];
  check_close(g2, f64({3.0, 12.0, 48.0}, {3}), 1e-12, 1e-12);  // 12 x^2
  const Tensor g3 = autograd::grad({sum(g2)}, {x})[0];
  check_close(g3, f64({12.0, -24.0, 48.0}, {3}), 1e-12, 1e-12);  // 24 x
  CHECK_FALSE(g3.requires_grad());

  // f = 1/2 x^T A x: the gradient is (A + A^T) / 2 x and row i of the Hessian (A + A^T) / 2.
  const Tensor A = f64({2, 1, 0, 3, 4, 1, -1, 0, 5}, {3, 3});
  const Tensor f = mul(sum(mul(x, matmul(A, x))), 0.5);
  const Tensor gx = autograd::grad({f}, {x}, {}, std::nullopt, true)[0];
  const Tensor sym = mul(add(A, A.t()), 0.5);
  check_close(gx, matmul(sym, x.detach()), 1e-12, 1e-12);
  for (int64_t i = 0; i < 3; ++i) {
    const Tensor row = autograd::grad({gx.select(0, i)}, {x}, {}, /*retain_graph=*/true)[0];
    check_close(row, sym.select(0, i), 1e-12, 1e-12);
  }
}

TEST_CASE("double backward: retain_graph defaults to create_graph; allow_unused") {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = sum(exp(x));
  y.backward(Tensor(), std::nullopt, /*create_graph=*/true);
  CHECK_NOTHROW(y.backward(Tensor(), std::nullopt, true));  // retained by default
  Tensor y2 = sum(exp(x));
  y2.backward();
  CHECK_THROWS_WITH_AS(y2.backward(), doctest::Contains("second time"), ValueError);
  Tensor y3 = sum(exp(x));
  y3.backward(Tensor(), /*retain_graph=*/false, /*create_graph=*/true);  // explicit false wins
  CHECK_THROWS_WITH_AS(y3.backward(), doctest::Contains("second time"), ValueError);
  // grad() the same way.
  Tensor y4 = sum(exp(x));
  autograd::grad({y4}, {x}, {}, std::nullopt, true);
  CHECK_NOTHROW(autograd::grad({y4}, {x}));
  CHECK_THROWS_WITH_AS(autograd::grad({y4}, {x}), doctest::Contains("second time"), ValueError);

  Tensor unused = leaf({3.0}, {1});
  Tensor y5 = sum(mul(x, x));
  CHECK_THROWS_WITH_AS(autograd::grad({y5}, {x, unused}, {}, true, true),
                       doctest::Contains("allow_unused"), ValueError);
  const auto gs = autograd::grad({y5}, {x, unused}, {}, true, true, /*allow_unused=*/true);
  CHECK(gs[0].requires_grad());
  CHECK_FALSE(gs[1].defined());
  // grad_outputs with the wrong shape.
  CHECK_THROWS_AS(autograd::grad({mul(x, 2.0)}, {x}, {f64({1, 1, 1}, {3})}), ShapeError);
  // autograd::backward over two roots, with create_graph.
  Tensor a = leaf({1.5}, {1});
  autograd::backward({sum(pow(a, 2.0)), sum(pow(a, 3.0))}, {}, std::nullopt, true);
  CHECK(a.grad().requires_grad());
  check_close(a.grad(), f64({3.0 + 6.75}, {1}), 1e-12, 1e-12);
  a.zero_grad();
  CHECK_THROWS_AS(autograd::backward({sum(a), sum(a)}, {Tensor()}), ValueError);
}

TEST_CASE("double backward: version checks and retain_grad under create_graph") {
  // A saved output overwritten before the (create_graph) backward: the usual error.
  Tensor x = leaf({0.1, 0.2}, {2});
  Tensor y = exp(x);
  y.add_(1.0);
  CHECK_THROWS_WITH_AS(autograd::grad({sum(y)}, {x}, {}, std::nullopt, true),
                       doctest::Contains("modified by an in-place operation"), ValueError);
  // An input the double-backward graph saved, overwritten between the two backwards.
  Tensor z = leaf({0.3, -0.2}, {2});
  const Tensor g = autograd::grad({sum(sin(z))}, {z}, {}, std::nullopt, true)[0];  // cos z
  {
    NoGradGuard no_grad;
    z.add_(1.0);
  }
  CHECK_THROWS_WITH_AS(autograd::grad({sum(g)}, {z}),
                       doctest::Contains("modified by an in-place operation"), ValueError);
  // retain_grad() of a non-leaf keeps the gradient's history under create_graph.
  Tensor w = leaf({0.5, 1.0}, {2});
  Tensor h = mul(w, w);
  h.retain_grad();
  sum(pow(h, 2.0)).backward(Tensor(), std::nullopt, true);
  CHECK(h.grad().requires_grad());  // 2 h = 2 w^2
  check_close(autograd::grad({sum(h.grad())}, {w})[0], f64({2.0, 4.0}, {2}), 1e-12, 1e-12);  // 4 w
  w.zero_grad();
}

TEST_CASE("double backward: in-place ops and writes through views record their gradient graph") {
  // y = x * 1; y[0:2] *= x[1:3] (CopySlices: mul_ saves the view's old value), sin_ in place
  // (reads its input), z = y * b, z[3] **= 3 (through a view, reading the old value), z[1:] as
  // an index_add_ target (inplace_method through a view): second derivatives vs gradgradcheck.
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0], 1.0);
    y.slice(0, 0, 2).mul_(in[0].slice(0, 1, 3));
    y.sin_();
    Tensor z = mul(y, in[1]);
    z.select(0, 3).pow_(3.0);
    Tensor idx = tensor(std::vector<int64_t>{0, 2, 0}, Shape{3});
    z.slice(0, 1, 4).index_add_(0, idx, mul(in[1].slice(0, 0, 3), in[0].slice(0, 1, 4)));
    return z;
  };
  Generator gen(3);
  Tensor a = uniform({4}, -0.5, 0.5, TensorOptions(kFloat64), &gen).requires_grad_(true);
  Tensor b = uniform({4}, -0.5, 0.5, TensorOptions(kFloat64), &gen).requires_grad_(true);
  const auto r = autograd::gradgradcheck(fn, {a, b});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("double backward: activation checkpointing under create_graph") {
  Generator gen(5);
  Tensor w = uniform({3, 3}, -1, 1, TensorOptions(kFloat64), &gen).requires_grad_(true);
  Tensor x = uniform({2, 3}, -1, 1, TensorOptions(kFloat64), &gen).requires_grad_(true);
  auto block = [&w](const Tensor& in) { return tanh(matmul(in, w)); };
  // grad of the input, then of that gradient, with and without the checkpoint.
  const Tensor plain = autograd::grad({sum(block(x))}, {x}, {}, std::nullopt, true)[0];
  const Tensor ck =
      autograd::grad({sum(autograd::checkpoint(block, x))}, {x}, {}, std::nullopt, true)[0];
  REQUIRE(ck.requires_grad());
  check_close(ck, plain, 1e-12, 1e-12);
  const Tensor pp = autograd::grad({sum(mul(plain, plain))}, {x})[0];
  const Tensor cc = autograd::grad({sum(mul(ck, ck))}, {x})[0];
  check_close(cc, pp, 1e-12, 1e-12);
  // backward(create_graph): the parameter's .grad keeps history through the recompute.
  w.zero_grad();
  sum(mul(autograd::checkpoint(block, x), 2.0)).backward(Tensor(), std::nullopt, true);
  REQUIRE(w.grad().requires_grad());
  const Tensor gw = w.grad();
  w.zero_grad();
  sum(mul(block(x), 2.0)).backward(Tensor(), std::nullopt, true);
  check_close(gw, w.grad(), 1e-12, 1e-12);
  const Tensor d_ck = autograd::grad({sum(mul(gw, gw))}, {x})[0];
  const Tensor d_plain = autograd::grad({sum(mul(w.grad(), w.grad()))}, {x})[0];
  check_close(d_ck, d_plain, 1e-12, 1e-12);
  w.zero_grad();
}

TEST_CASE("double backward: the fused LSTM and GRU layers recompute under create_graph") {
  for (const char* kind : {"lstm", "gru"}) {
    INFO(kind);
    Generator gen(7);
    const bool lstm = std::string(kind) == "lstm";
    std::shared_ptr<nn::LSTM> l = lstm ? std::make_shared<nn::LSTM>(3, 4) : nullptr;
    std::shared_ptr<nn::GRU> gr =
        lstm ? nullptr : std::make_shared<nn::GRU>(3, 4, 1, true, false, 0.0, true);
    if (lstm) {
      l->to(kFloat64);
    } else {
      gr->to(kFloat64);
    }
    Tensor x = uniform({4, 2, 3}, -1, 1, TensorOptions(kFloat64), &gen);
    // The output and the final states (each gets a gradient): one tensor.
    auto fn = [&](const std::vector<Tensor>& in) {
      if (lstm) {
        auto [out, state] = l->forward(in[0]);
        return cat({out.reshape({-1}), std::get<0>(state).reshape({-1}),
                    std::get<1>(state).reshape({-1})});
      }
      auto [out, h] = gr->forward(in[0]);  // bidirectional: both fused directions
      return cat({out.reshape({-1}), h.reshape({-1})});
    };
    x.requires_grad_(true);
    const auto r = autograd::gradgradcheck(fn, {x});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("double backward: max_pool2d's window maxima read back from the workspace, any dtype") {
  // Note [pooling gradients under create_graph]: the create_graph gradient dx(u) = M^T u must use
  // the kernel's own maxima M, so <M^T u, v> (plain backward) equals <u, M v> (the gradient of
  // <dx(u), v> w.r.t. u). Small integers keep every sum exact in bfloat16; 40 x 40 and 41 x 41
  // inputs give 400 outputs per plane: two digits in bfloat16; the 3x3 stride 2 windows overlap
  // (four phases).
  struct Geometry {
    int64_t size;
    Shape kernel, stride, padding;
  };
  for (const Geometry& geo :
       {Geometry{40, {2, 2}, {2, 2}, {0, 0}}, Geometry{41, {3, 3}, {2, 2}, {1, 1}}}) {
    for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
      INFO("dtype ", dt, " input ", geo.size);
      Generator gen(11);
      const TensorOptions f64opt(kFloat64);
      Tensor x = randn({1, 2, geo.size, geo.size}, f64opt, &gen).to(dt).requires_grad_(true);
      const Tensor y0 = max_pool2d(x, geo.kernel, geo.stride, geo.padding);
      auto ints = [&](const Shape& s) {
        return randint(-4, 5, s, TensorOptions(kInt64), &gen).to(dt);
      };
      Tensor u = ints(y0.sizes()).requires_grad_(true);
      const Tensor v = ints(x.sizes());
      const Tensor plain = autograd::grad({sum(mul(y0, u.detach()))}, {x})[0];  // M^T u
      const Tensor y = max_pool2d(x, geo.kernel, geo.stride, geo.padding);
      const Tensor dx = autograd::grad({sum(mul(y, u))}, {x}, {}, std::nullopt, true)[0];
      CHECK(dx.to(kFloat64).to_vector<double>() == plain.to(kFloat64).to_vector<double>());
      const Tensor mv = autograd::grad({sum(mul(dx, v))}, {u})[0];  // M v
      const double lhs = sum(mul(plain.to(kFloat64), v.to(kFloat64))).item();
      const double rhs = sum(mul(u.detach().to(kFloat64), mv.to(kFloat64))).item();
      CHECK(lhs == rhs);
    }
  }
}

TEST_CASE("double backward: the autocast GEMM route refuses with the op's name") {
  Generator gen(2);
  Tensor x = uniform({4, 8}, -1, 1, TensorOptions(kFloat32), &gen).requires_grad_(true);
  Tensor w = uniform({3, 8}, -1, 1, TensorOptions(kFloat32), &gen).requires_grad_(true);
  Tensor y;
  {
    AutocastGuard ac(true, kBFloat16);
    y = linear(x, w);
  }
  CHECK_THROWS_WITH_AS(autograd::grad({sum(y.to(kFloat32))}, {x}, {}, std::nullopt, true),
                       doctest::Contains("[linear] double backward is not supported"), ValueError);
}

// ---------------- against PyTorch ----------------

TEST_CASE("double backward vs PyTorch: WGAN-GP gradient penalty on a conv critic") {
  const char* names[] = {"c1w", "c1b", "c2w", "c2b", "lw", "lb"};
  std::map<std::string, Tensor> p;
  for (const char* n : names) p[n] = fx(std::string("wgan.") + n, true);
  auto critic = [&p](const Tensor& x) {
    Tensor h = leaky_relu(conv2d(x, p["c1w"], p["c1b"], {2, 2}, {1, 1}), 0.2);
    h = leaky_relu(conv2d(h, p["c2w"], p["c2b"], {2, 2}, {1, 1}), 0.2);
    return linear(h.reshape({h.size(0), -1}), p["lw"], p["lb"]);
  };
  const Tensor real = fx("wgan.real"), fake = fx("wgan.fake"), eps = fx("wgan.eps");
  Tensor x_hat = add(mul(eps, real), mul(rsub(eps, 1.0), fake)).detach().requires_grad_(true);
  const Tensor d_hat = critic(x_hat);
  const Tensor g = autograd::grad({d_hat}, {x_hat}, {ones_like(d_hat)}, std::nullopt, true)[0];
  const int64_t n = g.size(0);
  const Tensor gp = mean(pow(sub(norm(g.reshape({n, -1}), 2.0, {1}), 1.0), 2.0));
  const Tensor loss = add(sub(mean(critic(fake)), mean(critic(real))), mul(gp, 10.0));
  loss.backward();
  check_close(gp, fx("wgan.gp"), 1e-12, 1e-12);
  check_close(loss, fx("wgan.loss"), 1e-12, 1e-12);
  for (const char* nm : names) {
    INFO("parameter ", nm);
    check_close(p[nm].grad(), fx(std::string("wgan.grad.") + nm), 1e-10, 1e-10);
  }
}

TEST_CASE("double backward vs PyTorch: a MAML inner step and its meta-gradient") {
  const std::vector<std::string> names{"w1", "b1", "w2", "b2"};
  std::vector<Tensor> params;
  for (const auto& nm : names) params.push_back(fx("maml." + nm, true));
  auto mlp = [](const Tensor& x, const std::vector<Tensor>& w) {
    return linear(relu(linear(x, w[0], w[1])), w[2], w[3]);
  };
  const double alpha = 0.4;
  Tensor meta_loss;
  for (const char* tag : {"c", "r"}) {
    const bool cls = std::string(tag) == "c";
    auto loss_fn = [cls](const Tensor& out, const Tensor& y) {
      return cls ? cross_entropy(out, y.to(kInt64)) : mse_loss(out, y);
    };
    const std::string t = tag;
    const Tensor inner = loss_fn(mlp(fx("maml.xs_" + t), params), fx("maml.ys_" + t));
    const std::vector<Tensor> grads = autograd::grad({inner}, params, {}, std::nullopt, true);
    std::vector<Tensor> adapted;
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(grads[i].requires_grad());
      adapted.push_back(sub(params[i], mul(grads[i], alpha)));
    }
    const Tensor outer = loss_fn(mlp(fx("maml.xq_" + t), adapted), fx("maml.yq_" + t));
    check_close(outer, fx("maml.outer_" + t), 1e-12, 1e-12);
    meta_loss = meta_loss.defined() ? add(meta_loss, outer) : outer;
  }
  const std::vector<Tensor> meta = autograd::grad({meta_loss}, params);
  for (size_t i = 0; i < names.size(); ++i) {
    INFO("parameter ", names[i]);
    check_close(meta[i], fx("maml.meta." + names[i]), 1e-10, 1e-10);
  }
}

TEST_CASE("double backward vs PyTorch: Hessian-vector products") {
  const Tensor b1 = fx("hvp.b1"), w2 = fx("hvp.w2"), v = fx("hvp.v"), vw = fx("hvp.vw");
  Tensor x = fx("hvp.x", true), w1 = fx("hvp.w1", true);
  auto f = [&](const Tensor& xx, const Tensor& ww) {
    const Tensor z = add(matmul(ww, xx), b1);
    return sum(tanh(matmul(w2, log1p(exp(z)))));
  };
  const Tensor y = f(x, w1);
  check_close(y, fx("hvp.f"), 1e-12, 1e-12);
  const Tensor gx = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];
  check_close(gx, fx("hvp.grad"), 1e-12, 1e-12);
  check_close(autograd::grad({sum(mul(gx, v))}, {x})[0], fx("hvp.hv"), 1e-10, 1e-10);
  const Tensor gw = autograd::grad({f(x, w1)}, {w1}, {}, std::nullopt, true)[0];
  check_close(autograd::grad({sum(mul(gw, vw))}, {w1})[0], fx("hvp.hv_w1"), 1e-10, 1e-10);
}
