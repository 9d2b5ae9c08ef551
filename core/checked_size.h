// Checked size arithmetic for tensor creation.
//
// Note [checked tensor sizes]
// Shapes come from files and user code, so every tensor creation path (empty, full, zeros,
// from_blob, tensor, view/reshape, the data loaders' allocations) computes its element count
// and byte size with these instead of a plain product, which wraps silently: 65536^4 elements
// is 0 after wrapping, a "tensor" of 2^64 elements over 0 bytes that segfaults when read.
// ShapeError naming `op` and the shape for a negative dimension, an element count that
// overflows int64, or a byte size beyond kMaxTensorBytes. A zero dimension anywhere makes the
// tensor empty whatever the other dimensions are.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/shape.h"

namespace accel {

inline constexpr int64_t kMaxTensorBytes = INT64_MAX;

int64_t checked_numel(const Shape& s, const char* op);
size_t checked_nbytes(const Shape& s, size_t elem_size, const char* op);

}  // namespace accel
