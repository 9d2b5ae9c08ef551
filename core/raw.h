// Non-differentiable tensor helpers for core's own use and for kernels/ (Note [core is
// self-contained]). They record no autograd history and do not look at requires_grad: the
// differentiable Tensor methods of the same names (Tensor::permute, expand, contiguous, to) are
// ops, defined in autograd/, which core and kernels must not call.
//
// Note [core is self-contained]: core/ and kernels/ sit below autograd/ (docs/layers.md) and the
// build links each layer against only the layers below it, so a call from core or kernels into a
// method defined in autograd/ is a link error. Core needs a few copies and views itself (creating
// a tensor on a device, copy_ across devices, item/tolist of a CUDA tensor) and a CPU kernel needs
// a permuted view; these are those, with the same checks and messages as the ops.
#pragma once

#include "core/tensor.h"

namespace accel::raw {

// A view of `base`'s storage with the given geometry; no bounds check (callers derive the
// geometry from base's own).
Tensor as_strided(const Tensor& base, Shape sizes, Shape strides, int64_t offset);
// `t` with dims reordered (ShapeError/ValueError as Tensor::permute).
Tensor permute(const Tensor& t, const Shape& dims);
// `t` broadcast to `shape` with stride-0 dims; -1 keeps a dim (ShapeError as Tensor::expand).
Tensor expand(const Tensor& t, const Shape& shape);
// The sizes and strides of `t` expanded to `shape`, checked (shared by expand and
// Tensor::expand). Returns false when the view would equal `t` (nothing to expand).
bool expand_geometry(const Tensor& t, const Shape& shape, Shape& sizes, Shape& strides);
// `t` itself when contiguous, else a contiguous copy on the same device.
Tensor contiguous(const Tensor& t);
// `t` itself when it has dtype `dt`, else a converted copy on the same device.
Tensor to_dtype(const Tensor& t, DType dt);
// `t` itself when on `d`, else a contiguous copy on `d` (through cross_device_copy_stub).
Tensor to_device(const Tensor& t, Device d, bool non_blocking = false);

// Writes `src` (broadcast to dst's shape, converted to its dtype, from any device) into `dst` and
// bumps dst's version (unless told not to: Tensor::copy_ bumps it itself); no autograd. The data
// half of Tensor::copy_ (ShapeError, ValueError as it).
void copy_(Tensor& dst, const Tensor& src, bool bump_version = true);
// Sets every element of `dst` to `v` and bumps its version; no autograd.
void fill_(Tensor& dst, Scalar v);

}  // namespace accel::raw
