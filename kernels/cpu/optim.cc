// Fused CPU optimizer steps. See kernels/stubs/optim.h for the update.
#include <immintrin.h>

#include <cmath>
#include <type_traits>

#include "kernels/common/optim.h"
#include "kernels/stubs/optim.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/optim.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// Below this many elements one thread does the whole tensor (a step reads/writes 7 values per
// element, so ~16k elements is where forking the team starts to pay).
constexpr int64_t kAdamGrain = 16384;

using common::AdamScalars;

// One pass over (param, grad, m, v) in the storage type T (float or double): the update of
// kernels/common/optim.h. GCC will not vectorise a loop that calls sqrt while errno semantics
// are on (the library sets EDOM for a negative argument), and per-function no-math-errno does not
// take, so the float loop is written with AVX intrinsics (in the AVX2 and AVX-512 passes, as
// -march=native builds do) that mirror common::adam_update; the tail and the double path call it.
template <typename T>
void adam_scalar(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                 int64_t b, int64_t e, const AdamScalars& s) {
  const common::AdamCoeffs<T> c(s);
  for (int64_t i = b; i < e; ++i) common::adam_update<CpuMath>(p[i], g[i], m[i], v[i], c);
}

void adam_float(float* __restrict p, const float* __restrict g, float* __restrict m,
                float* __restrict v, int64_t b, int64_t e, const AdamScalars& s) {
  int64_t i = b;
#if ACCEL_ISA_LEVEL >= 1  // not __AVX__: see isa_foreach.h
  constexpr int64_t kWidth = 8;
  const __m256 beta1 = _mm256_set1_ps(float(s.beta1)), beta2 = _mm256_set1_ps(float(s.beta2));
  const __m256 omb1 = _mm256_set1_ps(float(s.one_minus_beta1));
  const __m256 omb2 = _mm256_set1_ps(float(s.one_minus_beta2));
  const __m256 step_size = _mm256_set1_ps(float(s.step_size));
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(float(s.inv_sqrt_bc2));
  const __m256 eps = _mm256_set1_ps(float(s.eps));
  const __m256 decay_scale = _mm256_set1_ps(float(s.decay_scale));
  const __m256 l2 = _mm256_set1_ps(float(s.l2));
  for (; i + kWidth <= e; i += kWidth) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 gi = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_mul_ps(l2, pi));
    const __m256 mi =
        _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(omb2, _mm256_mul_ps(gi, gi)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), inv_sqrt_bc2), eps);
    const __m256 upd = _mm256_div_ps(_mm256_mul_ps(step_size, mi), denom);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(_mm256_mul_ps(pi, decay_scale), upd));
  }
#endif
  adam_scalar<float>(p, g, m, v, i, e, s);
}

// 16-bit storage: compute in float, one element at a time.
template <typename T>
void adam_range_half(T* p, const T* g, T* m, T* v, int64_t b, int64_t e, const AdamScalars& s) {
  const common::AdamCoeffs<float> c(s);
  for (int64_t i = b; i < e; ++i) {
    float pi = cast<float>(p[i]), mi = cast<float>(m[i]), vi = cast<float>(v[i]);
    common::adam_update<CpuMath>(pi, cast<float>(g[i]), mi, vi, c);
    m[i] = cast<T>(mi);
    v[i] = cast<T>(vi);
    p[i] = cast<T>(pi);
  }
}

void adamw_kernel(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const AdamStepParams& hp) {
  ACCEL_DISPATCH_FLOATING(param.dtype(), "adamw_step", [&]<typename T>() {
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* m = static_cast<T*>(exp_avg.data_ptr());
    T* v = static_cast<T*>(exp_avg_sq.data_ptr());
    const AdamScalars sc = common::adam_scalars(hp);
    parallel_for(param.numel(), kAdamGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        adam_float(p, g, m, v, b, e, sc);
      } else if constexpr (std::is_same_v<T, double>) {
        adam_scalar<double>(p, g, m, v, b, e, sc);
      } else {
        adam_range_half<T>(p, g, m, v, b, e, sc);
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)
namespace accel::cpu {
ACCEL_REGISTER_KERNEL(adamw_stub, CPU, ACCEL_ISA_DISPATCH(adamw_kernel));
}  // namespace accel::cpu
#endif  // !ACCEL_ISA_NS
