// CUDA reductions (semantics: kernels/cpu/reduce.cc): rows of a contiguous (rows, n) buffer, or
// the leading dim of a contiguous (n, cols) buffer (bias gradients). Long rows with few rows are
// split across blocks into a workspace that a second call reduces (the host plans, reduce.cc).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColX = 32, kColY = 8;

template <typename V>
__device__ __forceinline__ V shfl_down(V v, int delta) {
  if constexpr (sizeof(V) < 4) {
    return V(__shfl_down_sync(0xffffffffu, int(v), delta));
  } else {
    return __shfl_down_sync(0xffffffffu, v, delta);
  }
}

template <typename T, ROp OP>
struct Reducer {
  static constexpr bool kArg = OP == ROp::ArgMax || OP == ROp::ArgMin;
  static constexpr bool kSum = OP == ROp::Sum || OP == ROp::Mean;
  using V = std::conditional_t<kSum || OP == ROp::Prod, sum_acc_t<T>, acc_t<T>>;
  struct S {
    V v;
    int64_t i;
  };

  __device__ static S identity() {
    using L = std::numeric_limits<V>;
    if constexpr (kSum) return {V(0), 0};
    if constexpr (OP == ROp::Prod) return {V(1), 0};
    if constexpr (OP == ROp::Max || OP == ROp::ArgMax)
      return {L::has_infinity ? -L::infinity() : L::lowest(), INT64_MAX};
    return {L::has_infinity ? L::infinity() : L::max(), INT64_MAX};
  }

  // NaN wins for max/min/argmax/argmin (it propagates), ties keep the first index.
  __device__ static S combine(S a, S b) {
    if constexpr (kSum) {
      return {V(a.v + b.v), 0};
    } else if constexpr (OP == ROp::Prod) {
      return {V(a.v * b.v), 0};
    } else {
      const bool an = m_isnan(a.v), bn = m_isnan(b.v);
      if (an || bn) {
        if (an && bn) return a.i <= b.i ? a : b;
        return an ? a : b;
      }
      constexpr bool kMax = OP == ROp::Max || OP == ROp::ArgMax;
      if (kMax ? a.v > b.v : a.v < b.v) return a;
      if (kMax ? b.v > a.v : b.v < a.v) return b;
      return a.i <= b.i ? a : b;
    }
  }

  __device__ static S warp_reduce(S s) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      S o;
      o.v = shfl_down(s.v, d);
      o.i = kArg ? shfl_down(s.i, d) : 0;
      s = combine(s, o);
    }
    return s;
  }
};

// Writes one result: a raw partial (mean_div == 0) or the final value, divided for Mean.
template <typename R>
__device__ __forceinline__ void store_result(Code out_t, void* out, int64_t idx, typename R::S s,
                                             int64_t mean_div) {
  if constexpr (R::kArg) {
    static_cast<int64_t*>(out)[idx] = s.i;
  } else if (mean_div > 0) {
    store_as<double>(out_t, out, idx, double(s.v) / double(mean_div));
  } else {
    store_as<typename R::V>(out_t, out, idx, s.v);
  }
}

// Block (tpr, rpb): threadIdx.y picks a row of the group, x walks the row's chunk.
template <typename T, ROp OP>
__global__ void __launch_bounds__(kRowThreads)
    reduce_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t splits,
                       int64_t chunk, Code out_t, void* out, int64_t mean_div) {
  using R = Reducer<T, OP>;
  using S = typename R::S;
  __shared__ S smem[kRowThreads / 32];
  const int tpr = blockDim.x;
  const int64_t split = blockIdx.x % splits;
  const int64_t row = (blockIdx.x / splits) * blockDim.y + threadIdx.y;
  S s = R::identity();
  if (row < rows) {
    const T* p = x + row * n;
    const int64_t end = min(n, (split + 1) * chunk);
    for (int64_t j = split * chunk + threadIdx.x; j < end; j += tpr) {
      s = R::combine(s, S{cvt<typename R::V>(p[j]), j});
    }
  }
  s = R::warp_reduce(s);
  const int warps_per_row = (tpr + 31) / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warps_per_row > 1) {
    if (lane == 0) smem[threadIdx.y * warps_per_row + warp] = s;
    __syncthreads();
    if (warp == 0) {
      s = lane < warps_per_row ? smem[threadIdx.y * warps_per_row + lane] : R::identity();
      s = R::warp_reduce(s);
    }
  }
  if (threadIdx.x == 0 && row < rows) {
    store_result<R>(out_t, out, splits > 1 ? row * splits + split : row, s, mean_div);
  }
}

// Block (32, 8): x walks 32 adjacent columns (coalesced), y strides over the chunk's rows.
template <typename T>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_cols_kernel(const T* __restrict__ x, int64_t n, int64_t cols, int64_t chunk, Code out_t,
                       void* out, int64_t mean_div) {
  using R = Reducer<T, ROp::Sum>;
  using V = typename R::V;
  __shared__ V smem[kColY][kColX + 1];
  const int64_t c = int64_t(blockIdx.x) * kColX + threadIdx.x;
  const int64_t split = blockIdx.y;
  V acc = V(0);
  if (c < cols) {
    const int64_t end = min(n, (split + 1) * chunk);
    for (int64_t r = split * chunk + threadIdx.y; r < end; r += kColY)
      acc += cvt<V>(x[r * cols + c]);
  }
  smem[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int k = 1; k < kColY; ++k) acc += smem[k][threadIdx.x];
    store_result<R>(out_t, out, split * cols + c, typename R::S{acc, 0}, mean_div);
  }
}

template <typename T>
void rows_typed(ROp op, const T* x, int64_t rows, int64_t n, int64_t splits, int64_t chunk,
                Code out_t, void* out, int64_t mean_div, cudaStream_t s) {
  int tpr = 32;
  while (tpr < kRowThreads && tpr < std::min(n, chunk)) tpr *= 2;
  const int rpb = kRowThreads / tpr;
  const dim3 block(tpr, rpb);
  const int64_t blocks = ((rows + rpb - 1) / rpb) * splits;
  const unsigned grid = unsigned(blocks);
#define CASE(o)                                                                   \
  case ROp::o:                                                                    \
    reduce_rows_kernel<T, ROp::o>                                                 \
        <<<grid, block, 0, s>>>(x, rows, n, splits, chunk, out_t, out, mean_div); \
    break;
  switch (op) {
    case ROp::Mean:  // the sum, divided by mean_div
      CASE(Sum)
      CASE(Prod)
      CASE(Max)
      CASE(Min)
      CASE(ArgMax)
      CASE(ArgMin)
    default: return;
  }
#undef CASE
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_reduce_rows(ROp op, Code in_t, const void* x, int64_t rows, int64_t n, int64_t splits,
                        int64_t chunk, Code out_t, void* out, int64_t mean_div,
                        cudaStream_t stream) {
  dispatch_code(in_t, [&]<typename T>() {
    rows_typed<T>(op, static_cast<const T*>(x), rows, n, splits, chunk, out_t, out, mean_div,
                  stream);
  });
}

void launch_reduce_cols(Code in_t, const void* x, int64_t n, int64_t cols, int64_t splits,
                        int64_t chunk, Code out_t, void* out, int64_t mean_div,
                        cudaStream_t stream) {
  const dim3 block(kColX, kColY);
  const dim3 grid(unsigned((cols + kColX - 1) / kColX), unsigned(splits));
  dispatch_code(in_t, [&]<typename T>() {
    reduce_cols_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(x), n, cols, chunk,
                                                      out_t, out, mean_div);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
