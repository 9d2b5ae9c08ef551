// Helpers shared by the op files: argument checks and output allocation.
#pragma once

#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"

namespace accel::ops {

inline void check_defined(const Tensor& t, const char* op, const char* what = "input") {
  ACCEL_CHECK(t.defined(), ValueError, op, what, " tensor is undefined");
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  ACCEL_CHECK(a.device() == b.device(), DeviceError, op,
              "expected tensors on the same device, got ", a.device(), " ", a.sizes(), " and ",
              b.device(), " ", b.sizes());
}

inline void check_floating(const Tensor& t, const char* op, const char* what = "input") {
  ACCEL_CHECK(t.is_floating_point(), DTypeError, op, "expected a floating point ", what, ", got ",
              t.dtype(), " of shape ", t.sizes());
}

// Reduction::BatchMean is kl_div's alone (as torch's 'batchmean'); every other loss refuses it.
inline void check_not_batchmean(Reduction r, const char* op) {
  ACCEL_CHECK(r != Reduction::BatchMean, ValueError, op,
              "reduction BatchMean is only supported by kl_div (use Mean, Sum or None)");
}

// A view of `base` with new geometry (shares storage).
inline Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  return Tensor(make_intrusive<TensorImpl>(base.storage(), std::move(sizes), std::move(strides),
                                           offset, base.dtype()));
}

inline Tensor empty_on(const Shape& shape, DType dt, Device dev) {
  return empty(shape, TensorOptions(dt, dev));
}

// A contiguous copy of t's values with no history: the old value of a tensor an in-place op is
// about to overwrite, when its backward reads it (Note [in-place ops] in autograd/function.h).
inline Tensor copy_data(const Tensor& t) {
  Tensor c = empty_on(t.sizes(), t.dtype(), t.device());
  copy_stub(t.device(), c, t);
  return c;
}

// `t` converted to dtype `dt` (differentiable when both are floating).
inline Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }

}  // namespace accel::ops
