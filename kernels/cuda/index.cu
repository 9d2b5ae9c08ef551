// CUDA indexing kernels: index check, index_select / index_add (embedding forward/backward),
// gather / scatter_add, tril / triu (semantics: kernels/cpu/index.cc, index_trilu.cc). Accumulating
// kernels use atomics, so duplicate indices accumulate in an unspecified order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename I>
__global__ void check_indices_kernel(const I* __restrict__ idx, int64_t n, int64_t size,
                                     bool has_ignore, int64_t ignore, unsigned long long* result) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned long long valid = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t v = int64_t(idx[i]);
    if (has_ignore && v == ignore) continue;
    ++valid;
    if (v < 0 || v >= size) atomicMin(&result[0], (unsigned long long)i);
  }
  if (has_ignore && valid) atomicAdd(&result[1], valid);
}

// One block per output row (o, j): threads copy the `inner` elements.
template <typename U, typename I>
__global__ void index_select_kernel(const U* __restrict__ x, const I* __restrict__ idx, int64_t n,
                                    int64_t inner, int64_t k, U* __restrict__ out) {
  const int64_t t = blockIdx.x;  // o * k + j
  const int64_t o = t / k, j = t % k;
  const int64_t v = int64_t(idx[j]);
  if (v < 0 || v >= n) return;  // reported by the index check
  const U* src = x + (o * n + v) * inner;
  U* dst = out + t * inner;
  for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) dst[i] = src[i];
}

template <typename T, typename I>
__global__ void index_add_kernel(T* __restrict__ out, const I* __restrict__ idx,
                                 const T* __restrict__ src, int64_t n, int64_t inner, int64_t k) {
  const int64_t t = blockIdx.x;
  const int64_t o = t / k, j = t % k;
  const int64_t v = int64_t(idx[j]);
  if (v < 0 || v >= n) return;
  T* dst = out + (o * n + v) * inner;
  const T* s = src + t * inner;
  for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) atomic_add(dst + i, s[i]);
}

template <typename U, typename I>
__global__ void __launch_bounds__(kElemThreads)
    gather_kernel(const U* __restrict__ x, const I* __restrict__ idx, U* __restrict__ out,
                  int64_t numel, OffsetCalc<3> calc, int64_t x_dim_stride, int64_t dim_size) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    int64_t off[3];
    calc.get(uint32_t(i), off);
    const int64_t v = int64_t(idx[off[1]]);
    if (v < 0 || v >= dim_size) continue;
    out[off[0]] = x[off[2] + v * x_dim_stride];
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kElemThreads)
    scatter_add_kernel(T* __restrict__ out, const I* __restrict__ idx, const T* __restrict__ src,
                       int64_t numel, OffsetCalc<3> calc, int64_t out_dim_stride) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    int64_t off[3];
    calc.get(uint32_t(i), off);
    const int64_t v = int64_t(idx[off[0]]);
    if (v < 0) continue;  // range reported by the index check
    atomic_add(out + off[1] + v * out_dim_stride, src[off[2]]);
  }
}

template <typename U>
__global__ void __launch_bounds__(kElemThreads)
    trilu_kernel(const U* __restrict__ x, U* __restrict__ out, int64_t total, int64_t rows,
                 int64_t cols, int64_t diagonal, bool upper) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t j = t % cols, i = (t / cols) % rows;
    const bool keep = upper ? (j - i >= diagonal) : (j - i <= diagonal);
    out[t] = keep ? x[t] : U(0);
  }
}

}  // namespace

void launch_check_indices(Code idx_t, const void* index, int64_t n, int64_t size, bool has_ignore,
                          int64_t ignore, unsigned long long* result, int max_blocks,
                          cudaStream_t stream) {
  dispatch_index(idx_t, [&]<typename I>() {
    check_indices_kernel<I><<<grid_for(n, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
        static_cast<const I*>(index), n, size, has_ignore, ignore, result);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_index_select(int elem_size, const void* x, Code idx_t, const void* index, int64_t outer,
                         int64_t n, int64_t inner, int64_t k, void* out, cudaStream_t stream) {
  const int threads = inner >= 256 ? 256 : (inner >= 64 ? 64 : 32);
  dispatch_bytes(elem_size, [&]<typename U>() {
    dispatch_index(idx_t, [&]<typename I>() {
      index_select_kernel<U, I><<<unsigned(outer * k), threads, 0, stream>>>(
          static_cast<const U*>(x), static_cast<const I*>(index), n, inner, k,
          static_cast<U*>(out));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_index_add(Code t, void* out, Code idx_t, const void* index, const void* src,
                      int64_t outer, int64_t n, int64_t inner, int64_t k, cudaStream_t stream) {
  const int threads = inner >= 256 ? 256 : (inner >= 64 ? 64 : 32);
  dispatch_code(t, [&]<typename T>() {
    dispatch_index(idx_t, [&]<typename I>() {
      index_add_kernel<T, I><<<unsigned(outer * k), threads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const I*>(index), static_cast<const T*>(src), n, inner,
          k);
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_gather(int elem_size, const void* x, Code idx_t, const void* index, void* out,
                   int64_t numel, const OffsetCalc<3>& calc, int64_t x_dim_stride, int max_blocks,
                   cudaStream_t stream) {
  dispatch_bytes(elem_size, [&]<typename U>() {
    dispatch_index(idx_t, [&]<typename I>() {
      gather_kernel<U, I><<<grid_for(numel, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
          static_cast<const U*>(x), static_cast<const I*>(index), static_cast<U*>(out), numel, calc,
          x_dim_stride, INT64_MAX);
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_scatter_add(Code t, void* out, Code idx_t, const void* index, const void* src,
                        int64_t numel, const OffsetCalc<3>& calc, int64_t out_dim_stride,
                        int max_blocks, cudaStream_t stream) {
  dispatch_code(t, [&]<typename T>() {
    dispatch_index(idx_t, [&]<typename I>() {
      scatter_add_kernel<T, I>
          <<<grid_for(numel, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
              static_cast<T*>(out), static_cast<const I*>(index), static_cast<const T*>(src), numel,
              calc, out_dim_stride);
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_trilu(int elem_size, const void* x, void* out, int64_t batch, int64_t rows,
                  int64_t cols, int64_t diagonal, bool upper, int max_blocks, cudaStream_t stream) {
  const int64_t total = batch * rows * cols;
  dispatch_bytes(elem_size, [&]<typename U>() {
    trilu_kernel<U><<<grid_for(total, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
        static_cast<const U*>(x), static_cast<U*>(out), total, rows, cols, diagonal, upper);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
