// Reduction kernels (kernels/<backend>/reduce.*).
#pragma once

#include "core/dispatch.h"
#include "kernels/common/ops.h"  // ReduceOp

namespace accel {

// in: any strides. dims: sorted, unique, non-empty list of reduced dims of `in`.
// out: contiguous, shape of `in` with the reduced dims set to 1 (keepdim form).
// Sum/Mean/Prod accumulate in sum_acc_t (kernels/common/acc_type.h: float, double for f64,
// int64 for integers); ArgMax/ArgMin write int64 and take exactly one reduced dim, first index
// wins on ties, NaN counts as the maximum. Max/Min/ArgMax/ArgMin need a non-empty reduced
// extent whenever out is non-empty (the op layer, autograd/ops/reduce.cc, checks it).
ACCEL_DECLARE_STUB(reduce_stub, void (*)(ReduceOp op, const Tensor& in, const Shape& dims, Tensor& out));

}  // namespace accel
