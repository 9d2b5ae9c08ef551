// CUDA sorting and sampling kernels (semantics: kernels/cpu/sort.cc).
//
// Note [CUDA bitonic sort]: each row is padded to a power of two p and sorted by a bitonic
// network, log2(p) (log2(p) + 1) / 2 launches of one compare-exchange per element pair over all
// rows at once. Simple, every dtype, and in exactly the CPU's total order (value, NaN last, then
// position; padding after everything), so sort and topk agree across devices even with ties.
// O(p log^2 p) work per row: fine for the rows sort and topk see in training (vocabularies, a few
// thousand scores); a radix sort would be the next step for very long rows.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename T>
__device__ __forceinline__ bool before(T va, int64_t ia, T vb, int64_t ib, int64_t n,
                                       bool descending) {
  const bool pa = ia >= n, pb = ib >= n;
  if (pa || pb) return (pa && pb) ? ia < ib : pb;  // padding goes last
  using A = std::conditional_t<std::is_same_v<T, bool>, int, acc_t<T>>;
  const A x = cvt<A>(va), y = cvt<A>(vb);
  if constexpr (std::is_floating_point_v<A>) {
    const bool nx = x != x, ny = y != y;
    if (nx || ny) return (nx && ny) ? ia < ib : (descending ? nx : ny);
  }
  if (x != y) return descending ? x > y : x < y;
  return ia < ib;
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    sort_init_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t p,
                     T* __restrict__ keys, int64_t* __restrict__ idx) {
  const int64_t total = rows * p, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / p, j = i % p;
    idx[i] = j;
    if (j < n) keys[i] = x[r * n + j];
  }
}

// One step (k, j) of the network: element e of a row exchanges with e ^ j; the pair is put in
// order when (e & k) == 0, in reverse order otherwise.
template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    sort_step_kernel(T* __restrict__ keys, int64_t* __restrict__ idx, int64_t rows, int64_t n,
                     int64_t p, int64_t k, int64_t j, bool descending) {
  const int64_t total = rows * p, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t e = i % p, partner = e ^ j;
    if (partner <= e) continue;
    const int64_t a = i, b = i - e + partner;
    const bool up = (e & k) == 0;
    const bool swap = up ? before(keys[b], idx[b], keys[a], idx[a], n, descending)
                         : before(keys[a], idx[a], keys[b], idx[b], n, descending);
    if (swap) {
      const T tk = keys[a];
      keys[a] = keys[b];
      keys[b] = tk;
      const int64_t ti = idx[a];
      idx[a] = idx[b];
      idx[b] = ti;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    sort_take_kernel(const T* __restrict__ keys, const int64_t* __restrict__ idx, int64_t rows,
                     int64_t p, int64_t k, T* __restrict__ values, int64_t* __restrict__ indices) {
  const int64_t total = rows * k, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / k, j = i % k;
    values[i] = keys[r * p + j];
    indices[i] = idx[r * p + j];
  }
}

// One thread per row: the running sum in double, in index order (as the CPU), and the last
// category of nonzero probability.
template <typename T>
__global__ void multinomial_cdf_kernel(const T* __restrict__ probs, int64_t rows, int64_t n,
                                       double* __restrict__ cdf, int64_t* __restrict__ last) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
    double run = 0;
    int64_t lp = 0;
    for (int64_t c = 0; c < n; ++c) {
      const double v = cvt<double>(probs[r * n + c]);
      run += v;
      cdf[r * n + c] = run;
      if (v > 0) lp = c;
    }
    last[r] = lp;
  }
}

__global__ void __launch_bounds__(kElemThreads)
    multinomial_sample_kernel(const double* __restrict__ cdf, const int64_t* __restrict__ last,
                              const double* __restrict__ uniforms, int64_t rows, int64_t n,
                              int64_t s, int64_t* __restrict__ out) {
  const int64_t total = rows * s, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / s;
    const double* row = cdf + r * n;
    const double target = uniforms[i] * row[n - 1];
    int64_t lo = 0, hi = n;  // first c with row[c] > target (upper bound)
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (row[mid] > target) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    out[i] = lo < last[r] ? lo : last[r];
  }
}

}  // namespace

void launch_sort(Code t, const void* x, int64_t rows, int64_t n, int64_t p, int64_t k,
                 bool descending, void* keys, int64_t* idx, void* values, int64_t* indices,
                 int max_blocks, cudaStream_t stream) {
  dispatch_code(t, [&]<typename T>() {
    T* kp = static_cast<T*>(keys);
    const int grid = grid_for(rows * p, kElemThreads, max_blocks);
    sort_init_kernel<T>
        <<<grid, kElemThreads, 0, stream>>>(static_cast<const T*>(x), rows, n, p, kp, idx);
    for (int64_t kk = 2; kk <= p; kk <<= 1) {
      for (int64_t j = kk >> 1; j > 0; j >>= 1) {
        sort_step_kernel<T>
            <<<grid, kElemThreads, 0, stream>>>(kp, idx, rows, n, p, kk, j, descending);
      }
    }
    sort_take_kernel<T><<<grid_for(rows * k, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
        kp, idx, rows, p, k, static_cast<T*>(values), indices);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_multinomial(Code t, const void* probs, const double* uniforms, int64_t rows, int64_t n,
                        int64_t s, double* cdf, int64_t* last, int64_t* out, int max_blocks,
                        cudaStream_t stream) {
  dispatch_code(t, [&]<typename T>() {
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      multinomial_cdf_kernel<T><<<grid_for(rows, 128, max_blocks), 128, 0, stream>>>(
          static_cast<const T*>(probs), rows, n, cdf, last);
    }
  });
  multinomial_sample_kernel<<<grid_for(rows * s, kElemThreads, max_blocks), kElemThreads, 0,
                              stream>>>(cdf, last, uniforms, rows, n, s, out);
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
