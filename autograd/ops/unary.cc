// Unary elementwise ops, where, masked_fill, clamp: forward and backward together.
//   x: (...) -> out: (...) same shape; integer inputs of float-valued ops become float32.
#include <cmath>
#include <cstring>

#include "autograd/ops/common.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(neg, "neg");
ACCEL_DIFFERENTIABLE_OP(exp, "exp");
ACCEL_DIFFERENTIABLE_OP(log, "log");
ACCEL_DIFFERENTIABLE_OP(sqrt, "sqrt");
ACCEL_DIFFERENTIABLE_OP(rsqrt, "rsqrt");
ACCEL_DIFFERENTIABLE_OP(abs, "abs");
ACCEL_DIFFERENTIABLE_OP(tanh, "tanh");
ACCEL_DIFFERENTIABLE_OP(sigmoid, "sigmoid");
ACCEL_DIFFERENTIABLE_OP(relu, "relu");
ACCEL_DIFFERENTIABLE_OP(gelu_erf, "gelu_erf");
ACCEL_DIFFERENTIABLE_OP(gelu_tanh, "gelu_tanh");
ACCEL_DIFFERENTIABLE_OP(silu, "silu");
ACCEL_DIFFERENTIABLE_OP(sin, "sin");
ACCEL_DIFFERENTIABLE_OP(cos, "cos");
ACCEL_DIFFERENTIABLE_OP(reciprocal, "reciprocal");
ACCEL_DIFFERENTIABLE_OP(square, "square");
ACCEL_DIFFERENTIABLE_OP(log1p, "log1p");
ACCEL_DIFFERENTIABLE_OP(expm1, "expm1");
ACCEL_DIFFERENTIABLE_OP(erf, "erf");
ACCEL_DIFFERENTIABLE_OP(clamp, "clamp");
ACCEL_DIFFERENTIABLE_OP(where, "where");
ACCEL_DIFFERENTIABLE_OP(masked_fill, "masked_fill");
ACCEL_DIFFERENTIABLE_OP(masked_fill_, "masked_fill_");
ACCEL_DIFFERENTIABLE_OP(neg_, "neg_");
ACCEL_DIFFERENTIABLE_OP(exp_, "exp_");
ACCEL_DIFFERENTIABLE_OP(log_, "log_");
ACCEL_DIFFERENTIABLE_OP(sqrt_, "sqrt_");
ACCEL_DIFFERENTIABLE_OP(rsqrt_, "rsqrt_");
ACCEL_DIFFERENTIABLE_OP(abs_, "abs_");
ACCEL_DIFFERENTIABLE_OP(relu_, "relu_");
ACCEL_DIFFERENTIABLE_OP(sigmoid_, "sigmoid_");
ACCEL_DIFFERENTIABLE_OP(tanh_, "tanh_");
ACCEL_DIFFERENTIABLE_OP(sin_, "sin_");
ACCEL_DIFFERENTIABLE_OP(cos_, "cos_");
ACCEL_DIFFERENTIABLE_OP(reciprocal_, "reciprocal_");
ACCEL_DIFFERENTIABLE_OP(square_, "square_");
ACCEL_DIFFERENTIABLE_OP(log1p_, "log1p_");
ACCEL_DIFFERENTIABLE_OP(expm1_, "expm1_");
ACCEL_DIFFERENTIABLE_OP(erf_, "erf_");

