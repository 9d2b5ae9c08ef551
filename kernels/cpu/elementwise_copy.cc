// CPU copy (strided, broadcasting, converting) and fill.
//
// Note [vectorised bf16 casts]
// Autocast converts every matmul/conv input and output between float32 and bfloat16, so the two
// contiguous conversions get their own kernels, chosen at run time (the library may be built
// without -march flags): float32 -> bfloat16 uses AVX512-BF16's vcvtneps2bf16 where the CPU has
// it, else an AVX2 integer version of BFloat16::from_float (round to nearest even, NaN kept
// quiet); bfloat16 -> float32 is a 16-bit shift (AVX-512, else AVX2). vcvtneps2bf16 treats denormal
// inputs as zero, so on such CPUs a float32 denormal (|x| < 1.2e-38) converts to a signed zero
// instead of a bf16 denormal: the same as oneDNN's and PyTorch's converters. float16 goes both
// ways through F16C (vcvtps2ph / vcvtph2ps, eight at a time; a portable build has no -mf16c, so
// the scalar Half::from_float loop was all it had). The same kernels serve dense permuted layouts
// with equal strides (a transposed matmul operand), and kernels/cpu/half_convert.h exports the
// contiguous runs for the float32 matmul route (Note [bf16 through float32, blocked]). The variants
// are capped at the level accel's own kernels run at (ACCEL_CPU_ISA, set_cpu_isa): a forced
// `baseline` runs the scalar loops, `avx2` the AVX2 ones (which keep denormals).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/loops.h"

namespace accel::cpu {
namespace {

// ---- contiguous float32 <-> bfloat16 (Note [vectorised bf16 casts]) ----

void f32_to_bf16_scalar(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = BFloat16::from_float(s[i]);
}

// The tail goes through the same instruction under a mask: vcvtneps2bf16 flushes denormal inputs,
// BFloat16::from_float does not, and an element's bits must not depend on where a run starts.
__attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16"))) void f32_to_bf16_avx512bf16(
    const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), reinterpret_cast<const __m256i&>(v));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + i));
    _mm256_mask_storeu_epi16(d + i, m, reinterpret_cast<const __m256i&>(v));
  }
}

// BFloat16::from_float of eight floats, each lane holding the bf16 bits in its high half (round
// to nearest even; a NaN becomes a quiet NaN); the low halves are not cleared.
__attribute__((target("avx2"))) inline __m256i bf16_high_avx2(__m256i u) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x400000);
  const __m256i rounding = _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
  return _mm256_blendv_epi8(_mm256_add_epi32(u, rounding), _mm256_or_si256(u, quiet), is_nan);
}

// BFloat16::from_float, eight at a time.
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i r = _mm256_srli_epi32(bf16_high_avx2(u), 16);
    // Pack the low 16 bits of the eight lanes (values < 2^16, so unsigned saturation is exact).
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  f32_to_bf16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; ++i) d[i] = float(BFloat16::from_bits(s[i]));
}

// GCC 12 warns about the undefined pass-through vector inside the unmasked AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void bf16_to_f32_avx512(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(w, 16));
  }
  for (; i < n; ++i) d[i] = float(BFloat16::from_bits(s[i]));
}
#pragma GCC diagnostic pop

void bf16_to_f32_scalar(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = float(BFloat16::from_bits(s[i]));
}

// float16 through F16C (every AVX2 CPU has it): vcvtps2ph with round-to-nearest-even gives
// Half::from_float's bits for every non-NaN input (subnormals and overflow included).
void f32_to_f16_scalar(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Half::from_float(s[i]);
}
void f16_to_f32_scalar(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Half::to_float(s[i]);
}
__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  f32_to_f16_scalar(s + i, d + i, n - i);
}
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  f16_to_f32_scalar(s + i, d + i, n - i);
}

using F32ToBF16 = void (*)(const float*, uint16_t*, int64_t);
using BF16ToF32 = void (*)(const uint16_t*, float*, int64_t);

// ---- float32 rounded to bfloat16 / float16, kept in float32 (Note [autocast linear in float32])
// The same bits as the down conversion followed by the up one, in registers: one pass instead
// of two through a 16-bit buffer.

