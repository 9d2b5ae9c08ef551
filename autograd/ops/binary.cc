// Binary elementwise ops: forward, shape/dtype rules and backward together.
//   a: (...) b: (...) broadcast -> out: broadcast(a, b), dtype promote(a, b)
#include "autograd/ops/common.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(add, "add");
ACCEL_DIFFERENTIABLE_OP(sub, "sub");
ACCEL_DIFFERENTIABLE_OP(mul, "mul");
ACCEL_DIFFERENTIABLE_OP(div, "div");
ACCEL_DIFFERENTIABLE_OP(pow, "pow");
ACCEL_DIFFERENTIABLE_OP(maximum, "maximum");
ACCEL_DIFFERENTIABLE_OP(minimum, "minimum");
ACCEL_DIFFERENTIABLE_OP(add_scalar, "add_scalar");
ACCEL_DIFFERENTIABLE_OP(mul_scalar, "mul_scalar");
ACCEL_DIFFERENTIABLE_OP(rsub_scalar, "rsub_scalar");
ACCEL_DIFFERENTIABLE_OP(rdiv_scalar, "rdiv_scalar");
ACCEL_DIFFERENTIABLE_OP(pow_scalar, "pow_scalar");

namespace {

// Operands after promotion. `a`/`b` point at the caller's tensors unless a conversion was needed
// (then at the converted copies held here), so the common case costs no reference-count traffic.
struct Prepared {
  const Tensor* a;
  const Tensor* b;
  Tensor a_conv, b_conv;
  Shape shape;
  DType dtype;
};

// Checks devices, promotes dtypes and broadcasts shapes. `float_result` forces a floating dtype
// (true division, pow).
inline void prepare(Prepared& p, const char* op, const Tensor& a, const Tensor& b,
                    bool float_result) {
  ops::check_defined(a, op);
  ops::check_defined(b, op);
  const bool same_device = a.device() == b.device();
  if (ACCEL_UNLIKELY(!same_device)) {
    // A 0-dim CPU tensor acts as a scalar on any device, as in PyTorch.
    ACCEL_CHECK(b.dim() == 0 && b.device().is_cpu(), DeviceError, op,
                "expected tensors on the same device, got ", a.device(), " ", a.sizes(), " and ",
                b.device(), " ", b.sizes());
  }
  DType dt = a.dtype() == b.dtype() ? a.dtype() : promote_types(a.dtype(), b.dtype());
  if (float_result) dt = to_floating(dt);
  p.dtype = dt;
  p.a = &a;
  p.b = &b;
  if (ACCEL_UNLIKELY(a.dtype() != dt)) {
    p.a_conv = a.to(dt);
    p.a = &p.a_conv;
  }
  if (ACCEL_UNLIKELY(b.dtype() != dt || !same_device)) {
    p.b_conv = b.to(dt).to(a.device());
    p.b = &p.b_conv;
  }
  p.shape = a.sizes() == b.sizes() ? a.sizes() : broadcast_shapes(a.sizes(), b.sizes(), op);
}

inline Tensor run(BinaryOp bop, const Prepared& p, double alpha = 1.0) {
  Tensor out = ops::empty_on(p.shape, is_comparison(bop) ? kBool : p.dtype, p.a->device());
  binary_stub(p.a->device(), bop, *p.a, *p.b, out, alpha);
  return out;
}

}  // namespace