namespace {

constexpr double kTwoOverSqrtPi = 1.12837916709551257390;

Tensor run_unary(UnaryOp op, const Tensor& x, DType out_dtype, UnaryParams p = {}) {
  Tensor out = ops::empty_on(x.sizes(), out_dtype, x.device());
  unary_stub(x.device(), op, x, out, p);
  return out;
}

// Float-valued op: integer input is converted to the default float type first.
Tensor float_input(const Tensor& x, const char* op) {
  ops::check_defined(x, op);
  return x.is_floating_point() ? x : x.to(kDefaultFloat);
}

// Backward that needs the input x.
template <typename F>
Tensor unary_x(const char* name, UnaryOp op, const Tensor& x0, F grad_fn) {
  Tensor x = float_input(x0, name);
  Tensor out = run_unary(op, x, x.dtype());
  if (autograd::needs_grad(x)) {
    autograd::record(name, {&x}, {&out},
                     [xs = autograd::save_input(x, 0), grad_fn](const autograd::Grads& g) {
                       return autograd::Grads{grad_fn(g[0], xs.unpack())};
                     });
  }
  return out;
}

// Backward that needs the output y.
template <typename F>
Tensor unary_y(const char* name, UnaryOp op, const Tensor& x0, F grad_fn) {
  Tensor x = float_input(x0, name);
  Tensor out = run_unary(op, x, x.dtype());
  if (autograd::needs_grad(x)) {
    autograd::record(name, {&x}, {&out},
                     [ys = autograd::save_output(out), grad_fn](const autograd::Grads& g) {
                       return autograd::Grads{grad_fn(g[0], ys.unpack())};
                     });
  }
  return out;
}

// The in-place form of a unary op (Note [in-place ops] in autograd/function.h): the kernel writes
// self; the backward is the out-of-place op's `grad_fn(g, t)`, where t is the output (what self
// holds after the op: saved, so a later write to self is a version error) or, for ops whose
// gradient needs the input (`reads_input`), a copy of self's old value taken before the write.
// `float_only`: the op's result is floating point, so an integer self is refused.
template <typename F>
Tensor& unary_inplace(Tensor& self, const char* name, UnaryOp op, bool float_only, bool reads_input,
                      F grad_fn) {
  ops::check_defined(self, name);
  ACCEL_CHECK(!float_only || self.is_floating_point(), DTypeError, name,
              "the result is floating point and cannot be stored in place into a ", self.dtype(),
              " tensor of shape ", self.sizes());
  autograd::InplaceOp ip(self, name);
  // clone(): the old value with its history, for a graph recorded from the gradient (Note
  // [double backward] in autograd/engine.h).
  const Tensor old = ip.recording() && reads_input ? self.clone() : Tensor();
  unary_stub(self.device(), op, self, self, UnaryParams{});
  if (ip.commit()) {
    if (reads_input) {
      ip.record(
          [old, grad_fn](const autograd::Grads& g) { return autograd::Grads{grad_fn(g[0], old)}; });
    } else {
      ip.record([ys = autograd::save_output(self), grad_fn](const autograd::Grads& g) {
        return autograd::Grads{grad_fn(g[0], ys.unpack())};
      });
    }
  }
  return self;
}

Tensor binary_helper(BinaryOp op, const Tensor& g, const Tensor& x) {
  Tensor out = ops::empty_on(g.sizes(), g.dtype(), g.device());
  binary_stub(g.device(), op, g, x.dtype() == g.dtype() ? x : x.to(g.dtype()), out, 1.0);
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) {
  ops::check_defined(x, "neg");
  ACCEL_CHECK(x.dtype() != kBool, DTypeError, "neg", "negation of a bool tensor is not supported");
  Tensor out = run_unary(UnaryOp::Neg, x, x.dtype());
  if (autograd::needs_grad(x)) {
    autograd::record("neg", {&x}, {&out},
                     [](const autograd::Grads& g) { return autograd::Grads{neg(g[0])}; });
  }
  return out;
}

namespace {
// Gradients shared by the out-of-place ops and their in-place forms: g times the derivative,
// from the input x or the output y.
Tensor exp_grad(const Tensor& g, const Tensor& y) { return mul(g, y); }
Tensor log_grad(const Tensor& g, const Tensor& x) { return div(g, x); }
Tensor sqrt_grad(const Tensor& g, const Tensor& y) { return div(g, mul(y, 2.0)); }
// d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
Tensor rsqrt_grad(const Tensor& g, const Tensor& y) { return mul(mul(g, mul(y, mul(y, y))), -0.5); }
Tensor abs_grad(const Tensor& g, const Tensor& x) { return mul(g, sign(x)); }
// The fused gradient kernels below (tanh, sigmoid, relu, gelu, silu) record no graph: under
// create_graph (Note [double backward] in autograd/engine.h) the same derivative is composed
// from differentiable ops instead.
Tensor tanh_grad(const Tensor& g, const Tensor& y) {
  if (autograd::creating_graph()) return mul(g, rsub(mul(y, y), 1.0));  // g (1 - y^2)
  return binary_helper(BinaryOp::TanhGrad, g, y);
}
Tensor sigmoid_grad(const Tensor& g, const Tensor& y) {
  if (autograd::creating_graph()) return mul(g, mul(y, rsub(y, 1.0)));  // g y (1 - y)
  return binary_helper(BinaryOp::SigmoidGrad, g, y);
}
// From x or from y = relu(x): x > 0 exactly where y > 0.
Tensor relu_grad(const Tensor& g, const Tensor& x_or_y) {
  if (autograd::creating_graph()) return mul(g, gt(x_or_y, 0.0).to(g.dtype()));
  return binary_helper(BinaryOp::ReluGrad, g, x_or_y);
}
// d/dx x Phi(x) = Phi(x) + x phi(x), Phi the normal CDF and phi its density.
Tensor gelu_erf_grad(const Tensor& g, const Tensor& x) {
  if (!autograd::creating_graph()) return binary_helper(BinaryOp::GeluErfGrad, g, x);
  constexpr double kInvSqrt2 = 0.70710678118654752440, kInvSqrt2Pi = 0.39894228040143267794;
  const Tensor cdf = mul(add(erf(mul(x, kInvSqrt2)), 1.0), 0.5);
  const Tensor pdf = mul(exp(mul(mul(x, x), -0.5)), kInvSqrt2Pi);
  return mul(g, add(cdf, mul(x, pdf)));
}
// y = x/2 (1 + tanh(u)), u = k (x + c x^3): dy/dx = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2).
Tensor gelu_tanh_grad(const Tensor& g, const Tensor& x) {
  if (!autograd::creating_graph()) return binary_helper(BinaryOp::GeluTanhGrad, g, x);
  constexpr double kK = 0.79788456080286535588, kC = 0.044715;  // sqrt(2 / pi)
  const Tensor x2 = mul(x, x);
  const Tensor t = tanh(mul(add(x, mul(mul(x2, x), kC)), kK));
  const Tensor du = mul(add(mul(x2, 3.0 * kC), 1.0), kK);
  return mul(g, mul(add(add(t, 1.0), mul(mul(x, rsub(mul(t, t), 1.0)), du)), 0.5));
}
// d/dx x s(x) = s (1 + x (1 - s)), s the sigmoid.
Tensor silu_grad(const Tensor& g, const Tensor& x) {
  if (!autograd::creating_graph()) return binary_helper(BinaryOp::SiluGrad, g, x);
  const Tensor s = sigmoid(x);
  return mul(g, mul(s, add(mul(x, rsub(s, 1.0)), 1.0)));
}
Tensor sin_grad(const Tensor& g, const Tensor& x) { return mul(g, cos(x)); }
Tensor cos_grad(const Tensor& g, const Tensor& x) { return neg(mul(g, sin(x))); }
Tensor reciprocal_grad(const Tensor& g, const Tensor& y) { return neg(mul(g, mul(y, y))); }
Tensor square_grad(const Tensor& g, const Tensor& x) { return mul(g, mul(x, 2.0)); }
Tensor log1p_grad(const Tensor& g, const Tensor& x) { return div(g, add(x, 1.0)); }
Tensor expm1_grad(const Tensor& g, const Tensor& y) { return mul(g, add(y, 1.0)); }
Tensor erf_grad(const Tensor& g, const Tensor& x) {
  return mul(g, mul(exp(neg(mul(x, x))), kTwoOverSqrtPi));
}
}  // namespace

Tensor exp(const Tensor& x) { return unary_y("exp", UnaryOp::Exp, x, exp_grad); }
Tensor log(const Tensor& x) { return unary_x("log", UnaryOp::Log, x, log_grad); }
Tensor sqrt(const Tensor& x) { return unary_y("sqrt", UnaryOp::Sqrt, x, sqrt_grad); }
Tensor rsqrt(const Tensor& x) { return unary_y("rsqrt", UnaryOp::Rsqrt, x, rsqrt_grad); }
Tensor abs(const Tensor& x) {
  ops::check_defined(x, "abs");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Abs, x, x.dtype());
  return unary_x("abs", UnaryOp::Abs, x, abs_grad);
}
Tensor tanh(const Tensor& x) { return unary_y("tanh", UnaryOp::Tanh, x, tanh_grad); }
Tensor sigmoid(const Tensor& x) { return unary_y("sigmoid", UnaryOp::Sigmoid, x, sigmoid_grad); }
Tensor relu(const Tensor& x) {
  ops::check_defined(x, "relu");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Relu, x, x.dtype());
  return unary_x("relu", UnaryOp::Relu, x, relu_grad);
}
Tensor gelu(const Tensor& x, const char* approximate) {
  const bool tanh_approx = approximate && std::strcmp(approximate, "tanh") == 0;
  ACCEL_CHECK(tanh_approx || !approximate || std::strcmp(approximate, "none") == 0, ValueError,
              "gelu", "approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  if (tanh_approx) return unary_x("gelu_tanh", UnaryOp::GeluTanh, x, gelu_tanh_grad);
  return unary_x("gelu_erf", UnaryOp::GeluErf, x, gelu_erf_grad);
}
Tensor silu(const Tensor& x) { return unary_x("silu", UnaryOp::Silu, x, silu_grad); }
Tensor sin(const Tensor& x) { return unary_x("sin", UnaryOp::Sin, x, sin_grad); }
Tensor cos(const Tensor& x) { return unary_x("cos", UnaryOp::Cos, x, cos_grad); }
Tensor sign(const Tensor& x) {
  ops::check_defined(x, "sign");
  return run_unary(UnaryOp::Sign, x, x.dtype());  // gradient is zero almost everywhere
}
Tensor reciprocal(const Tensor& x) {
  return unary_y("reciprocal", UnaryOp::Reciprocal, x, reciprocal_grad);
}
Tensor square(const Tensor& x) {
  ops::check_defined(x, "square");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Square, x, x.dtype());
  return unary_x("square", UnaryOp::Square, x, square_grad);
}
Tensor log1p(const Tensor& x) { return unary_x("log1p", UnaryOp::Log1p, x, log1p_grad); }
Tensor expm1(const Tensor& x) { return unary_y("expm1", UnaryOp::Expm1, x, expm1_grad); }
Tensor erf(const Tensor& x) { return unary_x("erf", UnaryOp::Erf, x, erf_grad); }

