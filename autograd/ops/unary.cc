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
    autograd::record(name, {&x}, {&out}, [xs = x.detach(), grad_fn](const autograd::Grads& g) {
      return autograd::Grads{grad_fn(g[0], xs)};
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
    autograd::record(name, {&x}, {&out}, [ys = out.detach(), grad_fn](const autograd::Grads& g) {
      return autograd::Grads{grad_fn(g[0], ys)};
    });
  }
  return out;
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

Tensor exp(const Tensor& x) {
  return unary_y("exp", UnaryOp::Exp, x,
                 [](const Tensor& g, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return unary_x("log", UnaryOp::Log, x,
                 [](const Tensor& g, const Tensor& x) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return unary_y("sqrt", UnaryOp::Sqrt, x,
                 [](const Tensor& g, const Tensor& y) { return div(g, mul(y, 2.0)); });
}
Tensor rsqrt(const Tensor& x) {
  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  return unary_y("rsqrt", UnaryOp::Rsqrt, x, [](const Tensor& g, const Tensor& y) {
    return mul(mul(g, mul(y, mul(y, y))), -0.5);
  });
}
Tensor abs(const Tensor& x) {
  ops::check_defined(x, "abs");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Abs, x, x.dtype());
  return unary_x("abs", UnaryOp::Abs, x,
                 [](const Tensor& g, const Tensor& x) { return mul(g, sign(x)); });
}
Tensor tanh(const Tensor& x) {
  return unary_y("tanh", UnaryOp::Tanh, x, [](const Tensor& g, const Tensor& y) {
    return binary_helper(BinaryOp::TanhGrad, g, y);
  });
}
Tensor sigmoid(const Tensor& x) {
  return unary_y("sigmoid", UnaryOp::Sigmoid, x, [](const Tensor& g, const Tensor& y) {
    return binary_helper(BinaryOp::SigmoidGrad, g, y);
  });
}
Tensor relu(const Tensor& x) {
  ops::check_defined(x, "relu");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Relu, x, x.dtype());
  return unary_x("relu", UnaryOp::Relu, x, [](const Tensor& g, const Tensor& x) {
    return binary_helper(BinaryOp::ReluGrad, g, x);
  });
}
Tensor gelu(const Tensor& x, const char* approximate) {
  const bool tanh_approx = approximate && std::strcmp(approximate, "tanh") == 0;
  ACCEL_CHECK(tanh_approx || !approximate || std::strcmp(approximate, "none") == 0, ValueError,
              "gelu", "approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  if (tanh_approx) {
    return unary_x("gelu_tanh", UnaryOp::GeluTanh, x, [](const Tensor& g, const Tensor& x) {
      return binary_helper(BinaryOp::GeluTanhGrad, g, x);
    });
  }
  return unary_x("gelu_erf", UnaryOp::GeluErf, x, [](const Tensor& g, const Tensor& x) {
    return binary_helper(BinaryOp::GeluErfGrad, g, x);
  });
}
Tensor silu(const Tensor& x) {
  return unary_x("silu", UnaryOp::Silu, x, [](const Tensor& g, const Tensor& x) {
    return binary_helper(BinaryOp::SiluGrad, g, x);
  });
}
Tensor sin(const Tensor& x) {
  return unary_x("sin", UnaryOp::Sin, x,
                 [](const Tensor& g, const Tensor& x) { return mul(g, cos(x)); });
}
Tensor cos(const Tensor& x) {
  return unary_x("cos", UnaryOp::Cos, x,
                 [](const Tensor& g, const Tensor& x) { return neg(mul(g, sin(x))); });
}
Tensor sign(const Tensor& x) {
  ops::check_defined(x, "sign");
  return run_unary(UnaryOp::Sign, x, x.dtype());  // gradient is zero almost everywhere
}
Tensor reciprocal(const Tensor& x) {
  return unary_y("reciprocal", UnaryOp::Reciprocal, x,
                 [](const Tensor& g, const Tensor& y) { return neg(mul(g, mul(y, y))); });
}
Tensor square(const Tensor& x) {
  ops::check_defined(x, "square");
  if (!x.is_floating_point()) return run_unary(UnaryOp::Square, x, x.dtype());
  return unary_x("square", UnaryOp::Square, x,
                 [](const Tensor& g, const Tensor& x) { return mul(g, mul(x, 2.0)); });
}
Tensor log1p(const Tensor& x) {
  return unary_x("log1p", UnaryOp::Log1p, x,
                 [](const Tensor& g, const Tensor& x) { return div(g, add(x, 1.0)); });
}
Tensor expm1(const Tensor& x) {
  return unary_y("expm1", UnaryOp::Expm1, x,
                 [](const Tensor& g, const Tensor& y) { return mul(g, add(y, 1.0)); });
}
Tensor erf(const Tensor& x) {
  return unary_x("erf", UnaryOp::Erf, x, [](const Tensor& g, const Tensor& x) {
    return mul(g, mul(exp(neg(mul(x, x))), kTwoOverSqrtPi));
  });
}

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
    autograd::record("clamp", {&x}, {&out}, [xs = x.detach(), l, h](const autograd::Grads& g) {
      Tensor pass = logical_and(ge(xs, l), le(xs, h));
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
        [c = cond, sa = x.sizes(), sb = y.sizes()](const autograd::Grads& g) {
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

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  ops::check_defined(x, "masked_fill");
  ops::check_defined(mask, "masked_fill", "mask");
  ACCEL_CHECK(mask.dtype() == kBool, DTypeError, "masked_fill", "mask must be bool, got ",
              mask.dtype(), " of shape ", mask.sizes());
  ACCEL_CHECK(is_broadcastable_to(mask.sizes(), x.sizes()), ShapeError, "masked_fill",
              "mask of shape ", mask.sizes(), " cannot be broadcast to input shape ", x.sizes());
  ops::check_same_device(x, mask, "masked_fill");
  Tensor v = full({}, value, TensorOptions(x.dtype(), x.device()));
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  where_stub(x.device(), mask, v, x, out);
  if (autograd::needs_grad(x)) {
    autograd::record("masked_fill", {&x}, {&out}, [m = mask](const autograd::Grads& g) {
      Tensor z = zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
      return autograd::Grads{where(m, z, g[0])};
    });
  }
  return out;
}

// ---------------- Tensor sugar ----------------
Tensor Tensor::exp() const { return accel::exp(*this); }
Tensor Tensor::log() const { return accel::log(*this); }
Tensor Tensor::abs() const { return accel::abs(*this); }
Tensor Tensor::sqrt() const { return accel::sqrt(*this); }
Tensor Tensor::relu() const { return accel::relu(*this); }

}  // namespace accel
