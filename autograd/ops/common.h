// Helpers shared by the op files: argument checks and output allocation.
#pragma once

#include <vector>

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

// A 3-D (C, H, W) or 4-D (N, C, H, W) floating input of the convolution, pooling and resampling
// ops.
inline void check_image(const char* op, const Tensor& x) {
  check_defined(x, op);
  check_floating(x, op);
  ACCEL_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op,
              "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got ", x.sizes());
}

// A 1- or 2-element size argument as (h, w); every entry must be >= min_value.
inline void pair_param(const char* op, const char* what, const Shape& s, int64_t min_value,
                       int64_t out[2]) {
  ACCEL_CHECK(s.size() == 1 || s.size() == 2, ValueError, op, what,
              " must have 1 or 2 elements, got ", s);
  out[0] = s[0];
  out[1] = s.size() == 2 ? s[1] : s[0];
  ACCEL_CHECK(out[0] >= min_value && out[1] >= min_value, ValueError, op, what,
              " must be >= ", min_value, ", got ", s);
}

// Shape{a, b} of a (h, w) parameter, for messages.
inline Shape pair_shape(const int64_t v[2]) { return Shape{v[0], v[1]}; }

// Contiguous data of t for a kernel (which ignores autograd metadata): t itself or a copy.
inline Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = empty_on(t.sizes(), t.dtype(), t.device());
  copy_stub(t.device(), c, t);
  return c;
}

// An int64 index vector on `dev` (the gathers of Note [index-map ops] in resample.cc).
inline Tensor index_vector(const std::vector<int64_t>& v, Device dev) {
  Tensor t = tensor(v, Shape{int64_t(v.size())}, TensorOptions(kInt64));
  return dev.is_cpu() ? t : t.to(dev);
}

}  // namespace accel::ops
