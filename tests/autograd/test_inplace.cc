// In-place ops under autograd (Notes [saved tensors], [in-place ops], [views and in-place
// autograd], [in-place methods] in autograd/function.h): each misuse raises its documented
// error, each legal pattern gives PyTorch's gradients (hand-derived, or the same computation
// written out of place, or float64 finite differences), the fast path allocates nothing.
#include <doctest/doctest.h>

#include <string>

#include "accel.h"
#include "autograd/gradcheck.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace accel;
using accel::test::contains;
using accel::test::error_of;

namespace {

// float64 values of the given shape.
Tensor d64(const std::vector<double>& v, const Shape& shape) { return tensor(v, shape); }

Tensor leaf(std::vector<double> v) {
  const int64_t n = int64_t(v.size());
  return tensor(v, {n}).requires_grad_(true);
}

std::vector<double> vals(const Tensor& t) { return t.tolist(); }

bool near(const Tensor& a, const Tensor& b, double tol = 1e-12) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && allclose(a, b, tol, tol);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// misuse

TEST_CASE("modifying a saved input is a version error naming the op, the tensor and versions") {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({4, 5, 6});
  Tensor a = mul(x, 1.0);
  Tensor y = mul(a, w);  // mul saves a (input 0) for w's gradient, w (input 1) for a's
  a.add_(1.0);
  const std::string msg = error_of<ValueError>([&] { y.sum().backward(); });
  CAPTURE(msg);
  CHECK(contains(msg, "[backward]"));
  CHECK(contains(msg, "modified by an in-place operation"));
  CHECK(contains(msg, "the backward of mul reads its input 0"));
  CHECK(contains(msg, "float64 tensor of shape (3,)"));
  CHECK(contains(msg, "is at version 1; expected version 0"));
}

TEST_CASE("modifying a saved output is a version error (exp saves its output)") {
  Tensor x = leaf({0.5, -1});
  Tensor y = x.exp();
  y.add_(1.0);  // legal by itself: add_ saves nothing
  const std::string msg = error_of<ValueError>([&] { y.sum().backward(); });
  CAPTURE(msg);
  CHECK(contains(msg, "the backward of exp reads its output 0"));
  CHECK(contains(msg, "shape (2,)"));
  CHECK(contains(msg, "is at version 1; expected version 0"));
}

TEST_CASE("modifying what a backward does not read is legal (mul by a scalar saves nothing)") {
  Tensor x = leaf({1, 2, 3});
  Tensor a = mul(x, 1.0);
  Tensor y = mul(a, 2.0);
  a.add_(1.0);
  y.sum().backward();
  CHECK(vals(x.grad()) == std::vector<double>{2, 2, 2});
  // The same for add, sum and the view ops.
  Tensor z = leaf({1, 2});
  Tensor b = mul(z, 1.0);
  Tensor s = add(b.view({2, 1}).sum(), b.sum());
  b.mul_(5.0);
  s.backward();
  CHECK(vals(z.grad()) == std::vector<double>{2, 2});
}

TEST_CASE("in place on a leaf that requires grad is refused in grad mode, allowed under no_grad") {
  Tensor p = leaf({1, 2});
  const std::string msg = error_of<ValueError>([&] { p.add_(1.0); });
  CHECK(contains(msg,
                 "[add_] a leaf tensor that requires grad (shape (2,)) is being used in an "
                 "in-place operation"));
  CHECK(vals(p) == std::vector<double>{1, 2});  // refused before writing
  CHECK_THROWS_WITH_AS(p.relu_(), doctest::Contains("[relu_] a leaf tensor"), ValueError);
  CHECK_THROWS_WITH_AS(p.masked_fill_(gt(p.detach(), 1.5), 0),
                       doctest::Contains("[masked_fill_] a leaf tensor"), ValueError);
  CHECK(!p.grad_fn());  // refused before any graph was recorded
  const uint32_t v0 = p.version();
  {
    NoGradGuard ng;  // optimizer steps and init
    p.add_(ones({2}, kFloat64), -0.5);
    p.mul_(2.0);
  }
  CHECK(vals(p) == std::vector<double>{1, 3});
  CHECK(p.version() == v0 + 2);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
}

TEST_CASE("in place through a view of a leaf that requires grad is refused") {
  Tensor p = leaf({1, 2, 3});
  const std::string msg = error_of<ValueError>([&] { p.narrow(0, 0, 2).mul_(2.0); });
  CHECK(contains(msg, "[mul_] a view of a leaf tensor that requires grad"));
  CHECK(contains(msg, "leaf of shape (3,)"));
  {
    NoGradGuard ng;
    p.narrow(0, 0, 2).mul_(2.0);
  }
  CHECK(vals(p) == std::vector<double>{2, 4, 3});
}

TEST_CASE("a version error after retain_graph: the second backward sees the write") {
  Tensor x = leaf({0.0, 1.0});
  Tensor y = x.exp();
  Tensor s = y.sum();
  s.backward({}, true);
  CHECK(near(x.grad(), x.detach().exp()));
  {
    NoGradGuard ng;
    y.add_(1.0);  // bumps the version even without recording
  }
  CHECK_THROWS_WITH_AS(s.backward(), doctest::Contains("modified by an in-place operation"),
                       ValueError);
}

TEST_CASE("a view made under no_grad cannot be written in grad mode when that would record") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = mul(x, 1.0);
  Tensor v;
  {
    NoGradGuard ng;
    v = y.narrow(0, 0, 2);
  }
  CHECK(v.is_view());
  CHECK(!v.requires_grad());  // a plain alias for autograd (torch reports its base's flag)
  CHECK_THROWS_WITH_AS(v.mul_(2.0), doctest::Contains("a view made under NoGradGuard"), ValueError);
  // A plain buffer's no-grad view, written from a tensor that requires grad: refused too.
  Tensor buf = zeros({3}, kFloat64);
  Tensor bv;
  {
    NoGradGuard ng;
    bv = buf.narrow(0, 1, 2);
  }
  CHECK_THROWS_AS(bv.copy_(leaf({5, 6})), ValueError);
  // Writes that record nothing stay legal.
  {
    NoGradGuard ng;
    v.mul_(2.0);
  }
  bv.copy_(d64({5.0, 6.0}, {2}));
  CHECK(vals(buf) == std::vector<double>{0, 5, 6});
}

