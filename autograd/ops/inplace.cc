// In-place arithmetic methods of Tensor (add_, mul_, div_, clamp_). They run kernels through the
// elementwise stubs, so they are ops and live above core (Note [core is self-contained] in
// core/raw.h). Like copy_ and fill_ they are not recorded by autograd.
#include "core/raw.h"
#include "kernels/stubs/elementwise.h"

namespace accel {

using raw::check_inplace;

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) {
  check_inplace(*this, "add_");
  ACCEL_CHECK(o.device() == device(), DeviceError, "add_",
              "tensors on different devices: ", device(), " and ", o.device());
  ACCEL_CHECK(is_broadcastable_to(o.sizes(), sizes()), ShapeError, "add_", "shape ", o.sizes(),
              " cannot be broadcast to ", sizes());
  Tensor b = raw::to_dtype(o, dtype());
  binary_stub(device(), BinaryOp::Add, *this, b, *this, alpha.to_double());
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(const Tensor& o) {
  check_inplace(*this, "mul_");
  ACCEL_CHECK(o.device() == device(), DeviceError, "mul_",
              "tensors on different devices: ", device(), " and ", o.device());
  ACCEL_CHECK(is_broadcastable_to(o.sizes(), sizes()), ShapeError, "mul_", "shape ", o.sizes(),
              " cannot be broadcast to ", sizes());
  Tensor b = raw::to_dtype(o, dtype());
  binary_stub(device(), BinaryOp::Mul, *this, b, *this, 1.0);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(Scalar s) {
  check_inplace(*this, "mul_");
  UnaryParams p{s.to_double(), 0};
  unary_stub(device(), UnaryOp::MulScalar, *this, *this, p);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::div_(Scalar s) { return mul_(1.0 / s.to_double()); }

Tensor& Tensor::clamp_(Scalar lo, Scalar hi) {
  check_inplace(*this, "clamp_");
  UnaryParams p{lo.to_double(), hi.to_double()};
  unary_stub(device(), UnaryOp::Clamp, *this, *this, p);
  storage()->bump_version();
  return *this;
}

}  // namespace accel
