// CUDA copy kernels: strided same-dtype copy (by element size), dtype conversion, fill
// (semantics: kernels/cpu/elementwise_copy.cc). Contiguous same-dtype copies are cudaMemcpyAsync on
// the host.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    copy_strided_kernel(T* dst, const T* src, int64_t n, OffsetCalc<2> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    calc.get(uint32_t(i), off);
    dst[off[0]] = src[off[1]];
  }
}

// The source type is a run-time code: one kernel per destination type instead of 64 pairs; the
// switch in load_as is uniform across the grid.
template <typename D, bool kStrided>
__global__ void __launch_bounds__(kElemThreads)
    convert_kernel(D* dst, Code src_t, const void* src, int64_t n, OffsetCalc<2> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (kStrided) {
      int64_t off[2];
      calc.get(uint32_t(i), off);
      dst[off[0]] = load_as<D>(src_t, src, off[1]);
    } else {
      dst[i] = load_as<D>(src_t, src, i);
    }
  }
}

template <typename T, bool kStrided>
__global__ void __launch_bounds__(kElemThreads)
    fill_kernel(T* dst, T value, int64_t n, OffsetCalc<1> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (kStrided) {
      int64_t off[1];
      calc.get(uint32_t(i), off);
      dst[off[0]] = value;
    } else {
      dst[i] = value;
    }
  }
}

}  // namespace

void launch_copy_strided(int elem_size, void* dst, const void* src, int64_t n,
                         const OffsetCalc<2>& calc, int max_blocks, cudaStream_t stream) {
  const int g = grid_for(n, kElemThreads, max_blocks);
  switch (elem_size) {
#define CASE(sz, T)                                                                              \
  case sz:                                                                                       \
    copy_strided_kernel<T><<<g, kElemThreads, 0, stream>>>(static_cast<T*>(dst),                 \
                                                           static_cast<const T*>(src), n, calc); \
    break;
    CASE(1, uint8_t)
    CASE(2, uint16_t)
    CASE(4, uint32_t)
    CASE(8, uint64_t)
#undef CASE
    default: return;
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_convert(Code dst_t, Code src_t, void* dst, const void* src, int64_t n,
                    const OffsetCalc<2>* calc, int max_blocks, cudaStream_t stream) {
  const int g = grid_for(n, kElemThreads, max_blocks);
  dispatch_code(dst_t, [&]<typename D>() {
    if (calc) {
      convert_kernel<D, true>
          <<<g, kElemThreads, 0, stream>>>(static_cast<D*>(dst), src_t, src, n, *calc);
    } else {
      convert_kernel<D, false>
          <<<g, kElemThreads, 0, stream>>>(static_cast<D*>(dst), src_t, src, n, OffsetCalc<2>());
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_fill(int elem_size, uint64_t bits, void* dst, int64_t n, const OffsetCalc<1>* calc,
                 int max_blocks, cudaStream_t stream) {
  const int g = grid_for(n, kElemThreads, max_blocks);
  auto go = [&]<typename T>() {
    const T v = T(bits);
    if (calc) {
      fill_kernel<T, true><<<g, kElemThreads, 0, stream>>>(static_cast<T*>(dst), v, n, *calc);
    } else {
      fill_kernel<T, false>
          <<<g, kElemThreads, 0, stream>>>(static_cast<T*>(dst), v, n, OffsetCalc<1>());
    }
  };
  switch (elem_size) {
    case 1: go.template operator()<uint8_t>(); break;
    case 2: go.template operator()<uint16_t>(); break;
    case 4: go.template operator()<uint32_t>(); break;
    case 8: go.template operator()<uint64_t>(); break;
    default: return;
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