TEST_CASE("an expanded view (elements sharing memory) cannot be written while recording") {
  Tensor x = leaf({1});
  Tensor y = mul(x, 1.0).expand({3});
  CHECK_THROWS_WITH_AS(y.mul_(2.0), doctest::Contains("refers to the same memory location"),
                       ValueError);
}

TEST_CASE("a floating result is not stored into an integer tensor") {
  Tensor i = arange(4);
  CHECK_THROWS_AS(i.div_(2), DTypeError);
  CHECK_THROWS_AS(i.exp_(), DTypeError);
  CHECK_THROWS_AS(i.add_(0.5), DTypeError);
  CHECK_THROWS_AS(i.mul_(0.5), DTypeError);
  i.mul_(3).add_(1).relu_();  // integer results are fine
  CHECK(vals(i) == std::vector<double>{1, 4, 7, 10});
}

TEST_CASE("inplace_method: fn must take every tensor that requires grad as an operand") {
  Tensor w = leaf({1, 2});
  Tensor y = mul(leaf({3, 4}), 1.0);
  const std::string msg = error_of<ValueError>([&] {
    autograd::inplace_method(
        y, "test_", {}, [&](const Tensor& s, const std::vector<Tensor>&) { return add(s, w); });
  });
  CHECK(
      contains(msg, "[test_] the out-of-place computation read a leaf tensor that requires grad"));
  // Passed as an operand it works, with the gradient reaching both. mul's backward reads self's
  // old value (for w's gradient): reads_self, else a version error at backward.
  auto times_w = [](const Tensor& s, const std::vector<Tensor>& o) { return mul(s, o[0]); };
  Tensor x = leaf({3, 4});
  Tensor z = mul(x, 1.0);
  autograd::inplace_method(z, "test_", {w}, times_w, /*reads_self=*/true);
  z.sum().backward();
  CHECK(vals(x.grad()) == std::vector<double>{1, 2});
  CHECK(vals(w.grad()) == std::vector<double>{3, 4});
  Tensor z2 = mul(x, 1.0);
  autograd::inplace_method(z2, "test_", {w}, times_w);
  CHECK_THROWS_WITH_AS(z2.sum().backward(),
                       doctest::Contains("the backward of mul reads its input 0"), ValueError);
}

// ---------------------------------------------------------------------------------------------
// legal patterns and their gradients

TEST_CASE("x.div_(255) on a graph tensor") {
  Tensor x = leaf({51, 102});
  Tensor y = mul(x, 1.0);
  y.div_(255);
  CHECK(y.grad_fn()->name() == std::string("div_"));
  mul(y, y).sum().backward();  // d/dx (x / 255)^2 = 2 x / 255^2
  CHECK(near(x.grad(), d64({2 * 51.0 / 65025, 2 * 102.0 / 65025}, {2})));
}

