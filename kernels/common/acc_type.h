// The accumulation rule, once for every backend: arithmetic on 16-bit floats runs in float (so
// CPU and CUDA round alike), float32 in float, float64 in double; sums and products of integers
// and bool run in int64. Compiled by g++ and nvcc; backends name their 16-bit types by
// specialising is_reduced_float (kernels/cpu/loops.h: Half, BFloat16; kernels/cuda/common.cuh:
// __half, __nv_bfloat16). The dtype-level form, for statistics tensors, is acc_dtype.h.
#pragma once

#include <cstdint>
#include <type_traits>

namespace accel::common {

template <typename T>
struct is_reduced_float : std::false_type {};

// Arithmetic type of a storage type.
template <typename T>
using acc_t = std::conditional_t<is_reduced_float<T>::value, float, T>;

// Sums, means and products: double for f64, float for other floats, int64 for integers and bool.
template <typename T>
using sum_acc_t =
    std::conditional_t<std::is_same_v<T, double>, double,
                       std::conditional_t<std::is_floating_point_v<acc_t<T>>, float, int64_t>>;

}  // namespace accel::common
