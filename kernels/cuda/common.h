// Host-side helpers of the CUDA kernels (.cc files): dtype codes, operand layouts, launch limits.
#pragma once

#include <cstdint>

#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/stubs/reduce.h"
#include "core/tensor.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kernel_args.h"

namespace accel::cuda {

// kernel_args.h mirrors DType as Code; this fails the build when they drift apart.
static_assert(int(Code::F32) == int(DType::Float32) && int(Code::F64) == int(DType::Float64) &&
              int(Code::F16) == int(DType::Float16) && int(Code::BF16) == int(DType::BFloat16) &&
              int(Code::I32) == int(DType::Int32) && int(Code::I64) == int(DType::Int64) &&
              int(Code::U8) == int(DType::UInt8) && int(Code::Bool) == int(DType::Bool));

inline Code code_of(DType t) { return Code(uint8_t(t)); }

// Index math of the strided kernels is 32-bit (Note [32-bit strided indexing]).
constexpr int64_t kMaxStridedNumel = (int64_t(1) << 31) - 1;

// Grid-stride grids: enough resident blocks to fill every multiprocessor a few times over.
inline int max_blocks(int device) { return multiprocessor_count(device) * 8; }

inline bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Offsets of N operands broadcast to ops[0]'s shape, dims coalesced where contiguous across all
// of them (like cpu::StridedLoop, but in elements and innermost first).
template <int N>
OffsetCalc<N> make_offset_calc(const Tensor* const* ops, const char* op) {
  const Shape& out_shape = ops[0]->sizes();
  const int nd = int(out_shape.size());
  // Per dim (outermost first) strides in elements; 0 where broadcast.
  int64_t sizes[64];
  int64_t strides[64][N];
  ACCEL_CHECK(nd <= 64, ShapeError, op, "tensors of rank ", nd, " are not supported on CUDA");
  int m = 0;
  for (int d = 0; d < nd; ++d) {
    const int64_t sz = out_shape[size_t(d)];
    if (sz == 1) continue;
    int64_t st[N];
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ops[k];
      const int off = nd - int(t.dim());
      st[k] = (d < off || t.sizes()[size_t(d - off)] == 1) ? 0 : t.strides()[size_t(d - off)];
    }
    if (m > 0) {
      bool can = true;
      for (int k = 0; k < N && can; ++k) can = strides[m - 1][k] == st[k] * sz;
      if (can) {
        sizes[m - 1] *= sz;
        for (int k = 0; k < N; ++k) strides[m - 1][k] = st[k];
        continue;
      }
    }
    sizes[m] = sz;
    for (int k = 0; k < N; ++k) strides[m][k] = st[k];
    ++m;
  }
  ACCEL_CHECK(m <= kMaxElemDims, ShapeError, op, "tensor of shape ", out_shape, " has ", m,
              " non-mergeable dims; the CUDA kernels take at most ", kMaxElemDims);
  OffsetCalc<N> c;
  c.ndim = m;
  for (int i = 0; i < m; ++i) {  // innermost first
    const int d = m - 1 - i;
    c.sizes[i] = IntDivider(uint32_t(sizes[d]));
    for (int k = 0; k < N; ++k) c.strides[i][k] = strides[d][k];
  }
  return c;
}

// A view of `t` narrowed along `dim` without autograd (kernels run on plain data).
inline Tensor raw_narrow(const Tensor& t, int64_t dim, int64_t start, int64_t len) {
  Shape sizes = t.sizes();
  sizes[size_t(dim)] = len;
  return Tensor(make_intrusive<TensorImpl>(
      t.storage(), sizes, t.strides(), t.offset() + start * t.strides()[size_t(dim)], t.dtype()));
}

// Note [32-bit strided indexing]: strided kernels use 32-bit linear indices (cheap division by
// IntDivider). A larger output is cut along its outermost non-1 dim into pieces below 2^31
// elements; inputs are cut along the same dim unless broadcast there. fn(ops) runs per piece.
template <int N, typename Fn>
void for_each_32bit_piece(const Tensor* const* ops, Fn&& fn) {
  const Tensor& out = *ops[0];
  if (out.numel() <= kMaxStridedNumel) {
    fn(ops);
    return;
  }
  int64_t dim = 0;
  while (out.sizes()[size_t(dim)] == 1) ++dim;
  const int64_t size = out.sizes()[size_t(dim)];
  const int64_t inner = out.numel() / size;
  const int64_t step = std::max<int64_t>(1, kMaxStridedNumel / inner);
  for (int64_t s = 0; s < size; s += step) {
    const int64_t len = std::min(step, size - s);
    Tensor pieces[N];
    const Tensor* pops[N];
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ops[k];
      const int64_t td = dim - (out.dim() - t.dim());
      pieces[k] = (td >= 0 && t.sizes()[size_t(td)] != 1) ? raw_narrow(t, td, s, len) : t;
      pops[k] = &pieces[k];
    }
    for_each_32bit_piece<N>(pops, fn);  // a piece may still be too large when inner is huge
  }
}

// Validates an int32/int64 index tensor (contiguous, on the current device) against [0, size)
// on the device, then waits for the answer: IndexError "[op] index v is out of bounds for
// dimension `dim` with size s (shape ...)" like the CPU kernels; with has_ignore, entries equal
// to `ignore` are skipped and the message speaks of targets and classes. Returns the number of
// entries that are not ignored. (index.cc; one small device-to-host copy per call.)
int64_t check_indices(const Tensor& index, int64_t size, int64_t dim, const Tensor& indexed,
                      const char* op, bool has_ignore = false, int64_t ignore = 0);

}  // namespace accel::cuda