TEST_CASE("chained in-place ops") {
  Tensor x = leaf({0.1, -0.3});
  Tensor y = mul(x, 1.0);
  y.add_(1.0).mul_(3.0).exp_();  // y = exp(3 (x + 1))
  CHECK(y.version() == 3);
  y.sum().backward();
  const Tensor e = exp(mul(add(x.detach(), 1.0), 3.0));
  CHECK(near(y.detach(), e));
  CHECK(near(x.grad(), mul(e, 3.0)));
}

TEST_CASE("ResNet: out += identity after a conv and a batchnorm, then relu_") {
  Generator gen(7);
  const TensorOptions f64(kFloat64);
  Tensor x = randn({2, 3, 5, 5}, f64, &gen).requires_grad_(true);
  Tensor w1 = randn({3, 3, 3, 3}, f64, &gen).requires_grad_(true);
  Tensor w2 = randn({3, 3, 3, 3}, f64, &gen).requires_grad_(true);
  nn::BatchNorm2d bn(3);
  bn.to(kFloat64);
  auto block = [&](const Tensor& in, bool inplace) {
    Tensor identity = in;
    Tensor out = conv2d(in, w1, Tensor(), {1, 1}, {1, 1});
    out = inplace ? out.relu_() : relu(out);
    out = bn(conv2d(out, w2, Tensor(), {1, 1}, {1, 1}));
    if (inplace) {
      out += identity;
      out.relu_();
    } else {
      out = relu(add(out, identity));
    }
    return out;
  };
  Tensor a = block(x, true);
  CHECK(a.grad_fn()->name() == std::string("relu_"));
  mul(a, a).sum().backward();
  const Tensor gx = x.grad(), g1 = w1.grad(), g2 = w2.grad(), gw = bn.weight.grad();
  x.zero_grad();
  w1.zero_grad();
  w2.zero_grad();
  bn.weight.zero_grad();
  Tensor b = block(x, false);
  CHECK(near(a.detach(), b.detach()));
  mul(b, b).sum().backward();
  CHECK(near(gx, x.grad(), 1e-10));
  CHECK(near(g1, w1.grad(), 1e-10));
  CHECK(near(g2, w2.grad(), 1e-10));
  CHECK(near(gw, bn.weight.grad(), 1e-10));
}

TEST_CASE("relu_ inside a model, checked against float64 finite differences") {
  Generator gen(11);
  const TensorOptions f64(kFloat64);
  Tensor x = randn({4, 3}, f64, &gen).requires_grad_(true);
  Tensor w1 = randn({5, 3}, f64, &gen).requires_grad_(true);
  Tensor w2 = randn({2, 5}, f64, &gen).requires_grad_(true);
  auto model = [](const std::vector<Tensor>& in) {
    Tensor h = linear(in[0], in[1]);
    h.mul_(0.5).add_(0.1);
    h.relu_();  // saves its output: nothing may write h after it
    Tensor out = linear(h, in[2]);
    out.tanh_();
    return out;
  };
  auto r = autograd::gradcheck(model, {x, w1, w2});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("in place through a slice: y[:, 0].mul_(2)") {
  Tensor x = d64({1.0, 2.0, 3.0, 4.0}, {2, 2}).requires_grad_(true);
  Tensor y = mul(x, 1.0);
  y.select(1, 0).mul_(2.0);
  CHECK(y.grad_fn()->name() == std::string("CopySlices"));
  CHECK(vals(y) == std::vector<double>{2, 2, 6, 4});
  mul(y, y).sum().backward();  // column 0: d/dx (2x)^2 = 8x; column 1: 2x
  CHECK(vals(x.grad()) == std::vector<double>{8, 4, 24, 8});
}

TEST_CASE("in place on a view, then backward through the base and the view") {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({4, 5});
  Tensor y = mul(x, 1.0);
  Tensor v = y.narrow(0, 0, 2);
  v.mul_(w);  // y = [x0 w0, x1 w1, x2]
  CHECK(v.grad_fn()->name() == std::string("AsStridedBackward"));
  add(y.sum(), mul(v, v).sum()).backward();
  // d/dx0 = w0 + 2 x0 w0^2, d/dx2 = 1; d/dw0 = x0 + 2 x0^2 w0
  CHECK(vals(x.grad()) == std::vector<double>{4 + 2 * 1 * 16, 5 + 2 * 2 * 25, 1});
  CHECK(vals(w.grad()) == std::vector<double>{1 + 2 * 1 * 4, 2 + 2 * 4 * 5});
}

TEST_CASE("every view of the base sees a write through one of them (PyTorch's example)") {
  Tensor a = leaf({1, 2, 3, 4});
  Tensor y = mul(a, 1.0);
  Tensor v1 = y.narrow(0, 0, 2), v2 = y.narrow(0, 2, 2);
  v1.mul_(3.0);
  CHECK(y.grad_fn()->name() == std::string("CopySlices"));
  CHECK(v2.grad_fn()->name() == std::string("AsStridedBackward"));  // regenerated: stale
  add(y.sum(), v2.sum()).backward();
  CHECK(vals(a.grad()) == std::vector<double>{3, 3, 2, 2});  // torch: [3., 3., 2., 2.]
}

TEST_CASE("a view made before its base was written uses the base's new history") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = mul(x, 1.0);
  Tensor v = y.narrow(0, 1, 2);
  y.exp_();            // v's history (narrow of the old y) is stale
  v.sum().backward();  // d/dx exp(x) = exp(x) on elements 1, 2
  CHECK(near(x.grad(), d64({0.0, std::exp(2.0), std::exp(3.0)}, {3})));
}

