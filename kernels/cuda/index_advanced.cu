// CUDA kernels of advanced indexing (semantics: kernels/cpu/index_advanced.cc): index and
// index_put as strided loops over precomputed offsets, nonzero as a two-pass compaction.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

constexpr int kNonzeroThreads = 256;

template <typename U>
__global__ void __launch_bounds__(kElemThreads)
    index_kernel(const U* __restrict__ src, const int64_t* __restrict__ offsets,
                 U* __restrict__ out, int64_t numel, OffsetCalc<3> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    int64_t off[3];
    calc.get(uint32_t(i), off);
    out[off[0]] = src[off[1] + offsets[off[2]]];
  }
}

// Without accumulate, threads writing one address race: one of them wins (unspecified which).
template <typename U>
__global__ void __launch_bounds__(kElemThreads)
    index_put_kernel(U* __restrict__ dst, const U* __restrict__ values,
                     const int64_t* __restrict__ offsets, int64_t numel, OffsetCalc<3> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    int64_t off[3];
    calc.get(uint32_t(i), off);
    dst[off[0] + offsets[off[2]]] = values[off[1]];
  }
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    index_put_accumulate_kernel(T* __restrict__ dst, const T* __restrict__ values,
                                const int64_t* __restrict__ offsets, int64_t numel,
                                OffsetCalc<3> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    int64_t off[3];
    calc.get(uint32_t(i), off);
    atomic_add(dst + off[0] + offsets[off[2]], values[off[1]]);
  }
}

template <typename T>
__device__ __forceinline__ bool nonzero_value(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else if constexpr (is_half_v<T>) {
    return cvt<float>(v) != 0.0f;  // NaN != 0, -0.0 == 0
  } else {
    return v != T(0);
  }
}

// counts[b] = nonzero elements of chunk b.
template <typename T>
__global__ void __launch_bounds__(kNonzeroThreads)
    nonzero_count_kernel(const T* __restrict__ x, int64_t n, int64_t chunk,
                         int64_t* __restrict__ counts) {
  using Reduce = cub::BlockReduce<int64_t, kNonzeroThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t lo = int64_t(blockIdx.x) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  int64_t c = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) c += nonzero_value(x[i]) ? 1 : 0;
  const int64_t total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

struct Dims {
  int nd;
  int64_t sizes[kMaxNonzeroDims];
};

// Chunk b writes its coordinates from starts[b] on, one tile of blockDim elements at a time (a
// block scan orders the tile's hits), so the output is row-major.
template <typename T>
__global__ void __launch_bounds__(kNonzeroThreads)
    nonzero_write_kernel(const T* __restrict__ x, int64_t n, int64_t chunk,
                         const int64_t* __restrict__ starts, Dims dims, int64_t* __restrict__ out) {
  using Scan = cub::BlockScan<int64_t, kNonzeroThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t lo = int64_t(blockIdx.x) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  int64_t base = starts[blockIdx.x];
  for (int64_t t0 = lo; t0 < hi; t0 += blockDim.x) {
    const int64_t i = t0 + threadIdx.x;
    const int64_t hit = (i < hi && nonzero_value(x[i])) ? 1 : 0;
    int64_t pos = 0, tile = 0;
    Scan(tmp).ExclusiveSum(hit, pos, tile);
    if (hit) {
      int64_t* w = out + (base + pos) * dims.nd;
      int64_t r = i;
      for (int d = dims.nd - 1; d >= 0; --d) {
        w[d] = r % dims.sizes[d];
        r /= dims.sizes[d];
      }
    }
    base += tile;
    __syncthreads();  // tmp is reused by the next tile's scan
  }
}

}  // namespace

void launch_index(int elem_size, const void* src, const int64_t* offsets, void* out, int64_t numel,
                  const OffsetCalc<3>& calc, int max_blocks, cudaStream_t stream) {
  dispatch_bytes(elem_size, [&]<typename U>() {
    index_kernel<U><<<grid_for(numel, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
        static_cast<const U*>(src), offsets, static_cast<U*>(out), numel, calc);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_index_put(Code t, int elem_size, bool accumulate, void* dst, const void* values,
                      const int64_t* offsets, int64_t numel, const OffsetCalc<3>& calc,
                      int max_blocks, cudaStream_t stream) {
  const int grid = grid_for(numel, kElemThreads, max_blocks);
  if (accumulate) {
    dispatch_code(t, [&]<typename T>() {
      index_put_accumulate_kernel<T><<<grid, kElemThreads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(values), offsets, numel, calc);
    });
  } else {
    dispatch_bytes(elem_size, [&]<typename U>() {
      index_put_kernel<U><<<grid, kElemThreads, 0, stream>>>(
          static_cast<U*>(dst), static_cast<const U*>(values), offsets, numel, calc);
    });
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_nonzero_count(Code t, const void* x, int64_t n, int64_t chunk, int blocks,
                          int64_t* counts, cudaStream_t stream) {
  dispatch_code(t, [&]<typename T>() {
    nonzero_count_kernel<T>
        <<<blocks, kNonzeroThreads, 0, stream>>>(static_cast<const T*>(x), n, chunk, counts);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_nonzero_write(Code t, const void* x, int64_t n, int64_t chunk, int blocks,
                          const int64_t* starts, const int64_t* sizes, int nd, int64_t* out,
                          cudaStream_t stream) {
  Dims dims{};
  dims.nd = nd;
  for (int d = 0; d < nd; ++d) dims.sizes[d] = sizes[d];
  dispatch_code(t, [&]<typename T>() {
    nonzero_write_kernel<T><<<blocks, kNonzeroThreads, 0, stream>>>(static_cast<const T*>(x), n,
                                                                    chunk, starts, dims, out);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
