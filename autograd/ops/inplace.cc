// In-place arithmetic methods of Tensor: copy_, fill_, add_/sub_, mul_, div_, clamp_*, pow_.
// Each runs its kernel on self and, when autograd must see it, records its backward as self's
// new history (Note [in-place ops] in autograd/function.h); without recording it is the kernel
// and a version bump, no allocation. They run kernels through the stubs, so they are ops and
// live above core (Note [core is self-contained] in core/raw.h). The unary in-place ops (exp_,
// relu_, ...) are in unary.cc beside their out-of-place ops, whose gradients they share.
#include <cmath>

#include "autograd/ops/common.h"
#include "core/raw.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(copy_, "copy_");
ACCEL_DIFFERENTIABLE_OP(fill_, "fill_");
ACCEL_DIFFERENTIABLE_OP(add_, "add_");
ACCEL_DIFFERENTIABLE_OP(sub_, "sub_");
ACCEL_DIFFERENTIABLE_OP(mul_, "mul_");
ACCEL_DIFFERENTIABLE_OP(div_, "div_");
ACCEL_DIFFERENTIABLE_OP(clamp_, "clamp_");
ACCEL_DIFFERENTIABLE_OP(clamp_min_, "clamp_min_");
ACCEL_DIFFERENTIABLE_OP(clamp_max_, "clamp_max_");
ACCEL_DIFFERENTIABLE_OP(pow_, "pow_");

