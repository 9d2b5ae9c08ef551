// Elementwise loop drivers shared by the unary, binary and where kernels.
//
// No include guard: elementwise_unary.cc and elementwise_binary.cc include this inside each
// instruction-set pass, so the loops (and the lambdas they hand to parallel_for) are compiled for
// that pass's target (Note [portable builds and ISA dispatch] in cpu_isa.h). A template defined
// outside the pass would keep the baseline target whatever calls it.
#if !defined(ACCEL_ISA_NS)
#error "elementwise.h is included only inside an ISA pass (kernels/cpu/isa_foreach.h)"
#endif

#include <algorithm>
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

// out[i] = f(in[i]) with f: acc_t<In> -> acc_t<Out>; Poly: a polynomial op (bfloat16 in float32
// chunks too: unary_loop_poly).
template <bool Poly, typename Out, typename In, typename F>
void unary_loop_impl(const Tensor& in, Tensor& out, F f) {
  if (in.is_contiguous() && out.is_contiguous() && in.sizes() == out.sizes()) {
    const In* x = static_cast<const In*>(in.data_ptr());
    Out* o = static_cast<Out*>(out.data_ptr());
    if constexpr (kHalfChunked<Out, In, Poly>) {
      const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
      uint16_t* os = reinterpret_cast<uint16_t*>(o);
      parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
        float xf[kHalfChunk], of[kHalfChunk];
        for (int64_t c = b; c < e; c += kHalfChunk) {
          const int64_t len = std::min(kHalfChunk, e - c);
          chunk_to_f32<In>(xs + c, xf, len);
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) of[i] = f(xf[i]);
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
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) of[i] = f(xf[i], yf[i]);
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

}  // namespace accel::cpu::ACCEL_ISA_NS
