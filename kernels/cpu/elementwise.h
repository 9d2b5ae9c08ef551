// Elementwise loop drivers shared by the unary, binary and where kernels.
//
// No include guard: elementwise_unary.cc and elementwise_binary.cc include this inside each
// instruction-set pass, so the loops (and the lambdas they hand to parallel_for) are compiled for
// that pass's target (Note [portable builds and ISA dispatch] in cpu_isa.h). A template defined
// outside the pass would keep the baseline target whatever calls it.
#if !defined(ACCEL_ISA_NS)
#error "elementwise.h is included only inside an ISA pass (kernels/cpu/isa_foreach.h)"
#endif

#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <type_traits>

#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/loops.h"

namespace accel::cpu::ACCEL_ISA_NS {

// Note [float16 elementwise in float32 chunks]: Half::from_float is a branchy scalar function
// that does not vectorise (float16 elementwise ops were 45 % of an fp16 gpt step), so the
// contiguous float16 -> float16 loops convert chunks of kHalfChunk elements to float32 with F16C
// (kernels/cpu/half_convert.h), run the float loop, and round the chunk back: the same bits as
// the per-element casts (round to nearest even; a NaN stays a NaN). The polynomial ops (exp,
// tanh, sigmoid, erf, GELU, SiLU and their gradients: unary_loop_poly, binary_loop_poly) run
// bfloat16 -> bfloat16 the same way with the vectorised bf16 casts (Note [vectorised bf16 casts]
// in elementwise_copy.cc): their per-element casts kept GELU and its gradient slower in a bf16
// gpt step than in float32 (13.1 against 9.8 ms on the Intel AMX kind; 6.7 ms after). The cheap
// ops keep the per-element casts, which measured no slower (relu: 3 passes over a chunk cost
// more than one). As every autocast cast, a float32 denormal result of a polynomial op rounds to
// a signed zero where the CPU has AVX512-BF16 (PyTorch's and oneDNN's converters do the same).
inline constexpr int64_t kHalfChunk = 256;
template <typename Out, typename In, bool Poly>
inline constexpr bool kHalfChunked = std::is_same_v<Out, In> &&
                                     (std::is_same_v<In, Half> ||
                                      (Poly && std::is_same_v<In, BFloat16>));

// A chunk of 16-bit floats of type T to float32 and back.
template <typename T>
inline void chunk_to_f32(const uint16_t* s, float* d, int64_t n) {
  if constexpr (std::is_same_v<T, Half>) {
    f16_to_f32(s, d, n);
  } else {
    bf16_to_f32(s, d, n);
  }
}
template <typename T>
inline void chunk_from_f32(const float* s, uint16_t* d, int64_t n) {
  if constexpr (std::is_same_v<T, Half>) {
    f32_to_f16(s, d, n);
  } else {
    f32_to_bf16(s, d, n);
  }
}

// Note [16-bit tables for polynomial ops]: a bfloat16 or float16 input has 65,536 values, so a
// polynomial op (exp, tanh, sigmoid, erf, GELU, SiLU: unary_loop_poly) is a table of 65,536
// results, built on first use by running the float32 chunk loop above over every bit pattern:
// the table path gives the bits the chunk path gives, by construction (same loop, same
// converters, per ISA pass: each pass builds its own). The gradients of the form g * d(x)
// (GELU erf and tanh, SiLU: binary_loop_grad_poly) keep a float32 table of d(x) = f(1, x) and
// compute g * d in float32, rounded as the chunk path rounds: the same bits when f's last
// operation is that product (tests/kernels/test_cpu_isa.cc checks every input, both dtypes,
// every level). The lookup is a gather (AVX-512 / AVX2) or a scalar loop: the bf16 gpt step's
// GELU was compute-bound at 4x a copy (erf's division and exp: 0.73 ms per 2.1M elements on 2
// threads against 0.18 for a copy; docs/performance.md "GELU by table"). Tensors below kTableMin
// elements keep the chunk loop (the first build costs about one such call).
inline constexpr int64_t kTableMin = int64_t(1) << 16;
inline constexpr int64_t kTableSize = int64_t(1) << 16;

// The float32 loop of a chunk, shared by the chunk path and the tables' builders.
template <typename F>
inline __attribute__((always_inline)) void poly_chunk(F f, const float* x, float* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
}
template <typename F>
inline __attribute__((always_inline)) void poly_chunk(F f, const float* x, const float* y, float* o,
                                                      int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
}

// f's result for every 16-bit input of type In (one spare entry: the AVX-512 gather reads 4
// bytes at the last one).
template <typename In, typename F>
const uint16_t* unary_table(F f) {
  static const std::unique_ptr<uint16_t[]> table = [f] {
    std::unique_ptr<uint16_t[]> t(new uint16_t[kTableSize + 1]);
    uint16_t xs[kHalfChunk];
    float xf[kHalfChunk], of[kHalfChunk];
    for (int64_t c = 0; c < kTableSize; c += kHalfChunk) {
      for (int64_t i = 0; i < kHalfChunk; ++i) xs[i] = uint16_t(c + i);
      chunk_to_f32<In>(xs, xf, kHalfChunk);
      poly_chunk(f, xf, of, kHalfChunk);
      chunk_from_f32<In>(of, t.get() + c, kHalfChunk);
    }
    t[kTableSize] = 0;
    return t;
  }();
  return table.get();
}

// d(x) = f(1, x) in float32 for every 16-bit x of type In.
template <typename In, typename F>
const float* grad_table(F f) {
  static const std::unique_ptr<float[]> table = [f] {
    std::unique_ptr<float[]> t(new float[kTableSize]);
    uint16_t xs[kHalfChunk];
    float ones[kHalfChunk], xf[kHalfChunk];
    for (int64_t c = 0; c < kTableSize; c += kHalfChunk) {
      for (int64_t i = 0; i < kHalfChunk; ++i) xs[i] = uint16_t(c + i);
      chunk_to_f32<In>(xs, xf, kHalfChunk);
      std::fill(ones, ones + kHalfChunk, 1.0f);
      // The ones stay opaque: a g the compiler knows to be 1 could change how it contracts f.
      asm volatile("" : : "r"(ones) : "memory");
      poly_chunk(f, ones, xf, t.get() + c, kHalfChunk);
    }
    return t;
  }();
  return table.get();
}

// o[i] = t[x[i]].
inline void lookup_u16(const uint16_t* x, uint16_t* o, int64_t n, const uint16_t* t) {
  int64_t i = 0;
#if ACCEL_ISA_LEVEL == 2
  for (; i + 16 <= n; i += 16) {
    // The masked forms: GCC 12 warns that the unmasked ones' _mm512_undefined_* is uninitialised.
    const __m512i idx = _mm512_maskz_cvtepu16_epi32(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    const __m512i v =  // low 16 bits: t[x]
        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, idx, t, 2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm512_maskz_cvtepi32_epi16(0xffff, v));
  }
#endif
  for (; i < n; ++i) o[i] = t[x[i]];
}

// o[i] = g[i] * t[x[i]] in float32.
inline void scale_lookup(const float* g, const uint16_t* x, float* o, int64_t n, const float* t) {
  int64_t i = 0;
#if ACCEL_ISA_LEVEL == 2
  for (; i + 16 <= n; i += 16) {
    const __m512i idx = _mm512_maskz_cvtepu16_epi32(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    const __m512 d = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xffff, idx, t, 4);
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(g + i), d));
  }