namespace {

using autograd::Grads;
using autograd::InplaceOp;

// Operands of the tensor-tensor ops: same device, broadcastable to self (the result must fit).
void check_operand(const Tensor& self, const Tensor& o, const char* op) {
  ops::check_defined(self, op);
  ops::check_defined(o, op, "operand");
  ACCEL_CHECK(o.device() == self.device(), DeviceError, op,
              "tensors on different devices: ", self.device(), " and ", o.device());
  ACCEL_CHECK(is_broadcastable_to(o.sizes(), self.sizes()), ShapeError, op, "shape ", o.sizes(),
              " cannot be broadcast to ", self.sizes());
}

// The operand in self's dtype (differentiable: its gradient converts back).
Tensor in_self_dtype(const Tensor& self, const Tensor& o) {
  return o.dtype() == self.dtype() ? o : o.to(self.dtype());
}

// A floating result cannot be stored into an integer tensor (torch refuses the same).
void check_float_result(const Tensor& self, bool float_result, const char* op) {
  ACCEL_CHECK(!float_result || self.is_floating_point(), DTypeError, op,
              "the result is floating point and cannot be stored in place into a ", self.dtype(),
              " tensor of shape ", self.sizes());
}

// The gradient for self's old value of an op that overwrites it: zero where self had history.
// (Through a view it stays undefined: CopySlices zeroes the region.)
bool had_history(const Tensor& self) { return !self.is_view() && self.requires_grad(); }

Tensor& add_impl(Tensor& self, const Tensor& o, double alpha, const char* op) {
  check_operand(self, o, op);
  ACCEL_CHECK(!(alpha < 0 && self.dtype() == kBool), DTypeError, op,
              "subtraction of bool tensors is not supported");
  const Tensor oc = in_self_dtype(self, o);
  InplaceOp ip(self, op, {&oc});
  binary_stub(self.device(), BinaryOp::Add, self, oc, self, alpha);
  if (ip.commit()) {
    ip.record([so = oc.sizes(), alpha, go = oc.requires_grad()](const Grads& g) {
      return Grads{g[0], go ? sum_to(alpha == 1.0 ? g[0] : mul(g[0], alpha), so) : Tensor()};
    });
  }
  return self;
}

Tensor& add_scalar_impl(Tensor& self, Scalar s, bool negate, const char* op) {
  ops::check_defined(self, op);
  ACCEL_CHECK(self.is_floating_point() || s.is_int, DTypeError, op, "result dtype ", kDefaultFloat,
              " (", self.dtype(), " and the scalar ", s.to_double(),
              ") cannot be stored in place into a ", self.dtype(), " tensor");
  ACCEL_CHECK(self.dtype() != kBool, DTypeError, op, "result dtype ", kInt64,
              " cannot be stored in place into a bool tensor");
  const double v = negate ? -s.to_double() : s.to_double();
  InplaceOp ip(self, op);
  unary_stub(self.device(), UnaryOp::AddScalar, self, self, UnaryParams{v, 0});
  if (ip.commit()) ip.record([](const Grads& g) { return Grads{g[0]}; });
  return self;
}

Tensor& mul_scalar_impl(Tensor& self, double s, const char* op) {
  InplaceOp ip(self, op);
  unary_stub(self.device(), UnaryOp::MulScalar, self, self, UnaryParams{s, 0});
  if (ip.commit()) ip.record([s](const Grads& g) { return Grads{mul(g[0], s)}; });
  return self;
}

Tensor& clamp_impl(Tensor& self, double lo, double hi, const char* op) {
  ops::check_defined(self, op);
  ACCEL_CHECK(!(lo > hi), ValueError, op, "min ", lo, " is greater than max ", hi);
  InplaceOp ip(self, op);
  // The gradient passes where the old value was inside [lo, hi]: keep that mask, not the value.
  const Tensor pass = ip.recording() ? logical_and(ge(self, lo), le(self, hi)) : Tensor();
  unary_stub(self.device(), UnaryOp::Clamp, self, self, UnaryParams{lo, hi});
  if (ip.commit()) {
    ip.record([pass](const Grads& g) { return Grads{mul(g[0], pass.to(g[0].dtype()))}; });
  }
  return self;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  ops::check_defined(*this, "copy_");
  ops::check_defined(src, "copy_", "source");
  ACCEL_CHECK(is_broadcastable_to(src.sizes(), sizes()), ShapeError, "copy_", "source shape ",
              src.sizes(), " cannot be broadcast to destination shape ", sizes());
  InplaceOp ip(*this, "copy_", {&src});
  const bool zero_old = ip.recording() && had_history(*this);
  raw::copy_(*this, src, /*bump_version=*/false);
  if (ip.commit()) {
    ip.record([ss = src.sizes(), sdt = src.dtype(), sdev = src.device(), gs = src.requires_grad(),
               zero_old](const Grads& g) {
      Tensor gsrc;
      if (gs) {  // the source was broadcast, converted and moved: undo each
        gsrc = sum_to(g[0], ss);
        if (gsrc.dtype() != sdt) gsrc = gsrc.to(sdt);
        if (gsrc.device() != sdev) gsrc = gsrc.to(sdev);
      }
      return Grads{zero_old ? zeros_like(g[0]) : Tensor(), gsrc};
    });
  }
  return *this;
}

Tensor& Tensor::fill_(Scalar v) {
  ops::check_defined(*this, "fill_");
  InplaceOp ip(*this, "fill_");
  const bool zero_old = ip.recording() && had_history(*this);
  fill_stub(device(), *this, v);
  if (ip.commit()) {
    ip.record([zero_old](const Grads& g) { return Grads{zero_old ? zeros_like(g[0]) : Tensor()}; });
  }
  return *this;
}

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) {
  return add_impl(*this, o, alpha.to_double(), "add_");
}
Tensor& Tensor::sub_(const Tensor& o, Scalar alpha) {
  return add_impl(*this, o, -alpha.to_double(), "sub_");
}
Tensor& Tensor::add_(Scalar other) { return add_scalar_impl(*this, other, false, "add_"); }
Tensor& Tensor::sub_(Scalar other) { return add_scalar_impl(*this, other, true, "sub_"); }

