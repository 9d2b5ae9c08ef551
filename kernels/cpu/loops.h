// Strided N-operand elementwise iteration for CPU kernels.
//
// Operand 0 is the output; inputs broadcast to its shape (stride 0 on broadcast dims). Dims that
// are contiguous across every operand are coalesced, so a contiguous or row-broadcast case runs as
// one long inner loop. The inner callback sees byte pointers and byte strides:
//   inner(char* const* ptrs, const int64_t* strides, int64_t n)
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "core/tensor.h"
#include "kernels/common/acc_type.h"
#include "kernels/cpu/parallel.h"

namespace accel::common {
template <>
struct is_reduced_float<Half> : std::true_type {};
template <>
struct is_reduced_float<BFloat16> : std::true_type {};
}  // namespace accel::common

namespace accel::cpu {

constexpr int kMaxLoopDims = 16;

// Calls fn.template operator()<U>() with the unsigned type of `es` bytes: data movement (gather,
// index, copies) needs only the element's bits, so it is instantiated per size, not per dtype.
template <typename F>
void dispatch_bytes(size_t es, const char* op, F&& fn) {
  switch (es) {
    case 1: return fn.template operator()<uint8_t>();
    case 2: return fn.template operator()<uint16_t>();
    case 4: return fn.template operator()<uint32_t>();
    case 8: return fn.template operator()<uint64_t>();
    default: ACCEL_THROW(DTypeError, op, "unsupported element size ", es);
  }
}

// Arithmetic type for a storage type: float for the 16-bit floats (kernels/common/acc_type.h).
using common::acc_t;
using common::sum_acc_t;

template <typename To, typename From>
inline To cast(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

template <int N>
struct StridedLoop {
  int ndim = 0;
  int64_t sizes[kMaxLoopDims];
  int64_t strides[N][kMaxLoopDims];  // bytes
  char* base[N];

  // ops[0] is the output; every op broadcasts to ops[0]'s shape.
  explicit StridedLoop(const Tensor* const* ops);

  template <typename Inner>
  void run(Inner&& inner, int64_t grain = kParallelGrain) const;
};

template <int N>
StridedLoop<N>::StridedLoop(const Tensor* const* ops) {
  const Shape& out_shape = ops[0]->sizes();
  const int nd = int(out_shape.size());
  ACCEL_CHECK(nd <= kMaxLoopDims, ShapeError, "elementwise", "tensors of rank ", nd,
              " exceed the supported ", kMaxLoopDims);
  // Raw per-dim strides (bytes), right-aligned broadcasting.
  int64_t raw[N][kMaxLoopDims];
  for (int k = 0; k < N; ++k) {
    const Tensor& t = *ops[k];
    base[k] = static_cast<char*>(t.data_ptr());
    const int64_t es = int64_t(t.element_size());
    const int off = nd - int(t.dim());
    for (int d = 0; d < nd; ++d) {
      if (d < off) {
        raw[k][d] = 0;
      } else {
        const int64_t sz = t.sizes()[size_t(d - off)];
        raw[k][d] = sz == 1 ? 0 : t.strides()[size_t(d - off)] * es;
      }
    }
  }
  // Drop size-1 dims, then coalesce adjacent dims (d, d+1) when for every operand
  // stride[d] == stride[d+1] * size[d+1].
  ndim = 0;
  for (int d = 0; d < nd; ++d) {
    if (out_shape[size_t(d)] == 1) continue;
    if (ndim > 0) {
      bool can = true;
      for (int k = 0; k < N && can; ++k)
        can = strides[k][ndim - 1] == raw[k][d] * out_shape[size_t(d)];
      if (can) {
        sizes[ndim - 1] *= out_shape[size_t(d)];
        for (int k = 0; k < N; ++k) strides[k][ndim - 1] = raw[k][d];
        continue;
      }
    }
    sizes[ndim] = out_shape[size_t(d)];
    for (int k = 0; k < N; ++k) strides[k][ndim] = raw[k][d];
    ++ndim;
  }
}

template <int N>
template <typename Inner>
void StridedLoop<N>::run(Inner&& inner, int64_t grain) const {
  if (ndim == 0) {  // one element
    int64_t st[N] = {};
    inner(base, st, 1);
    return;
  }
  const int64_t inner_n = sizes[ndim - 1];
  int64_t inner_st[N];
  for (int k = 0; k < N; ++k) inner_st[k] = strides[k][ndim - 1];
  int64_t outer = 1;
  for (int d = 0; d < ndim - 1; ++d) outer *= sizes[d];
  const int64_t rows_grain = std::max<int64_t>(1, grain / std::max<int64_t>(inner_n, 1));

  if (outer == 1) {
    // One long row: split it across threads.
    parallel_for(inner_n, grain, [&](int64_t b, int64_t e) {
      char* p[N];
      for (int k = 0; k < N; ++k) p[k] = base[k] + b * inner_st[k];
      inner(p, inner_st, e - b);
    });
    return;
  }
  parallel_for(outer, rows_grain, [&](int64_t b, int64_t e) {
    int64_t idx[kMaxLoopDims];
    // Multi-index of row b over dims [0, ndim-1).
    int64_t r = b;
    for (int d = ndim - 2; d >= 0; --d) {
      idx[d] = r % sizes[d];
      r /= sizes[d];
    }
    char* p[N];
    for (int64_t row = b; row < e; ++row) {
      for (int k = 0; k < N; ++k) {
        int64_t o = 0;
        for (int d = 0; d < ndim - 1; ++d) o += idx[d] * strides[k][d];
        p[k] = base[k] + o;
      }
      inner(p, inner_st, inner_n);
      for (int d = ndim - 2; d >= 0; --d) {
        if (++idx[d] < sizes[d]) break;
        idx[d] = 0;
      }
    }
  });
}

}  // namespace accel::cpu