void round_bf16_scalar(const float* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = float(BFloat16::from_bits(BFloat16::from_float(s[i])));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16"))) void round_bf16_avx512bf16(
    const float* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + i));
    const __m512i w = _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(v));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(w, 16));
  }
  if (i < n) {  // masked, as in f32_to_bf16_avx512bf16
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + i));
    const __m512i w = _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(v));
    _mm512_mask_storeu_ps(d + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
}
#pragma GCC diagnostic pop

// f32_to_bf16_avx2 then bf16_to_f32_avx2, without leaving the registers.
__attribute__((target("avx2"))) void round_bf16_avx2(const float* s, float* d, int64_t n) {
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_and_si256(bf16_high_avx2(u), high));
  }
  round_bf16_scalar(s + i, d + i, n - i);
}

void round_f16_scalar(const float* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Half::to_float(Half::from_float(s[i]));
}

__attribute__((target("avx2,f16c"))) void round_f16_f16c(const float* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  round_f16_scalar(s + i, d + i, n - i);
}

using RoundF32 = void (*)(const float*, float*, int64_t);

// The contiguous converters at one ISA level (Note [vectorised bf16 casts]).
struct Converters {
  F32ToBF16 to_bf16;
  BF16ToF32 from_bf16;
  F32ToBF16 to_f16;
  BF16ToF32 from_f16;
  RoundF32 round_bf16;
  RoundF32 round_f16;
};

// The best variants this CPU runs, capped at the level accel's own kernels run at
// (ACCEL_CPU_ISA / set_cpu_isa, Note [portable builds and ISA dispatch]): a process forced to
// `baseline` runs no AVX instruction from these either, and `avx2` none from AVX-512.
const Converters& converters() {
  static const std::array<Converters, 3> table = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2");
    const bool f16c = avx2 && __builtin_cpu_supports("f16c");
    const bool avx512 = __builtin_cpu_supports("avx512f");
    const bool bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw");
    const Converters base{&f32_to_bf16_scalar, &bf16_to_f32_scalar, &f32_to_f16_scalar,
                          &f16_to_f32_scalar,  &round_bf16_scalar,  &round_f16_scalar};
    Converters v2 = base;
    if (avx2) {
      v2.to_bf16 = &f32_to_bf16_avx2;
      v2.from_bf16 = &bf16_to_f32_avx2;
      v2.round_bf16 = &round_bf16_avx2;
    }
    if (f16c) {
      v2.to_f16 = &f32_to_f16_f16c;
      v2.from_f16 = &f16_to_f32_f16c;
      v2.round_f16 = &round_f16_f16c;
    }
    Converters v4 = v2;
    if (avx512) v4.from_bf16 = &bf16_to_f32_avx512;
    if (bf16) {
      v4.to_bf16 = &f32_to_bf16_avx512bf16;
      v4.round_bf16 = &round_bf16_avx512bf16;
    }
    return std::array<Converters, 3>{base, v2, v4};
  }();
  switch (current_isa()) {
    case CpuIsa::Baseline: return table[0];
    case CpuIsa::Avx2: return table[1];
    default: return table[2];
  }
}

// Grain of the parallel conversion: below it one thread is faster than waking the pool.
constexpr int64_t kConvertGrain = int64_t(1) << 16;

