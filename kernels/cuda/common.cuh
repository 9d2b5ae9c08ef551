// Device-side helpers shared by the .cu files: element types, conversions, math in the
// accumulate type, vector accesses, launch helpers. Only nvcc includes this file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <type_traits>

#include "kernels/common/acc_type.h"
#include "kernels/common/scalar_math.h"
#include "kernels/cuda/kernel_args.h"

// The CUDA 16-bit floats compute in float (kernels/common/acc_type.h).
template <>
struct accel::common::is_reduced_float<__half> : std::true_type {};
template <>
struct accel::common::is_reduced_float<__nv_bfloat16> : std::true_type {};

namespace accel::cuda {

// Threads per block of the elementwise kernels.
constexpr int kElemThreads = 256;

// Error from a launcher (host side of a .cu): throws accel::Error through device.cc.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
#define ACCEL_CUDA_LAUNCH_CHECK()                                                     \
  do {                                                                                \
    const cudaError_t accel_e_ = cudaGetLastError();                                  \
    if (accel_e_ != cudaSuccess)                                                      \
      ::accel::cuda::throw_cuda_error(accel_e_, "kernel launch", __FILE__, __LINE__); \
  } while (0)

// ---------------- element types ----------------
using half_t = __half;
using bf16_t = __nv_bfloat16;

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, half_t> || std::is_same_v<T, bf16_t>;

// Arithmetic and sum types (kernels/common/acc_type.h): float for the 16-bit floats, as on the
// CPU, so results round the same way.
using common::acc_t;
using common::sum_acc_t;

// Conversions with the CPU kernels' semantics (kernels/cpu/loops.h cast): 16-bit floats go
// through float, bool is "!= 0" of the value as float.
template <typename To, typename From>
__device__ __forceinline__ To cvt(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, half_t>) {
    return cvt<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, bf16_t>) {
    return cvt<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, half_t>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bf16_t>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    if constexpr (std::is_floating_point_v<From>) {
      return static_cast<float>(v) != 0.0f;
    } else {
      return v != From(0);
    }
  } else {
    return static_cast<To>(v);
  }
}

// Calls f.template operator()<T>() for the type of a code.
template <typename F>
void dispatch_code(Code c, F&& f) {
  switch (c) {
    case Code::F32: f.template operator()<float>(); return;
    case Code::F64: f.template operator()<double>(); return;
    case Code::F16: f.template operator()<half_t>(); return;
    case Code::BF16: f.template operator()<bf16_t>(); return;
    case Code::I32: f.template operator()<int32_t>(); return;
    case Code::I64: f.template operator()<int64_t>(); return;
    case Code::U8: f.template operator()<uint8_t>(); return;
    case Code::Bool: f.template operator()<bool>(); return;
  }
}

// Calls f.template operator()<I>() for an index code: int32_t, else int64_t.
template <typename F>
void dispatch_index(Code t, F&& f) {
  if (t == Code::I32) {
    f.template operator()<int32_t>();
  } else {
    f.template operator()<int64_t>();
  }
}

// Calls f.template operator()<U>() with the unsigned type of `elem_size` bytes (data movement
// needs only the bits).
template <typename F>
void dispatch_bytes(int elem_size, F&& f) {
  switch (elem_size) {
    case 1: f.template operator()<uint8_t>(); return;
    case 2: f.template operator()<uint16_t>(); return;
    case 4: f.template operator()<uint32_t>(); return;
    case 8: f.template operator()<uint64_t>(); return;
    default: return;
  }
}

// atomic add for every dtype: native where the hardware has it, a CAS on the enclosing 32-bit
// word for bytes (bool accumulates as logical or, like the CPU).
template <typename T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, bool>) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
    unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t(3));
    const unsigned int shift = unsigned((addr & 3) * 8);
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const unsigned int cur = (assumed >> shift) & 0xffu;
      const unsigned int nv =
          std::is_same_v<T, bool> ? (cur | unsigned(v != 0)) : ((cur + unsigned(v)) & 0xffu);
      old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (nv << shift));
    } while (assumed != old);
  } else {
    atomicAdd(p, v);
  }
}