TEST_CASE("a plain buffer written from a tensor that requires grad gets history") {
  Tensor x = leaf({1, 2});
  Tensor buf = zeros({2}, kFloat64);
  buf.copy_(x);
  CHECK(buf.requires_grad());
  CHECK(!buf.is_leaf());
  CHECK(buf.grad_fn()->name() == std::string("copy_"));
  mul(buf, 3.0).sum().backward();
  CHECK(vals(x.grad()) == std::vector<double>{3, 3});
  // Through a view of a plain buffer: the buffer's history becomes CopySlices.
  Tensor z = leaf({1, 2});
  Tensor big = zeros({4}, kFloat64);
  big.narrow(0, 1, 2).copy_(mul(z, 2.0));
  CHECK(big.requires_grad());
  mul(big, big).sum().backward();  // big = [0, 2 z0, 2 z1, 0]: d/dz = 8 z
  CHECK(vals(z.grad()) == std::vector<double>{8, 16});
  // z.add_(w) with z plain and w requiring grad, as torch does.
  Tensor p = zeros({2}, kFloat64);
  Tensor q = leaf({1, 1});
  p.add_(q, 2.0);
  p.sum().backward();
  CHECK(vals(q.grad()) == std::vector<double>{2, 2});
}

TEST_CASE("an overwritten value gets a zero gradient (copy_, fill_)") {
  Tensor x = leaf({1, 2});
  Tensor y = mul(x, 2.0);
  y.fill_(5.0);
  add(y, x).sum().backward();
  CHECK(vals(x.grad()) == std::vector<double>{1, 1});
  Tensor a = leaf({1, 2, 3});
  Tensor b = mul(a, 1.0);
  b.narrow(0, 1, 1).zero_();
  mul(b, b).sum().backward();
  CHECK(vals(a.grad()) == std::vector<double>{2, 0, 6});
}

TEST_CASE("retain_grad follows the tensor through an in-place op; hooks stay with the old value") {
  Tensor a = leaf({1, 2});
  Tensor y = mul(a, 2.0);
  y.retain_grad();
  Tensor seen;
  y.register_hook([&seen](const Tensor& g) {
    seen = g.clone();
    return Tensor();
  });
  y.add_(1.0);
  mul(y, y).sum().backward();
  // torch: y.grad is the gradient of the new value, 2 (2a + 1)
  CHECK(vals(y.grad()) == std::vector<double>{6, 10});
  CHECK(vals(seen) == std::vector<double>{6, 10});  // add_ passes the gradient through
  CHECK(vals(a.grad()) == std::vector<double>{12, 20});
}

TEST_CASE("compound assignment") {
  Tensor t = d64({1.0, 2.0}, {2});
  t += 1;
  t -= d64({0.5, 0.5}, {2});
  t *= 4;
  t /= d64({2.0, 4.0}, {2});
  t += t;  // the operand is self
  CHECK(vals(t) == std::vector<double>{6, 5});
  t -= 1.0;
  t *= t;
  t /= 5;
  CHECK(vals(t) == std::vector<double>{5, 3.2});
  // Recorded like the methods.
  Tensor x = leaf({1, 2});
  Tensor y = mul(x, 1.0);
  y *= x;
  y += 3;
  y.sum().backward();
  CHECK(vals(x.grad()) == std::vector<double>{2, 4});
}