Tensor logical_not(const Tensor& x) {
  ops::check_defined(x, "logical_not");
  return run_unary(UnaryOp::LogicalNot, x, kBool);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi) {
  ops::check_defined(x, "clamp");
  ACCEL_CHECK(lo || hi, ValueError, "clamp", "at least one of min and max must be given");
  const double l = lo ? lo->to_double() : -INFINITY;
  const double h = hi ? hi->to_double() : INFINITY;
  ACCEL_CHECK(!(l > h), ValueError, "clamp", "min ", l, " is greater than max ", h);
  Tensor out = run_unary(UnaryOp::Clamp, x, x.dtype(), UnaryParams{l, h});
  if (autograd::needs_grad(x)) {
    autograd::record("clamp", {&x}, {&out},
                     [xs = autograd::save_input(x, 0), l, h](const autograd::Grads& g) {
                       const Tensor& x = xs.unpack();
                       Tensor pass = logical_and(ge(x, l), le(x, h));
                       return autograd::Grads{mul(g[0], pass.to(g[0].dtype()))};
                     });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  ops::check_defined(cond, "where", "condition");
  ops::check_defined(a, "where");
  ops::check_defined(b, "where");
  ACCEL_CHECK(cond.dtype() == kBool, DTypeError, "where", "condition must be bool, got ",
              cond.dtype());
  ops::check_same_device(cond, a, "where");
  ops::check_same_device(a, b, "where");
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor x = ops::as_dtype(a, dt), y = ops::as_dtype(b, dt);
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor out = ops::empty_on(shape, dt, a.device());
  where_stub(a.device(), cond, x, y, out);
  if (autograd::needs_grad(x, y)) {
    autograd::record(
        "where", {&x, &y}, {&out},
        [cs = autograd::save_input(cond, 0), sa = x.sizes(),
         sb = y.sizes()](const autograd::Grads& g) {
          const Tensor& c = cs.unpack();
          Tensor z = zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
          return autograd::Grads{sum_to(where(c, g[0], z), sa), sum_to(where(c, z, g[0]), sb)};
        });
  }
  return out;
}

namespace {
// The dtype of a tensor meeting a python-number scalar, as torch promotes them: a floating
// tensor keeps its dtype, a fractional scalar makes an integer or bool tensor float32, and an
// integer scalar makes a bool tensor int64.
DType with_scalar_dtype(DType t, Scalar s) {
  if (is_floating(t)) return t;
  if (!s.is_int) return kDefaultFloat;
  return t == kBool ? kInt64 : t;
}
}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  ops::check_defined(a, "where");
  const DType dt = with_scalar_dtype(a.dtype(), b);
  return where(cond, ops::as_dtype(a, dt), full({}, b, TensorOptions(dt, a.device())));
}

Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  ops::check_defined(b, "where");
  const DType dt = with_scalar_dtype(b.dtype(), a);
  return where(cond, full({}, a, TensorOptions(dt, b.device())), ops::as_dtype(b, dt));
}

