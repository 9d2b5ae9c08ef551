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
// the per-element casts (round to nearest even; a NaN stays a NaN).
inline constexpr int64_t kHalfChunk = 256;
template <typename Out, typename In>
inline constexpr bool kHalfChunked = std::is_same_v<Out, Half>&& std::is_same_v<In, Half>;

// out[i] = f(in[i]) with f: acc_t<In> -> acc_t<Out>.
template <typename Out, typename In, typename F>
void unary_loop(const Tensor& in, Tensor& out, F f) {
  if (in.is_contiguous() && out.is_contiguous() && in.sizes() == out.sizes()) {
    const In* x = static_cast<const In*>(in.data_ptr());
    Out* o = static_cast<Out*>(out.data_ptr());
    if constexpr (kHalfChunked<Out, In>) {
      const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
      uint16_t* os = reinterpret_cast<uint16_t*>(o);
      parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
        float xf[kHalfChunk], of[kHalfChunk];
        for (int64_t c = b; c < e; c += kHalfChunk) {
          const int64_t len = std::min(kHalfChunk, e - c);
          f16_to_f32(xs + c, xf, len);
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) of[i] = f(xf[i]);
          f32_to_f16(of, os + c, len);
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

// out[i] = f(a[i], b[i]) with broadcasting.
template <typename Out, typename In, typename F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  using A = acc_t<In>;
  const bool out_c = out.is_contiguous();
  if (out_c && a.is_contiguous() && a.sizes() == out.sizes()) {
    const In* x = static_cast<const In*>(a.data_ptr());
    Out* o = static_cast<Out*>(out.data_ptr());
    if constexpr (kHalfChunked<Out, In>) {
      const bool full = b.is_contiguous() && b.sizes() == out.sizes();
      if (full || b.numel() == 1) {
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
        const uint16_t* ys = static_cast<const uint16_t*>(b.data_ptr());
        uint16_t* os = reinterpret_cast<uint16_t*>(o);
        const float y0 = full ? 0.0f : Half::to_float(ys[0]);
        parallel_for(out.numel(), kParallelGrain, [&](int64_t s, int64_t e) {
          float xf[kHalfChunk], yf[kHalfChunk], of[kHalfChunk];
          for (int64_t c = s; c < e; c += kHalfChunk) {
            const int64_t len = std::min(kHalfChunk, e - c);
            f16_to_f32(xs + c, xf, len);
            if (full) {
              f16_to_f32(ys + c, yf, len);
            } else {
              std::fill(yf, yf + len, y0);
            }
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) of[i] = f(xf[i], yf[i]);
            f32_to_f16(of, os + c, len);
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

}  // namespace accel::cpu::ACCEL_ISA_NS