// True when `t`'s elements fill numel() consecutive slots in some dim order (contiguous, a
// transposed matrix, any permutation of a packed tensor).
bool dense_any_order(const Tensor& t) {
  if (t.is_contiguous()) return true;
  std::vector<int64_t> order;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) order.push_back(d);
  std::sort(order.begin(), order.end(),
            [&](int64_t x, int64_t y) { return t.stride(x) < t.stride(y); });
  int64_t expected = 1;
  for (const int64_t d : order) {
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

// True when it handled a float32 <-> bfloat16 / float16 copy between tensors of one dense
// layout (contiguous, or the same permuted strides: a transposed matmul operand).
bool convert_half(Tensor& dst, const Tensor& src) {
  const DType dd = dst.dtype(), sd = src.dtype();
  F32ToBF16 down = nullptr;
  BF16ToF32 up = nullptr;
  const Converters& cv = converters();
  if (sd == kFloat32 && dd == kBFloat16) down = cv.to_bf16;
  if (sd == kFloat32 && dd == kFloat16) down = cv.to_f16;
  if (dd == kFloat32 && sd == kBFloat16) up = cv.from_bf16;
  if (dd == kFloat32 && sd == kFloat16) up = cv.from_f16;
  if (down == nullptr && up == nullptr) return false;
  if (dst.sizes() != src.sizes()) return false;
  if (!(dst.is_contiguous() && src.is_contiguous()) &&
      (dst.strides() != src.strides() || !dense_any_order(dst)))
    return false;
  const int64_t n = dst.numel();
  if (down != nullptr) {
    const float* s = static_cast<const float*>(src.data_ptr());
    uint16_t* d = static_cast<uint16_t*>(dst.data_ptr());
    parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) { down(s + b, d + b, e - b); });
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src.data_ptr());
    float* d = static_cast<float*>(dst.data_ptr());
    parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) { up(s + b, d + b, e - b); });
  }
  return true;
}

void copy_kernel(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (convert_half(dst, src)) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    const size_t bytes = dst.nbytes();
    char* d = static_cast<char*>(dst.data_ptr());
    const char* s = static_cast<const char*>(src.data_ptr());
    if (d == s) return;
    parallel_for(int64_t(bytes), int64_t(1) << 20,
                 [&](int64_t b, int64_t e) { std::memmove(d + b, s + b, size_t(e - b)); });
    return;
  }
  const Tensor* ops[2] = {&dst, &src};
  StridedLoop<2> loop(ops);
  ACCEL_DISPATCH_ALL(dst.dtype(), "copy_", [&]<typename D>() {
    ACCEL_DISPATCH_ALL(src.dtype(), "copy_", [&]<typename S>() {
      loop.run([](char* const* p, const int64_t* st, int64_t n) {
        char* d = p[0];
        const char* s = p[1];
        if (st[0] == sizeof(D) && st[1] == sizeof(S)) {
          D* dd = reinterpret_cast<D*>(d);
          const S* ss = reinterpret_cast<const S*>(s);
          for (int64_t i = 0; i < n; ++i) dd[i] = cast<D>(ss[i]);
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<D*>(d + i * st[0]) =
                cast<D>(*reinterpret_cast<const S*>(s + i * st[1]));
        }
      });
    });
  });
}

void fill_kernel(Tensor& dst, Scalar v) {
  if (dst.numel() == 0) return;
  ACCEL_DISPATCH_ALL(dst.dtype(), "fill_", [&]<typename T>() {
    T value;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      value = v.is_int ? T(v.i) : T(v.d);
    } else {
      value = cast<T>(v.to_double());
    }
    const Tensor* ops[1] = {&dst};
    StridedLoop<1> loop(ops);
    loop.run([value](char* const* p, const int64_t* st, int64_t n) {
      if (st[0] == sizeof(T)) {
        T* d = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) d[i] = value;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st[0]) = value;
      }
    });
  });
}

}  // namespace

void f32_to_bf16(const float* s, uint16_t* d, int64_t n) { converters().to_bf16(s, d, n); }
void bf16_to_f32(const uint16_t* s, float* d, int64_t n) { converters().from_bf16(s, d, n); }
void f32_to_f16(const float* s, uint16_t* d, int64_t n) { converters().to_f16(s, d, n); }
void f16_to_f32(const uint16_t* s, float* d, int64_t n) { converters().from_f16(s, d, n); }
void round_to_bf16(const float* s, float* d, int64_t n) { converters().round_bf16(s, d, n); }
void round_to_f16(const float* s, float* d, int64_t n) { converters().round_f16(s, d, n); }

}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(copy_stub, CPU, &cpu::copy_kernel);
ACCEL_REGISTER_KERNEL(fill_stub, CPU, &cpu::fill_kernel);
}  // namespace accel
