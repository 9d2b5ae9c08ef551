// Compiled by check_vectorised.sh (not linked into anything): the loops the CPU kernels build
// on kernels/cpu/vec_math.h, in the AVX2 and baseline passes' target settings, with the kernels'
// compiler flags. Each loop must vectorise: GCC's if-conversion of vec_math.h's float selects
// needs -fno-trapping-math below AVX-512, and without it GELU, softmax and cross-entropy ran
// scalar in those passes, 10x slower (docs/performance.md, "exp that did not vectorise").
#include "kernels/cpu/vec_math.h"

#define ACCEL_PROBE_LOOPS                                                               \
  void exp_loop(const float* x, float* y, long n) {                                     \
    _Pragma("omp simd") for (long i = 0; i < n; ++i) y[i] = accel::cpu::exp_f32(x[i]);  \
  }                                                                                     \
  void erf_loop(const float* x, float* y, long n) {                                     \
    _Pragma("omp simd") for (long i = 0; i < n; ++i) y[i] = accel::cpu::erf_f32(x[i]);  \
  }                                                                                     \
  void tanh_loop(const float* x, float* y, long n) {                                    \
    _Pragma("omp simd") for (long i = 0; i < n; ++i) y[i] = accel::cpu::tanh_f32(x[i]); \
  }                                                                                     \
  void gelu_grad_loop(const float* g, const float* x, float* y, long n) {               \
    _Pragma("omp simd") for (long i = 0; i < n; ++i) y[i] =                             \
        accel::cpu::gelu_erf_grad_f32(g[i], x[i]);                                      \
  }

namespace probe_baseline {
ACCEL_PROBE_LOOPS
}

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe")
namespace probe_avx2 {
ACCEL_PROBE_LOOPS
}
#pragma GCC pop_options
