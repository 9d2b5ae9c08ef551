// Reduction kernels (kernels/<backend>/reduce.*).
#pragma once

#include <vector>

#include "core/dispatch.h"
#include "kernels/common/ops.h"  // ReduceOp

namespace accel {

// in: any strides. dims: sorted, unique, non-empty list of reduced dims of `in`.
// out: contiguous, shape of `in` with the reduced dims set to 1 (keepdim form).
// Sum/Mean/Prod accumulate in sum_acc_t (kernels/common/acc_type.h: float, double for f64,
// int64 for integers); ArgMax/ArgMin write int64 and take exactly one reduced dim, first index
// wins on ties, NaN counts as the maximum. Max/Min/ArgMax/ArgMin need a non-empty reduced
// extent whenever out is non-empty (the op layer, autograd/ops/reduce.cc, checks it).
ACCEL_DECLARE_STUB(reduce_stub,
                   void (*)(ReduceOp op, const Tensor& in, const Shape& dims, Tensor& out));

// For the backends: which dims of `in` a valid call reduces, and the elements per output.
struct ReducedDims {
  std::vector<bool> mask;  // per dim of `in`
  int64_t numel = 1;
};
inline ReducedDims reduced_dims(const Tensor& in, const Shape& dims) {
  ReducedDims r{std::vector<bool>(size_t(in.dim()), false), 1};
  for (int64_t d : dims) {
    r.mask[size_t(d)] = true;
    r.numel *= in.sizes()[size_t(d)];
  }
  return r;
}

}  // namespace accel
