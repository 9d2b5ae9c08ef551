// Indexing kernels (kernels/<backend>/index*: index.cc, index_trilu.cc on the CPU; index.cc,
// index.cu on CUDA).
//
// Index tensors are int32 or int64 and contiguous. Each kernel checks every index against the
// indexed dimension before touching memory and throws IndexError naming `op`, the bad index and
// the dimension size (data the op cannot see). The op in autograd/ops/index.cc checks shapes,
// dtypes and devices: kernels assume those preconditions and only assert the cheap ones.
#pragma once

#include "core/dispatch.h"

namespace accel {

// x: contiguous, viewed as (outer, n, inner) around `dim`; index: (k); out: contiguous
// (outer, k, inner): out[o, j, :] = x[o, index[j], :].
ACCEL_DECLARE_STUB(index_select_stub, void (*)(const Tensor& x, int64_t dim, const Tensor& index,
                                               Tensor& out, const char* op));
// out: contiguous (outer, n, inner), accumulated in place; index: (k); src: contiguous
// (outer, k, inner): out[o, index[j], :] += src[o, j, :]. Duplicate indices accumulate.
ACCEL_DECLARE_STUB(index_add_stub, void (*)(Tensor& out, int64_t dim, const Tensor& index,
                                            const Tensor& src, const char* op));
// x: any strides; index: same rank as x (at most 16 dims, the CPU loop's limit); out: contiguous,
// index's shape:
//   out[i] = x[i with coordinate `dim` replaced by index[i]].
ACCEL_DECLARE_STUB(gather_stub, void (*)(const Tensor& x, int64_t dim, const Tensor& index,
                                         Tensor& out, const char* op));
// out: contiguous, accumulated in place; index: same rank; src: any strides, each dim at least
// index's: out[i with coordinate `dim` replaced by index[i]] += src[i] for every i in index.
ACCEL_DECLARE_STUB(scatter_add_stub, void (*)(Tensor& out, int64_t dim, const Tensor& index,
                                              const Tensor& src, const char* op));

// x, out: contiguous (..., R, C). Keeps x[.., i, j] where j - i <= diagonal (tril) or
// j - i >= diagonal (upper = true, triu); zero elsewhere.
ACCEL_DECLARE_STUB(trilu_stub,
                   void (*)(const Tensor& x, int64_t diagonal, bool upper, Tensor& out));

// Advanced indexing (autograd/ops/indexing.cc, Note [advanced indexing as offsets]): the op
// turns the index tensors into one int64 offset per element, already checked against the sizes,
// and restrides the indexed tensor so that each kernel is a plain strided loop.
// out: contiguous; src: out's shape, any strides (0 along the dims the index tensors produce);
// offsets: int64, out's shape, any strides (0 along the kept dims). Elements move as bytes:
//   out[i] = src.data_ptr()[src_offset(i) + offsets[i]]   (offsets in elements)
ACCEL_DECLARE_STUB(index_stub, void (*)(const Tensor& src, const Tensor& offsets, Tensor& out));
// dst: a view of a tensor the op owns, any strides (0 along the index dims); offsets: as above;
// values: dst's shape and dtype, any strides (broadcast):
//   dst.data_ptr()[dst_offset(i) + offsets[i]] = values[i]   (accumulate: +=)
// With accumulate duplicates are summed (in another order under CUDA's atomics); without it the
// CPU writes in index order, so the last duplicate wins, and CUDA's winner is unspecified.
ACCEL_DECLARE_STUB(index_put_stub, void (*)(Tensor& dst, const Tensor& offsets,
                                            const Tensor& values, bool accumulate));
// x: contiguous, any dtype -> (count, max(x.dim(), 1)) int64 on x's device: the coordinates of
// the elements != 0 (NaN counts, -0.0 does not) in row-major order. A 0-dim x is seen as (1).
ACCEL_DECLARE_STUB(nonzero_stub, Tensor (*)(const Tensor& x));

}  // namespace accel