#elif ACCEL_ISA_LEVEL == 1
  for (; i + 8 <= n; i += 8) {
    const __m256i idx =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_i32gather_ps(t, idx, 4)));
  }
#endif
  for (; i < n; ++i) o[i] = g[i] * t[x[i]];
}

// out[i] = f(in[i]) with f: acc_t<In> -> acc_t<Out>; Poly: a polynomial op (bfloat16 in float32
// chunks too, and a table from kTableMin elements: unary_loop_poly).
template <bool Poly, typename Out, typename In, typename F>
void unary_loop_impl(const Tensor& in, Tensor& out, F f) {
  if (in.is_contiguous() && out.is_contiguous() && in.sizes() == out.sizes()) {
    const In* x = static_cast<const In*>(in.data_ptr());
    Out* o = static_cast<Out*>(out.data_ptr());
    if constexpr (kHalfChunked<Out, In, Poly>) {
      const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
      uint16_t* os = reinterpret_cast<uint16_t*>(o);
      if constexpr (Poly && std::is_empty_v<F>) {  // Note [16-bit tables for polynomial ops]
        if (out.numel() >= kTableMin) {
          const uint16_t* t = unary_table<In>(f);
          parallel_for(out.numel(), kParallelGrain,
                       [&](int64_t b, int64_t e) { lookup_u16(xs + b, os + b, e - b, t); });
          return;
        }
      }
      parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
        float xf[kHalfChunk], of[kHalfChunk];
        for (int64_t c = b; c < e; c += kHalfChunk) {
          const int64_t len = std::min(kHalfChunk, e - c);
          chunk_to_f32<In>(xs + c, xf, len);
          poly_chunk(f, xf, of, len);
          chunk_from_f32<Out>(of, os + c, len);
        }
      });
      return;
    }
    parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) o[i] = cast<Out>(f(cast<acc_t<In>>(x[i])));
    });
    return;
  }
  const Tensor* ops[2] = {&out, &in};
  StridedLoop<2> loop(ops);
  loop.run([&](char* const* p, const int64_t* st, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const In x = *reinterpret_cast<const In*>(p[1] + i * st[1]);
      *reinterpret_cast<Out*>(p[0] + i * st[0]) = cast<Out>(f(cast<acc_t<In>>(x)));
    }
  });
}

template <typename Out, typename In, typename F>
void unary_loop(const Tensor& in, Tensor& out, F f) {
  unary_loop_impl<false, Out, In>(in, out, f);
}
template <typename Out, typename In, typename F>
void unary_loop_poly(const Tensor& in, Tensor& out, F f) {
  unary_loop_impl<true, Out, In>(in, out, f);
}