Tensor& Tensor::mul_(const Tensor& o) {
  check_operand(*this, o, "mul_");
  const Tensor oc = in_self_dtype(*this, o);
  InplaceOp ip(*this, "mul_", {&oc});
  // d self_old = g * other (reads other); d other = g * self_old (reads the old value: a copy).
  const autograd::SavedTensor other =
      ip.recording() && requires_grad() ? autograd::save_input(oc, 1) : autograd::SavedTensor();
  // clone(): the old value keeps its history, for a graph recorded from the gradient (Note
  // [double backward] in autograd/engine.h).
  const Tensor old = ip.recording() && oc.requires_grad() ? clone() : Tensor();
  binary_stub(device(), BinaryOp::Mul, *this, oc, *this, 1.0);
  if (ip.commit()) {
    ip.record([other, old, so = oc.sizes()](const Grads& g) {
      return Grads{other.defined() ? accel::mul(g[0], other.unpack()) : Tensor(),
                   old.defined() ? sum_to(accel::mul(g[0], old), so) : Tensor()};
    });
  }
  return *this;
}

Tensor& Tensor::mul_(Scalar s) {
  ops::check_defined(*this, "mul_");
  check_float_result(*this, !s.is_int, "mul_");
  return mul_scalar_impl(*this, s.to_double(), "mul_");
}

Tensor& Tensor::div_(Scalar s) {
  ops::check_defined(*this, "div_");
  check_float_result(*this, true, "div_");  // true division
  return mul_scalar_impl(*this, 1.0 / s.to_double(), "div_");
}

Tensor& Tensor::div_(const Tensor& o) {
  check_operand(*this, o, "div_");
  check_float_result(*this, true, "div_");
  const Tensor oc = in_self_dtype(*this, o);
  InplaceOp ip(*this, "div_", {&oc});
  // d self_old = g / other; d other = -g * self_old / other^2.
  const autograd::SavedTensor other =
      ip.recording() ? autograd::save_input(oc, 1) : autograd::SavedTensor();
  // clone(): the old value keeps its history, for a graph recorded from the gradient (Note
  // [double backward] in autograd/engine.h).
  const Tensor old = ip.recording() && oc.requires_grad() ? clone() : Tensor();
  binary_stub(device(), BinaryOp::Div, *this, oc, *this, 1.0);
  if (ip.commit()) {
    ip.record([other, old, so = oc.sizes()](const Grads& g) {
      const Tensor& y = other.unpack();
      const Tensor ga = accel::div(g[0], y);
      return Grads{ga, old.defined() ? sum_to(accel::neg(accel::mul(ga, accel::div(old, y))), so)
                                     : Tensor()};
    });
  }
  return *this;
}

Tensor& Tensor::clamp_(Scalar lo, Scalar hi) {
  return clamp_impl(*this, lo.to_double(), hi.to_double(), "clamp_");
}
Tensor& Tensor::clamp_min_(Scalar lo) {
  return clamp_impl(*this, lo.to_double(), INFINITY, "clamp_min_");
}
Tensor& Tensor::clamp_max_(Scalar hi) {
  return clamp_impl(*this, -INFINITY, hi.to_double(), "clamp_max_");
}

Tensor& Tensor::pow_(Scalar exponent) {
  ops::check_defined(*this, "pow_");
  const double e = exponent.to_double();
  check_float_result(*this, !exponent.is_int || e < 0, "pow_");
  InplaceOp ip(*this, "pow_");
  const Tensor old = ip.recording() ? clone() : Tensor();  // d/dx x^e reads x (with its history)
  unary_stub(device(), UnaryOp::PowScalar, *this, *this, UnaryParams{e, 0});
  if (ip.commit()) {
    ip.record([old, e](const Grads& g) {
      if (e == 0.0) return Grads{zeros_like(old)};
      if (e == 1.0) return Grads{g[0]};
      return Grads{accel::mul(g[0], accel::mul(accel::pow(old, e - 1.0), e))};
    });
  }
  return *this;
}

Tensor& Tensor::pow_(const Tensor& exponent) {
  check_operand(*this, exponent, "pow_");
  check_float_result(*this, true, "pow_");
  // pow's backward reads its base: self's old value, hence reads_self.
  return autograd::inplace_method(
      *this, "pow_", {exponent},
      [](const Tensor& s, const std::vector<Tensor>& o) {
        return accel::pow(s, ops::as_dtype(o[0], s.dtype()));
      },
      /*reads_self=*/true);
}

}  // namespace accel
