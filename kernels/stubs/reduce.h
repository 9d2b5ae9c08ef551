// Reduction kernels (kernels/<backend>/reduce.*).
#pragma once

#include "core/dispatch.h"

namespace accel {

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, Prod, ArgMax, ArgMin, Count };

// in: any strides. dims: sorted, unique, non-empty list of reduced dims of `in`.
// out: contiguous, shape of `in` with the reduced dims set to 1 (keepdim form).
// Sum/Mean/Prod accumulate in at least float (double for f64); ArgMax/ArgMin write int64 and take
// exactly one reduced dim, first index wins on ties, NaN counts as the maximum.
ACCEL_DECLARE_STUB(reduce_stub, void (*)(ReduceOp op, const Tensor& in, const Shape& dims, Tensor& out));

}  // namespace accel