// out[i] = f(a[i], b[i]) with broadcasting; Poly as for unary_loop_impl.
template <bool Poly, typename Out, typename In, typename F>
void binary_loop_impl(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  using A = acc_t<In>;
  const bool out_c = out.is_contiguous();
  if (out_c && a.is_contiguous() && a.sizes() == out.sizes()) {
    const In* x = static_cast<const In*>(a.data_ptr());
    Out* o = static_cast<Out*>(out.data_ptr());
    if constexpr (kHalfChunked<Out, In, Poly>) {
      const bool full = b.is_contiguous() && b.sizes() == out.sizes();
      if (full || b.numel() == 1) {
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
        const uint16_t* ys = static_cast<const uint16_t*>(b.data_ptr());
        uint16_t* os = reinterpret_cast<uint16_t*>(o);
        const float y0 = full ? 0.0f : float(In::from_bits(ys[0]));
        parallel_for(out.numel(), kParallelGrain, [&](int64_t s, int64_t e) {
          float xf[kHalfChunk], yf[kHalfChunk], of[kHalfChunk];
          for (int64_t c = s; c < e; c += kHalfChunk) {
            const int64_t len = std::min(kHalfChunk, e - c);
            chunk_to_f32<In>(xs + c, xf, len);
            if (full) {
              chunk_to_f32<In>(ys + c, yf, len);
            } else {
              std::fill(yf, yf + len, y0);
            }
            poly_chunk(f, xf, yf, of, len);
            chunk_from_f32<Out>(of, os + c, len);
          }
        });
        return;
      }
    }
    if (b.is_contiguous() && b.sizes() == out.sizes()) {
      const In* y = static_cast<const In*>(b.data_ptr());
      parallel_for(out.numel(), kParallelGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
        for (int64_t i = s; i < e; ++i) o[i] = cast<Out>(f(cast<A>(x[i]), cast<A>(y[i])));
      });
      return;
    }
    if (b.numel() == 1) {
      const A y = cast<A>(*static_cast<const In*>(b.data_ptr()));
      parallel_for(out.numel(), kParallelGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
        for (int64_t i = s; i < e; ++i) o[i] = cast<Out>(f(cast<A>(x[i]), y));
      });
      return;
    }
  }
  const Tensor* ops[3] = {&out, &a, &b};
  StridedLoop<3> loop(ops);
  loop.run([&](char* const* p, const int64_t* st, int64_t n) {
    if (st[0] == sizeof(Out) && st[1] == sizeof(In) && st[2] == 0) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const In* x = reinterpret_cast<const In*>(p[1]);
      const A y = cast<A>(*reinterpret_cast<const In*>(p[2]));
      for (int64_t i = 0; i < n; ++i) o[i] = cast<Out>(f(cast<A>(x[i]), y));
      return;
    }
    if (st[0] == sizeof(Out) && st[1] == sizeof(In) && st[2] == sizeof(In)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const In* x = reinterpret_cast<const In*>(p[1]);
      const In* y = reinterpret_cast<const In*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = cast<Out>(f(cast<A>(x[i]), cast<A>(y[i])));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const In x = *reinterpret_cast<const In*>(p[1] + i * st[1]);
      const In y = *reinterpret_cast<const In*>(p[2] + i * st[2]);
      *reinterpret_cast<Out*>(p[0] + i * st[0]) = cast<Out>(f(cast<A>(x), cast<A>(y)));
    }
  });
}

template <typename Out, typename In, typename F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  binary_loop_impl<false, Out, In>(a, b, out, f);
}
template <typename Out, typename In, typename F>
void binary_loop_poly(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  binary_loop_impl<true, Out, In>(a, b, out, f);
}
// A gradient g * d(x) (a = g, b = x) whose last operation is that product: the polynomial loop,
// or from kTableMin elements of bfloat16 / float16 the table of d (Note [16-bit tables for
// polynomial ops]).
template <typename Out, typename In, typename F>
void binary_loop_grad_poly(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  if constexpr (kHalfChunked<Out, In, true> && std::is_empty_v<F>) {
    if (out.numel() >= kTableMin && out.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
        a.sizes() == out.sizes() && b.sizes() == out.sizes()) {
      const float* t = grad_table<In>(f);
      const uint16_t* gs = static_cast<const uint16_t*>(a.data_ptr());
      const uint16_t* xs = static_cast<const uint16_t*>(b.data_ptr());
      uint16_t* os = static_cast<uint16_t*>(out.data_ptr());
      parallel_for(out.numel(), kParallelGrain, [&](int64_t s, int64_t e) {
        float gf[kHalfChunk], of[kHalfChunk];
        for (int64_t c = s; c < e; c += kHalfChunk) {
          const int64_t len = std::min(kHalfChunk, e - c);
          chunk_to_f32<In>(gs + c, gf, len);
          scale_lookup(gf, xs + c, of, len, t);
          chunk_from_f32<Out>(of, os + c, len);
        }
      });
      return;
    }
  }
  binary_loop_poly<Out, In>(a, b, out, f);
}

}  // namespace accel::cpu::ACCEL_ISA_NS