// Loads element i of a buffer whose type is known only at run time, converted to T. Used where
// one element per row is touched, or by converting copies (the branch is uniform per kernel).
template <typename T>
__device__ __forceinline__ T load_as(Code c, const void* p, int64_t i) {
  switch (c) {
    case Code::F32: return cvt<T>(static_cast<const float*>(p)[i]);
    case Code::F64: return cvt<T>(static_cast<const double*>(p)[i]);
    case Code::F16: return cvt<T>(static_cast<const half_t*>(p)[i]);
    case Code::BF16: return cvt<T>(static_cast<const bf16_t*>(p)[i]);
    case Code::I32: return cvt<T>(static_cast<const int32_t*>(p)[i]);
    case Code::I64: return cvt<T>(static_cast<const int64_t*>(p)[i]);
    case Code::U8: return cvt<T>(static_cast<const uint8_t*>(p)[i]);
    case Code::Bool: return cvt<T>(static_cast<const bool*>(p)[i]);
  }
  return T();
}

template <typename T>
__device__ __forceinline__ void store_as(Code c, void* p, int64_t i, T v) {
  switch (c) {
    case Code::F32: static_cast<float*>(p)[i] = cvt<float>(v); return;
    case Code::F64: static_cast<double*>(p)[i] = cvt<double>(v); return;
    case Code::F16: static_cast<half_t*>(p)[i] = cvt<half_t>(v); return;
    case Code::BF16: static_cast<bf16_t*>(p)[i] = cvt<bf16_t>(v); return;
    case Code::I32: static_cast<int32_t*>(p)[i] = cvt<int32_t>(v); return;
    case Code::I64: static_cast<int64_t*>(p)[i] = cvt<int64_t>(v); return;
    case Code::U8: static_cast<uint8_t*>(p)[i] = cvt<uint8_t>(v); return;
    case Code::Bool: static_cast<bool*>(p)[i] = cvt<bool>(v); return;
  }
}

// ---------------- math in float or double ----------------
#define ACCEL_CUDA_MATH1(name, f32)                                     \
  __device__ __forceinline__ float m_##name(float x) { return f32(x); } \
  __device__ __forceinline__ double m_##name(double x) { return ::name(x); }
ACCEL_CUDA_MATH1(exp, expf)
ACCEL_CUDA_MATH1(log, logf)
ACCEL_CUDA_MATH1(sqrt, sqrtf)
ACCEL_CUDA_MATH1(tanh, tanhf)
ACCEL_CUDA_MATH1(erf, erff)
ACCEL_CUDA_MATH1(sin, sinf)
ACCEL_CUDA_MATH1(cos, cosf)
ACCEL_CUDA_MATH1(log1p, log1pf)
ACCEL_CUDA_MATH1(expm1, expm1f)
ACCEL_CUDA_MATH1(fabs, fabsf)
#undef ACCEL_CUDA_MATH1
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return ::pow(x, y); }

// The math policy of kernels/common/scalar_math.h on the GPU (the CPU's is cpu::CpuMath).
struct CudaMath {
  template <typename A>
  static __device__ __forceinline__ A exp(A x) {
    return m_exp(x);
  }
  template <typename A>
  static __device__ __forceinline__ A erf(A x) {
    return m_erf(x);
  }
  template <typename A>
  static __device__ __forceinline__ A tanh(A x) {
    return m_tanh(x);
  }
  template <typename A>
  static __device__ __forceinline__ A sqrt(A x) {
    return m_sqrt(x);
  }
};

template <typename A>
__device__ __forceinline__ bool m_isnan(A x) {
  if constexpr (std::is_floating_point_v<A>) {
    return x != x;
  } else {
    return false;
  }
}

// ---------------- vector accesses ----------------
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// ---------------- block reductions ----------------
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}
// Max that skips NaN, like the CPU's `v > m ? v : m` (a NaN then poisons the following sum).
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const A o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o > v ? o : v;
  }
  return v;
}
// Sum / max over the block (blockDim.x a multiple of 32, one row per block); every thread gets
// the result. `smem` holds 32 values and may be reused by the next call.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : A(0);
  v = warp_sum(v);
  __syncthreads();
  return v;
}
template <typename A>
__device__ __forceinline__ A block_max(A v, A* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : -std::numeric_limits<A>::infinity();
  v = warp_max(v);
  __syncthreads();
  return v;
}

// Grid for a grid-stride loop over `work` items.
inline int grid_for(int64_t work, int threads, int max_blocks) {
  const int64_t b = (work + threads - 1) / threads;
  return int(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

}  // namespace accel::cuda