TEST_CASE("data(): a detached alias for updates without history") {
  Tensor p = leaf({1, 2});
  const uint32_t v0 = p.version();
  Tensor d = p.data();
  CHECK(!d.requires_grad());
  CHECK(d.data_ptr() == p.data_ptr());
  d.add_(d64({0.5, 0.5}, {2}));  // grad mode on: d is a plain tensor
  CHECK(vals(p) == std::vector<double>{1.5, 2.5});
  CHECK(p.version() == v0 + 1);       // shared counter (torch's .data has its own)
  CHECK(p.data<double>()[0] == 1.5);  // the pointer accessor is still there
}

TEST_CASE("a parameter updated under no_grad between forward and backward is an error") {
  Tensor w = leaf({1, 2});
  Tensor x = leaf({3, 4});
  Tensor y = mul(x, w);
  {
    NoGradGuard ng;
    w.add_(1.0);
  }
  CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("reads its input 1"), ValueError);
}

TEST_CASE("version counter: one bump per in-place op, shared by views and detached aliases") {
  Tensor t = zeros({4}, kFloat64);
  Tensor v = t.narrow(0, 1, 2);
  Tensor d = t.detach();
  CHECK(v.is_view());
  CHECK(v.view_base().is_same(t));
  CHECK(!d.is_view());
  CHECK(!t.is_view());
  CHECK(t.version() == 0);
  t.add_(1.0);
  v.mul_(2.0);
  d.copy_(ones({4}, kFloat64));
  t.fill_(3.0);
  t.clamp_(0, 1);
  t.exp_();
  CHECK(t.version() == 6);
  CHECK(v.version() == 6);
  // A view of a view points at the first base.
  CHECK(v.narrow(0, 0, 1).view_base().is_same(t));
  // An op's output is never a view of its inputs.
  CHECK(!mul(v, 2.0).is_view());
}

TEST_CASE("no grad needed: in-place ops run in place, allocating nothing") {
  Tensor a = ones({64}, kFloat32);
  Tensor b = ones({64}, kFloat32);
  Allocator* alloc = get_allocator(kCPU);
  auto count = [&] {
    const AllocatorStats s = alloc->stats();
    return s.alloc_count + s.cache_hits;
  };
  for (int grad_mode = 0; grad_mode < 2; ++grad_mode) {
    CAPTURE(grad_mode);
    std::unique_ptr<NoGradGuard> ng;
    if (grad_mode == 0) ng = std::make_unique<NoGradGuard>();
    const size_t before = count();
    a.add_(b, 0.5);
    a.sub_(b);
    a.mul_(b);
    a.mul_(2.0);
    a.div_(2.0);
    a.add_(1.0);
    a.clamp_(-5, 5);
    a.relu_();
    a.exp_();
    a.log_();
    a.neg_();
    a.abs_();
    a.copy_(b);
    a.fill_(2.0);
    a += b;
    a *= 0.5;
    CHECK(count() == before);
  }
}

TEST_CASE("in-place unary methods match their out-of-place ops") {
  Tensor x = d64({0.3, 0.7, 1.2}, {3});
  auto check = [&](const char* name, Tensor& (Tensor::*method)(), Tensor (*fn)(const Tensor&)) {
    CAPTURE(name);
    Tensor t = x.clone();
    Tensor alias = t;
    Tensor& r = (t.*method)();
    CHECK(&r == &t);
    CHECK(equal(alias, fn(x)));
  };
  check("neg_", &Tensor::neg_, &neg);
  check("exp_", &Tensor::exp_, &exp);
  check("log_", &Tensor::log_, &log);
  check("sqrt_", &Tensor::sqrt_, &sqrt);
  check("rsqrt_", &Tensor::rsqrt_, &rsqrt);
  check("abs_", &Tensor::abs_, &abs);
  check("relu_", &Tensor::relu_, &relu);
  check("sigmoid_", &Tensor::sigmoid_, &sigmoid);
  check("tanh_", &Tensor::tanh_, &tanh);
  check("sin_", &Tensor::sin_, &sin);
  check("cos_", &Tensor::cos_, &cos);
  check("reciprocal_", &Tensor::reciprocal_, &reciprocal);
  check("square_", &Tensor::square_, &square);
  check("log1p_", &Tensor::log1p_, &log1p);
  check("expm1_", &Tensor::expm1_, &expm1);
  check("erf_", &Tensor::erf_, &erf);
  Tensor t = x.clone();
  CHECK(equal(t.pow_(3), pow(x, 3)));
  t = x.clone();
  CHECK(equal(t.pow_(x), pow(x, x)));
  t = x.clone();
  CHECK(equal(t.clamp_min_(0.5), clamp(x, 0.5, std::nullopt)));
  t = x.clone();
  CHECK(equal(t.clamp_max_(0.5), clamp(x, std::nullopt, 0.5)));
}
