// Elementwise reductions used by the CPU collectives: c = op(a, b) over n elements.
// f16/bf16 reduce in float and round once per pairwise step (as Gloo and NCCL do); bool sums as
// logical or, max = or, min = and.
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "comm/process_group.h"

namespace accel::dist {

using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

// Throws DTypeError for combinations that have no meaning (avg of integers or bools).
void check_reducible(const char* op, DType dtype, ReduceOp reduce);
// Sum/Max/Min kernel for dtype (Avg is Sum followed by divide_inplace).
ReduceFn reduce_function(DType dtype, ReduceOp reduce);
// p[i] /= divisor for a floating dtype.
void divide_inplace(void* p, DType dtype, size_t n, int divisor);

}  // namespace accel::dist