// Two scalars: int64 when both are integers, else float32 (torch's default dtype).
Tensor where(const Tensor& cond, Scalar a, Scalar b) {
  ops::check_defined(cond, "where", "condition");
  const DType dt = a.is_int && b.is_int ? kInt64 : kDefaultFloat;
  const TensorOptions opt(dt, cond.device());
  return where(cond, full({}, a, opt), full({}, b, opt));
}

namespace {
void check_masked_fill(const Tensor& x, const Tensor& mask, const char* op) {
  ops::check_defined(x, op);
  ops::check_defined(mask, op, "mask");
  ACCEL_CHECK(mask.dtype() == kBool, DTypeError, op, "mask must be bool, got ", mask.dtype(),
              " of shape ", mask.sizes());
  ACCEL_CHECK(is_broadcastable_to(mask.sizes(), x.sizes()), ShapeError, op, "mask of shape ",
              mask.sizes(), " cannot be broadcast to input shape ", x.sizes());
  ops::check_same_device(x, mask, op);
}
}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  check_masked_fill(x, mask, "masked_fill");
  Tensor v = full({}, value, TensorOptions(x.dtype(), x.device()));
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  where_stub(x.device(), mask, v, x, out);
  if (autograd::needs_grad(x)) {
    autograd::record("masked_fill", {&x}, {&out},
                     [ms = autograd::save_input(mask, 1)](const autograd::Grads& g) {
                       Tensor z = zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
                       return autograd::Grads{where(ms.unpack(), z, g[0])};
                     });
  }
  return out;
}