namespace {
// add / sub with alpha as a double: `a + b` reaches these without building a Scalar (a 24-byte
// by-value argument made of narrow stores that the callee reloads wide: a store-forwarding stall
// of 5-8 ns per op, docs/performance.md "Op overhead").
Tensor add_alpha(const Tensor& a, const Tensor& b, double al) {
  Prepared p;
  prepare(p, "add", a, b, false);
  Tensor out = run(BinaryOp::Add, p, al);
  if (autograd::needs_grad(*p.a, *p.b)) {
    autograd::record(
        "add", {p.a, p.b}, {&out},
        [sa = p.a->sizes(), sb = p.b->sizes(), al](const autograd::Grads& g) {
          const Tensor& go = g[0];
          return autograd::Grads{sum_to(go, sa), sum_to(al == 1.0 ? go : mul(go, al), sb)};
        });
  }
  return out;
}

Tensor sub_alpha(const Tensor& a, const Tensor& b, double al) {
  Prepared p;
  prepare(p, "sub", a, b, false);
  ACCEL_CHECK(p.dtype != kBool, DTypeError, "sub", "subtraction of bool tensors is not supported");
  Tensor out = run(BinaryOp::Sub, p, al);
  if (autograd::needs_grad(*p.a, *p.b)) {
    autograd::record("sub", {p.a, p.b}, {&out},
                     [sa = p.a->sizes(), sb = p.b->sizes(), al](const autograd::Grads& g) {
                       return autograd::Grads{sum_to(g[0], sa), sum_to(mul(g[0], -al), sb)};
                     });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return add_alpha(a, b, 1.0); }
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  return add_alpha(a, b, alpha.to_double());
}
Tensor sub(const Tensor& a, const Tensor& b) { return sub_alpha(a, b, 1.0); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  return sub_alpha(a, b, alpha.to_double());
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Prepared p;
  prepare(p, "mul", a, b, false);
  Tensor out = run(BinaryOp::Mul, p);
  if (autograd::needs_grad(*p.a, *p.b)) {
    const bool ga = p.a->requires_grad(), gb = p.b->requires_grad();
    // d a = g * b, d b = g * a: each saved only when the other side needs its gradient.
    autograd::record("mul", {p.a, p.b}, {&out},
                     [x = gb ? autograd::save_input(*p.a, 0) : autograd::SavedTensor(),
                      y = ga ? autograd::save_input(*p.b, 1) : autograd::SavedTensor(),
                      sa = p.a->sizes(), sb = p.b->sizes()](const autograd::Grads& g) {
                       return autograd::Grads{
                           y.defined() ? sum_to(mul(g[0], y.unpack()), sa) : Tensor(),
                           x.defined() ? sum_to(mul(g[0], x.unpack()), sb) : Tensor()};
                     });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Prepared p;
  prepare(p, "div", a, b, true);
  Tensor out = run(BinaryOp::Div, p);
  if (autograd::needs_grad(*p.a, *p.b)) {
    // a is read only for b's gradient; b always.
    autograd::record(
        "div", {p.a, p.b}, {&out},
        [x = p.b->requires_grad() ? autograd::save_input(*p.a, 0) : autograd::SavedTensor(),
         ys = autograd::save_input(*p.b, 1), sa = p.a->sizes()](const autograd::Grads& g) {
          const Tensor& y = ys.unpack();
          const Tensor ga = div(g[0], y);
          // d/db (a/b) = -a/b^2 = -(g/b) * (a/b)
          return autograd::Grads{
              sum_to(ga, sa),
              x.defined() ? sum_to(neg(mul(ga, div(x.unpack(), y))), y.sizes()) : Tensor()};
        });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Prepared p;
  prepare(p, "pow", a, b, true);
  Tensor out = run(BinaryOp::Pow, p);
  if (autograd::needs_grad(*p.a, *p.b)) {
    // d/da a^b = b a^(b-1) reads a and b;  d/db a^b = a^b log a reads the output and a.
    const bool ga = p.a->requires_grad(), gb = p.b->requires_grad();
    autograd::record("pow", {p.a, p.b}, {&out},
                     [xs = autograd::save_input(*p.a, 0),
                      ys = ga ? autograd::save_input(*p.b, 1) : autograd::SavedTensor(),
                      os = gb ? autograd::save_output(out) : autograd::SavedTensor(),
                      sa = p.a->sizes(), sb = p.b->sizes()](const autograd::Grads& g) {
                       const Tensor& x = xs.unpack();
                       Tensor da, db;
                       if (ys.defined()) {
                         const Tensor& y = ys.unpack();
                         da = sum_to(mul(g[0], mul(y, pow(x, sub(y, 1)))), sa);
                       }
                       if (os.defined()) db = sum_to(mul(g[0], mul(os.unpack(), log(x))), sb);
                       return autograd::Grads{da, db};
                     });
  }
  return out;
}

namespace {
// Ties split the gradient evenly between both sides, as PyTorch does.
Tensor max_min(const char* op, BinaryOp bop, const Tensor& a, const Tensor& b) {
  Prepared p;
  prepare(p, op, a, b, false);
  Tensor out = run(bop, p);
  if (autograd::needs_grad(*p.a, *p.b)) {
    autograd::record(op, {p.a, p.b}, {&out},
                     [xs = autograd::save_input(*p.a, 0), ys = autograd::save_input(*p.b, 1),
                      bop](const autograd::Grads& g) {
                       const Tensor& x = xs.unpack();
                       const Tensor& y = ys.unpack();
                       Tensor win = bop == BinaryOp::Maximum ? gt(x, y) : lt(x, y);
                       Tensor tie = eq(x, y);
                       Tensor wa = add(win.to(g[0].dtype()), mul(tie.to(g[0].dtype()), 0.5));
                       Tensor ga = mul(g[0], wa);
                       Tensor gb = sub(g[0], ga);
                       return autograd::Grads{sum_to(ga, x.sizes()), sum_to(gb, y.sizes())};
                     });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return max_min("maximum", BinaryOp::Maximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return max_min("minimum", BinaryOp::Minimum, a, b);
}

// ---------------- tensor-scalar ----------------

namespace {
// Integer tensor with a fractional scalar promotes to float32, like PyTorch.
Tensor scalar_input(const Tensor& a, Scalar s, const char* op) {
  ops::check_defined(a, op);
  if (!a.is_floating_point() && !s.is_int) return a.to(kDefaultFloat);
  if (a.dtype() == kBool) return a.to(kInt64);
  return a;
}

Tensor unary_scalar(UnaryOp uop, const Tensor& x, double p0) {
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  unary_stub(x.device(), uop, x, out, UnaryParams{p0, 0});
  return out;
}
}  // namespace

Tensor add(const Tensor& a, Scalar b) {
  Tensor x = scalar_input(a, b, "add");
  Tensor out = unary_scalar(UnaryOp::AddScalar, x, b.to_double());
  if (autograd::needs_grad(x)) {
    autograd::record("add_scalar", {&x}, {&out},
                     [](const autograd::Grads& g) { return autograd::Grads{g[0]}; });
  }
  return out;
}

Tensor sub(const Tensor& a, Scalar b) {
  return add(a, b.is_int ? Scalar(-b.i) : Scalar(-b.to_double()));
}

Tensor rsub(const Tensor& a, Scalar b) {
  Tensor x = scalar_input(a, b, "rsub");
  Tensor out = unary_scalar(UnaryOp::RSubScalar, x, b.to_double());
  if (autograd::needs_grad(x)) {
    autograd::record("rsub_scalar", {&x}, {&out},
                     [](const autograd::Grads& g) { return autograd::Grads{neg(g[0])}; });
  }
  return out;
}

Tensor mul(const Tensor& a, Scalar b) {
  Tensor x = scalar_input(a, b, "mul");
  const double s = b.to_double();
  Tensor out = unary_scalar(UnaryOp::MulScalar, x, s);
  if (autograd::needs_grad(x)) {
    autograd::record("mul_scalar", {&x}, {&out},
                     [s](const autograd::Grads& g) { return autograd::Grads{mul(g[0], s)}; });
  }
  return out;
}

Tensor div(const Tensor& a, Scalar b) {
  Tensor x = a.is_floating_point() ? a : a.to(kDefaultFloat);
  return mul(x, 1.0 / b.to_double());
}

Tensor rdiv(const Tensor& a, Scalar b) {
  ops::check_defined(a, "rdiv");
  Tensor x = a.is_floating_point() ? a : a.to(kDefaultFloat);
  Tensor out = unary_scalar(UnaryOp::RDivScalar, x, b.to_double());
  if (autograd::needs_grad(x)) {
    autograd::record("rdiv_scalar", {&x}, {&out},
                     [os = autograd::save_output(out),
                      xs = autograd::save_input(x, 0)](const autograd::Grads& g) {
                       // d/dx (s / x) = -s / x^2 = -o / x
                       return autograd::Grads{neg(div(mul(g[0], os.unpack()), xs.unpack()))};
                     });
  }
  return out;
}

Tensor pow(const Tensor& a, Scalar exponent) {
  const double e = exponent.to_double();
  Tensor x = (!a.is_floating_point() && (!exponent.is_int || e < 0)) ? a.to(kDefaultFloat) : a;
  ops::check_defined(x, "pow");
  Tensor out = unary_scalar(UnaryOp::PowScalar, x, e);
  if (autograd::needs_grad(x)) {
    // e = 0 and e = 1 read nothing (the saved tensor is then never unpacked).
    autograd::record(
        "pow_scalar", {&x}, {&out},
        [xs = e == 0.0 || e == 1.0 ? autograd::SavedTensor() : autograd::save_input(x, 0), e,
         shape = x.sizes()](const autograd::Grads& g) {
          if (e == 0.0)
            return autograd::Grads{zeros(shape, TensorOptions(g[0].dtype(), g[0].device()))};
          if (e == 1.0) return autograd::Grads{g[0]};
          const Tensor& x = xs.unpack();
          if (e == 2.0) return autograd::Grads{mul(g[0], mul(x, 2.0))};
          return autograd::Grads{mul(g[0], mul(pow(x, e - 1.0), e))};
        });
  }
  return out;
}

// ---------------- comparisons (not differentiable) ----------------

namespace {
Tensor compare(const char* op, BinaryOp bop, const Tensor& a, const Tensor& b) {
  Prepared p;
  prepare(p, op, a, b, false);
  return run(bop, p);
}
Tensor compare_scalar(const char* op, BinaryOp bop, const Tensor& a, Scalar s) {
  ops::check_defined(a, op);
  DType dt = a.dtype();
  if (!s.is_int && !a.is_floating_point()) dt = kFloat64;
  Tensor st = scalar_tensor(s, TensorOptions(dt == kBool ? kInt64 : dt));
  return compare(op, bop, a, st);
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& a, Scalar b) { return compare_scalar("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, Scalar b) { return compare_scalar("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, Scalar b) { return compare_scalar("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, Scalar b) { return compare_scalar("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, Scalar b) { return compare_scalar("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, Scalar b) { return compare_scalar("ge", BinaryOp::Ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return compare("logical_and", BinaryOp::LogicalAnd, a, b);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return compare("logical_or", BinaryOp::LogicalOr, a, b);
}

bool equal(const Tensor& a, const Tensor& b) {
  ops::check_defined(a, "equal");
  ops::check_defined(b, "equal");
  if (a.sizes() != b.sizes()) return false;
  NoGradGuard ng;
  return logical_not(eq(a, b)).to(kInt64).sum().item<int64_t>() == 0;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  ops::check_defined(a, "allclose");
  ops::check_defined(b, "allclose");
  NoGradGuard ng;
  Tensor x = a.to(kFloat64), y = b.to(kFloat64);
  // |x - y| <= atol + rtol * |y|
  Tensor bad = gt(abs(sub(x, y)), add(mul(abs(y), rtol), atol));
  return bad.to(kInt64).sum().item<int64_t>() == 0;
}

// ---------------- Tensor sugar ----------------

Tensor Tensor::pow(Scalar e) const { return accel::pow(*this, e); }

}  // namespace accel