// Note [in-place methods]: masked_fill stored into self, or where's kernel run in place.
Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) {
  check_masked_fill(*this, mask, "masked_fill_");
  return autograd::inplace_method(
      *this, "masked_fill_", {},
      [&](const Tensor& s, const std::vector<Tensor>&) {
        return accel::masked_fill(s, mask, value);
      },
      /*reads_self=*/false,
      [&](Tensor& s) {
        const Tensor v = full({}, value, TensorOptions(s.dtype(), s.device()));
        where_stub(s.device(), mask, v, s, s);
      });
}

// ---------------- in-place forms ----------------
// float_only: the op makes an integer input floating; reads_input: its gradient needs the input.

Tensor& Tensor::neg_() {
  ops::check_defined(*this, "neg_");
  ACCEL_CHECK(dtype() != kBool, DTypeError, "neg_", "negation of a bool tensor is not supported");
  autograd::InplaceOp ip(*this, "neg_");
  unary_stub(device(), UnaryOp::Neg, *this, *this, UnaryParams{});
  if (ip.commit())
    ip.record([](const autograd::Grads& g) { return autograd::Grads{accel::neg(g[0])}; });
  return *this;
}
Tensor& Tensor::exp_() { return unary_inplace(*this, "exp_", UnaryOp::Exp, true, false, exp_grad); }
Tensor& Tensor::log_() { return unary_inplace(*this, "log_", UnaryOp::Log, true, true, log_grad); }
Tensor& Tensor::sqrt_() {
  return unary_inplace(*this, "sqrt_", UnaryOp::Sqrt, true, false, sqrt_grad);
}
Tensor& Tensor::rsqrt_() {
  return unary_inplace(*this, "rsqrt_", UnaryOp::Rsqrt, true, false, rsqrt_grad);
}
Tensor& Tensor::abs_() { return unary_inplace(*this, "abs_", UnaryOp::Abs, false, true, abs_grad); }
Tensor& Tensor::relu_() {
  return unary_inplace(*this, "relu_", UnaryOp::Relu, false, false, relu_grad);
}
Tensor& Tensor::sigmoid_() {
  return unary_inplace(*this, "sigmoid_", UnaryOp::Sigmoid, true, false, sigmoid_grad);
}
Tensor& Tensor::tanh_() {
  return unary_inplace(*this, "tanh_", UnaryOp::Tanh, true, false, tanh_grad);
}
Tensor& Tensor::sin_() { return unary_inplace(*this, "sin_", UnaryOp::Sin, true, true, sin_grad); }
Tensor& Tensor::cos_() { return unary_inplace(*this, "cos_", UnaryOp::Cos, true, true, cos_grad); }
Tensor& Tensor::reciprocal_() {
  return unary_inplace(*this, "reciprocal_", UnaryOp::Reciprocal, true, false, reciprocal_grad);
}
Tensor& Tensor::square_() {
  return unary_inplace(*this, "square_", UnaryOp::Square, false, true, square_grad);
}
Tensor& Tensor::log1p_() {
  return unary_inplace(*this, "log1p_", UnaryOp::Log1p, true, true, log1p_grad);
}
Tensor& Tensor::expm1_() {
  return unary_inplace(*this, "expm1_", UnaryOp::Expm1, true, false, expm1_grad);
}
Tensor& Tensor::erf_() { return unary_inplace(*this, "erf_", UnaryOp::Erf, true, true, erf_grad); }

// ---------------- Tensor sugar ----------------
Tensor Tensor::exp() const { return accel::exp(*this); }
Tensor Tensor::log() const { return accel::log(*this); }
Tensor Tensor::abs() const { return accel::abs(*this); }
Tensor Tensor::sqrt() const { return accel::sqrt(*this); }
Tensor Tensor::relu() const { return accel::relu(*this); }

}  // namespace accel
