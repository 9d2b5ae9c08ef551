// CPU 2-D pooling (max and average, forward and backward): oneDNN's primitives on the plain NCHW
// layout (pooling is memory-bound: a reorder into a blocked layout would cost as much as the
// pooling), accel's own kernel where oneDNN has none for the dtype or only a slow one (Note [own
// NCHW pooling]), direct loops for f64 (the reference kernels gradcheck runs against).
#include <immintrin.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/stubs/conv.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/onednn.h"

namespace accel::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

struct PoolGeom {
  int64_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw;
};

PoolGeom pool_geom(const Shape& in, const Shape& out, const Pool2dParams& p) {
  return {in[0] * in[1], in[2],       in[3],       out[2],       out[3],      p.kernel[0],
          p.kernel[1],   p.stride[0], p.stride[1], p.padding[0], p.padding[1]};
}

// Visits the valid input cells of output cell (oh, ow): fn(ih * w + iw).
template <typename F>
void for_window(const PoolGeom& g, int64_t oh, int64_t ow, F&& fn) {
  const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + g.kh, g.h); ++ih)
    for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + g.kw, g.w); ++iw)
      fn(ih * g.w + iw);
}

int64_t window_count(const PoolGeom& g, int64_t oh, int64_t ow, bool include_pad) {
  if (include_pad) return g.kh * g.kw;
  const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  const int64_t hs = std::min(h0 + g.kh, g.h) - std::max<int64_t>(h0, 0);
  const int64_t ws = std::min(w0 + g.kw, g.w) - std::max<int64_t>(w0, 0);
  return hs * ws;
}

// Max: also writes the argmax (flat index in the plane) to idx when not null.
template <typename T>
void pool_fwd_ref(PoolKind kind, const T* x, T* y, int64_t* idx, const PoolGeom& g,
                  bool include_pad) {
  parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const T* xp = x + pl * g.h * g.w;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const int64_t o = (pl * g.ho + oh) * g.wo + ow;
          if (kind == PoolKind::Max) {
            T best = -std::numeric_limits<T>::infinity();
            int64_t bi = -1;
            for_window(g, oh, ow, [&](int64_t k) {
              const T v = xp[k];  // NaN wins and then stays, as in PyTorch
              if (bi < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) {
                best = v;
                bi = k;
              }
            });
            y[o] = best;
            if (idx) idx[o] = bi;
          } else {
            T s = T(0);
            for_window(g, oh, ow, [&](int64_t k) { s += xp[k]; });
            y[o] = s / T(window_count(g, oh, ow, include_pad));
          }
        }
      }
    }
  });
}

template <typename T>
void pool_bwd_ref(PoolKind kind, const T* gy, const int64_t* idx, T* gx, const PoolGeom& g,
                  bool include_pad) {
  parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* gxp = gx + pl * g.h * g.w;
      std::fill(gxp, gxp + g.h * g.w, T(0));
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const int64_t o = (pl * g.ho + oh) * g.wo + ow;
          if (kind == PoolKind::Max) {
            if (idx[o] >= 0) gxp[idx[o]] += gy[o];
          } else {
            const T v = gy[o] / T(window_count(g, oh, ow, include_pad));
            for_window(g, oh, ow, [&](int64_t k) { gxp[k] += v; });
          }
        }
      }
    }
  });
}

// Note [own NCHW pooling]: oneDNN's pooling on plain NCHW is a JIT kernel only with AVX-512; below
// it (an AVX2-only CPU, or ONEDNN_MAX_CPU_ISA=AVX2) oneDNN 2.6 runs `simple_nchw`, which took
// 20-35 ms per max-pool call of the cnn workload (half of its step) against ~1 ms for the JIT one.
// So where oneDNN's chosen implementation is a simple / reference one, pool2d runs this kernel:
// planes in parallel, float arithmetic on any float storage (bf16 / f16 read and rounded once),
// the fixed window unrolled where it lies inside the input. Its max-pool workspace is the argmax
// as an int32 flat index in the plane (PyTorch's indices), which is how the backward knows
// which kernel made it (oneDNN's is uint8, the float64 reference's int64).
// One max-pool window without branches on the data (a compare-and-select per cell: random data
// made the branchy form mispredict half its compares, 25 ms for the cnn's first pool): NaN wins
// and then stays (PyTorch), ties keep the first cell.
// The select is done with masks: GCC turned `t ? v : best` back into jumps.
struct MaxCell {
  float best;
  int64_t at;
  inline void take(float v, int64_t k) {
    const bool t = (v > best) | ((v != v) & (best == best));
    const uint32_t m = 0u - uint32_t(t);
    best = std::bit_cast<float>((std::bit_cast<uint32_t>(v) & m) |
                                (std::bit_cast<uint32_t>(best) & ~m));
    const uint64_t m64 = 0ull - uint64_t(t);
    at = int64_t((uint64_t(k) & m64) | (uint64_t(at) & ~m64));
  }
};

// The common 2 x 2, stride 2 max pool over one output row as a vector loop (lanes are outputs;
// MaxCell's compare-and-select on int32 indices, written out so GCC vectorises it), on float
// rows (bf16 ones are widened first, below).
inline void max_take(float v, int32_t k, float& best, int32_t& at) {
  const bool t = (v > best) | ((v != v) & (best == best));
  const uint32_t m = 0u - uint32_t(t);
  best =
      std::bit_cast<float>((std::bit_cast<uint32_t>(v) & m) | (std::bit_cast<uint32_t>(best) & ~m));
  at = int32_t((uint32_t(k) & m) | (uint32_t(at) & ~m));
}
template <bool kIdx>
void max_row_2x2(const float* __restrict r0, const float* __restrict r1, float* __restrict y,
                 int32_t* __restrict ip, int32_t row0, int32_t w, int64_t n) {
#pragma omp simd
  for (int64_t ow = 0; ow < n; ++ow) {
    float best = r0[2 * ow];
    const int32_t a0 = row0 + int32_t(2 * ow);
    int32_t at = a0;
    max_take(r0[2 * ow + 1], a0 + 1, best, at);
    max_take(r1[2 * ow], a0 + w, best, at);
    max_take(r1[2 * ow + 1], a0 + w + 1, best, at);
    y[ow] = best;
    if constexpr (kIdx) ip[ow] = at;
  }
}

// The same row on AVX-512, 16 outputs per step under masks (Note [own 2 x 2 max pool]): the
// library's baseline build vectorised the loop above for SSE only, and the rows of a small CNN's
// pools (14 and 7 outputs) never reach a full vector, so it ran mostly scalar. Each step loads
// 32 inputs of each row (masked), splits even and odd columns, and picks per window in two
// rounds, each column's rows first, then the columns; ties and NaNs resolve as MaxCell's
// row-major scan does (the first maximal element, a NaN above a number, the first NaN): the
// right column wins a tie only when the left winner is its bottom cell and the right one its top.
#define ACCEL_POOL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 reports its own intrinsics' undefined-vector placeholders as maybe-uninitialized here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The first k of 16 lanes (none for k <= 0, all for k >= 16).
inline __mmask16 first_lanes(int64_t k) {
  return k >= 16 ? __mmask16(0xFFFF) : k <= 0 ? __mmask16(0) : __mmask16((1u << k) - 1);
}
// Stores the lanes of `m` of 16 floats as T: a bf16 value is the top 16 bits of a float that
// holds one exactly (a maximum of bf16 inputs, a bf16 gradient, zero).
ACCEL_POOL_AVX512 inline void store16(float* r, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(r, m, v);
}
ACCEL_POOL_AVX512 inline void store16(BFloat16* r, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(r, m,
                           _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}
// Two 16-float halves of 2 m inputs (m <= 16 outputs) from one row.
ACCEL_POOL_AVX512 inline void load_pairs(const float* r, int64_t m, __m512& lo, __m512& hi) {
  lo = _mm512_maskz_loadu_ps(first_lanes(2 * m), r);
  hi = _mm512_maskz_loadu_ps(first_lanes(2 * m - 16), r + 16);
}
ACCEL_POOL_AVX512 inline void load_pairs(const BFloat16* r, int64_t m, __m512& lo, __m512& hi) {
  const int64_t k = 2 * m;
  const __mmask32 mk = k >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << k) - 1);
  const __m512i v = _mm512_maskz_loadu_epi16(mk, r);
  lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
  hi = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
}
ACCEL_POOL_AVX512 inline __mmask16 nan_mask(__m512 v) {
  return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}

template <typename T>
ACCEL_POOL_AVX512 void max_row_2x2_avx512(const T* r0, const T* r1, T* y, int32_t* ip, int32_t row0,
                                          int32_t w, int64_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, BFloat16>);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i one = _mm512_set1_epi32(1), wv = _mm512_set1_epi32(w);
  for (int64_t o0 = 0; o0 < n; o0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - o0);
    __m512 a_lo, a_hi, b_lo, b_hi;
    load_pairs(r0 + 2 * o0, m, a_lo, a_hi);
    load_pairs(r1 + 2 * o0, m, b_lo, b_hi);
    const __m512 tl = _mm512_permutex2var_ps(a_lo, even, a_hi);
    const __m512 tr = _mm512_permutex2var_ps(a_lo, odd, a_hi);
    const __m512 bl = _mm512_permutex2var_ps(b_lo, even, b_hi);
    const __m512 br = _mm512_permutex2var_ps(b_lo, odd, b_hi);
    // Each column: the bottom cell wins when greater, or a NaN over a number.
    const __mmask16 sel_l = _mm512_cmp_ps_mask(bl, tl, _CMP_GT_OQ) | (nan_mask(bl) & ~nan_mask(tl));
    const __mmask16 sel_r = _mm512_cmp_ps_mask(br, tr, _CMP_GT_OQ) | (nan_mask(br) & ~nan_mask(tr));
    const __m512 l = _mm512_mask_blend_ps(sel_l, tl, bl);
    const __m512 r = _mm512_mask_blend_ps(sel_r, tr, br);
    const __mmask16 nl = nan_mask(l), nr = nan_mask(r);
    const __mmask16 tie = _mm512_cmp_ps_mask(r, l, _CMP_EQ_OQ) | (nl & nr);
    const __mmask16 pick_r =
        _mm512_cmp_ps_mask(r, l, _CMP_GT_OQ) | (nr & ~nl) | (tie & sel_l & __mmask16(~sel_r));
    const __m512 best = _mm512_mask_blend_ps(pick_r, l, r);
    const __mmask16 om = first_lanes(m);
    store16(y + o0, om, best);
    if (ip != nullptr) {
      __m512i at = _mm512_add_epi32(_mm512_set1_epi32(row0 + int32_t(2 * o0)), even);
      at = _mm512_mask_add_epi32(at, pick_r, at, one);
      const __mmask16 bottom = (pick_r & sel_r) | (__mmask16(~pick_r) & sel_l);
      at = _mm512_mask_add_epi32(at, bottom, at, wv);
      _mm512_mask_storeu_epi32(ip + o0, om, at);
    }
  }
}

// The backward of one output row of that pool, for windows that tile the plane (h = 2 ho,
// w = 2 wo): each window's four cells are written at once, the argmax's with its gradient
// (0 + g, as the portable loop: -0 -> +0) and the others with zeros, so no plane is cleared
// first. Even and odd columns are interleaved back into the two input rows.
ACCEL_POOL_AVX512 inline __m512 load_grads(const float* g, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, g);
}
ACCEL_POOL_AVX512 inline __m512 load_grads(const BFloat16* g, __mmask16 m) {
  const __m256i v = _mm256_maskz_loadu_epi16(m, g);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
// 2 m cells (m <= 16 windows) of one input row from its even (a) and odd (b) columns.
template <typename T>
ACCEL_POOL_AVX512 void store_pairs(T* r, int64_t m, __m512 a, __m512 b) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  store16(r, first_lanes(2 * m), _mm512_permutex2var_ps(a, lo, b));
  store16(r + 16, first_lanes(2 * m - 16), _mm512_permutex2var_ps(a, hi, b));
}

template <typename T>
ACCEL_POOL_AVX512 void max_row_2x2_bwd_avx512(const T* gy, const int32_t* ip, T* gx0, T* gx1,
                                              int32_t row0, int32_t w, int64_t n) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i one = _mm512_set1_epi32(1), wv = _mm512_set1_epi32(w);
  const __m512i w1 = _mm512_set1_epi32(w + 1);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t o0 = 0; o0 < n; o0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - o0);
    const __mmask16 om = first_lanes(m);
    const __m512 g = _mm512_add_ps(load_grads(gy + o0, om), zero);
    const __m512i at = _mm512_maskz_loadu_epi32(om, ip + o0);
    const __m512i d =
        _mm512_sub_epi32(at, _mm512_add_epi32(_mm512_set1_epi32(row0 + int32_t(2 * o0)), even));
    const __m512 tl = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()), g);
    const __m512 tr = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(d, one), g);
    const __m512 bl = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(d, wv), g);
    const __m512 br = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(d, w1), g);
    store_pairs(gx0 + 2 * o0, m, tl, tr);
    store_pairs(gx1 + 2 * o0, m, bl, br);
  }
}

#pragma GCC diagnostic pop

// Whether the rows run on AVX-512: the CPU has it and the kernels' level (ACCEL_CPU_ISA,
// set_cpu_isa) allows it.
bool pool_rows_avx512() {
  static const bool hw = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const CpuIsa isa = cpu_isa();
  return hw && (isa == CpuIsa::Avx512 || isa == CpuIsa::Native);
}

// max_row_2x2 on T's storage, or false when T has no vector path (f16).
template <typename T>
bool max_row_2x2_for(const T* r0, const T* r1, T* y, int32_t* ip, int32_t row0, int32_t w,
                     int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16>) {
    if (pool_rows_avx512()) {
      max_row_2x2_avx512<T>(r0, r1, y, ip, row0, w, n);
      return true;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    (ip ? &max_row_2x2<true> : &max_row_2x2<false>)(r0, r1, y, ip, row0, w, n);
    return true;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    // bf16 rows widened to float in chunks first (a shift each), then the float loop, the
    // maxima narrowed back exactly (each is one of the inputs): the cnn's bf16 pools ran at half
    // the float32 speed on the bf16 loop (1.8 against 0.9 ms for 128 x 64 x 14 x 14).
    constexpr int64_t kChunk = 256;
    float a[2 * kChunk], b[2 * kChunk], out[kChunk];
    const uint16_t* ra = reinterpret_cast<const uint16_t*>(r0);
    const uint16_t* rb = reinterpret_cast<const uint16_t*>(r1);
    uint16_t* ry = reinterpret_cast<uint16_t*>(y);
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t m = std::min(kChunk, n - c0);
      // An inline shift, not bf16_to_f32 (Note [vectorised bf16 casts]): on rows of 14-28
      // inputs its dispatched call made the cnn's pools 8-15 % slower (maxpool_train bf16).
#pragma omp simd
      for (int64_t i = 0; i < 2 * m; ++i) {
        a[i] = std::bit_cast<float>(uint32_t(ra[2 * c0 + i]) << 16);
        b[i] = std::bit_cast<float>(uint32_t(rb[2 * c0 + i]) << 16);
      }
      (ip ? &max_row_2x2<true> : &max_row_2x2<false>)(a, b, out, ip ? ip + c0 : nullptr,
                                                      row0 + int32_t(2 * c0), w, m);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) ry[c0 + i] = uint16_t(std::bit_cast<uint32_t>(out[i]) >> 16);
    }
    return true;
  } else {
    return false;
  }
}

template <typename T>
void pool_fwd_own(PoolKind kind, const T* x, T* y, int32_t* idx, const PoolGeom& g,
                  bool include_pad) {
  const bool max = kind == PoolKind::Max;
  parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const T* xp = x + pl * g.h * g.w;
      T* yp = y + pl * g.ho * g.wo;
      int32_t* ip = idx ? idx + pl * g.ho * g.wo : nullptr;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const int64_t h0 = oh * g.sh - g.ph;
        const bool rows_inside = h0 >= 0 && h0 + g.kh <= g.h;
        int64_t ow0 = 0;
        if (max && rows_inside && g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.pw == 0) {
          const int64_t n = std::min(g.w / 2, g.wo);  // the windows 2 ow, 2 ow + 1 < w
          if (max_row_2x2_for(xp + h0 * g.w, xp + (h0 + 1) * g.w, yp + oh * g.wo,
                              ip ? ip + oh * g.wo : nullptr, int32_t(h0 * g.w), int32_t(g.w), n))
            ow0 = n;
        }
        for (int64_t ow = ow0; ow < g.wo; ++ow) {
          const int64_t w0 = ow * g.sw - g.pw;
          const int64_t o = oh * g.wo + ow;
          const bool inside = rows_inside && w0 >= 0 && w0 + g.kw <= g.w;
          if (max) {
            MaxCell c{-std::numeric_limits<float>::infinity(), -1};
            if (inside) {
              c = {float(xp[h0 * g.w + w0]), h0 * g.w + w0};
              for (int64_t i = 0; i < g.kh; ++i) {
                const T* row = xp + (h0 + i) * g.w + w0;
                for (int64_t j = i == 0 ? 1 : 0; j < g.kw; ++j)
                  c.take(float(row[j]), (h0 + i) * g.w + w0 + j);
              }
            } else {
              for_window(g, oh, ow, [&](int64_t k) {
                if (c.at < 0) {
                  c = {float(xp[k]), k};
                } else {
                  c.take(float(xp[k]), k);
                }
              });
            }
            yp[o] = T(c.best);
            if (ip) ip[o] = int32_t(c.at);
          } else {
            float sum = 0.0f;
            if (inside) {
              for (int64_t i = 0; i < g.kh; ++i) {
                const T* row = xp + (h0 + i) * g.w + w0;
                for (int64_t j = 0; j < g.kw; ++j) sum += float(row[j]);
              }
            } else {
              for_window(g, oh, ow, [&](int64_t k) { sum += float(xp[k]); });
            }
            yp[o] = T(sum / float(window_count(g, oh, ow, include_pad)));
          }
        }
      }
    }
  });
}

template <typename T>
void pool_bwd_own(PoolKind kind, const T* gy, const int32_t* idx, T* gx, const PoolGeom& g,
                  bool include_pad) {
  if (kind == PoolKind::Max && g.sh >= g.kh && g.sw >= g.kw) {
    // Windows that do not overlap (the 2 x 2, stride 2 pool of every CNN): each input takes at
    // most one output's gradient, so it is written in place, with no float plane to sum into
    // and convert (Note [own 2 x 2 max pool]). 0 + g as the summing route gives (-0 -> +0).
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16>) {
      if (g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
          g.h == 2 * g.ho && g.w == 2 * g.wo && pool_rows_avx512()) {
        parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
          for (int64_t pl = b; pl < e; ++pl) {
            for (int64_t oh = 0; oh < g.ho; ++oh) {
              const int64_t o = pl * g.ho * g.wo + oh * g.wo;
              T* r0 = gx + pl * g.h * g.w + 2 * oh * g.w;
              max_row_2x2_bwd_avx512<T>(gy + o, idx + o, r0, r0 + g.w, int32_t(2 * oh * g.w),
                                        int32_t(g.w), g.wo);
            }
          }
        });
        return;
      }
    }
    parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
      const int64_t hw = g.h * g.w, ohw = g.ho * g.wo;
      std::memset(static_cast<void*>(gx + b * hw), 0, size_t((e - b) * hw) * sizeof(T));
      for (int64_t pl = b; pl < e; ++pl) {
        const T* gyp = gy + pl * ohw;
        const int32_t* ip = idx + pl * ohw;
        T* gxp = gx + pl * hw;
        for (int64_t o = 0; o < ohw; ++o)
          if (ip[o] >= 0) gxp[ip[o]] = T(0.0f + float(gyp[o]));
      }
    });
    return;
  }
  parallel_for(g.planes, 1, [&](int64_t b, int64_t e) {
    std::vector<float> acc(size_t(g.h * g.w));
    for (int64_t pl = b; pl < e; ++pl) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const T* gyp = gy + pl * g.ho * g.wo;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const int64_t o = oh * g.wo + ow;
          if (kind == PoolKind::Max) {
            const int32_t k = idx[pl * g.ho * g.wo + o];
            if (k >= 0) acc[size_t(k)] += float(gyp[o]);
          } else {
            const float v = float(gyp[o]) / float(window_count(g, oh, ow, include_pad));
            for_window(g, oh, ow, [&](int64_t k) { acc[size_t(k)] += v; });
          }
        }
      }
      T* gxp = gx + pl * g.h * g.w;
      for (int64_t k = 0; k < g.h * g.w; ++k) gxp[k] = T(acc[size_t(k)]);
    }
  });
}

template <typename F>
void dispatch_pool_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case kFloat32: return f(float());
    case kBFloat16: return f(BFloat16());
    case kFloat16: return f(Half());
    default: ACCEL_THROW(DTypeError, op, "no CPU pooling kernel for ", dt);
  }
}

std::atomic<int> g_cpu_pool{int(CpuPool::Auto)};

// ---------------- pooling ----------------

struct PoolFwdEntry {
  dnnl::pooling_forward prim;
  memory src, dst, ws;
  int64_t ws_bytes = 0;
  onednn::ExecArgs<3> args;
  bool supported = false;
  bool slow = false;  // oneDNN picked a simple / reference implementation
};

// Note [own 2 x 2 max pool]: the pool of every small CNN (2 x 2, stride 2) trains faster on this
// kernel than on oneDNN's AVX-512 JIT one on the Intel AMX kind (2026-12-06, one cnn step's two
// pools, forward + backward, 128 x 32 x 28 x 28 and 128 x 64 x 14 x 14: float32 1.7 and 1.3 ms
// against oneDNN's 3.7 and 2.2, bf16 1.9 and 1.5 against 3.5 and 2.2: `build/bench/kernels
// --benchmark_filter=^maxpool_train/`): its windows do not overlap, so the backward writes each
// input's gradient in place from the int32 argmax, where oneDNN's backward took twice the
// forward. So Auto takes it for a training max pool of that shape in float32 and bf16 (its
// forward has a row loop for them), oneDNN for the rest. The rows run on AVX-512 where the CPU
// has it (max_row_2x2_avx512, and the backward's max_row_2x2_bwd_avx512 when the windows tile
// the plane): pool.cc is built for the baseline ISA, where the row loop vectorised for SSE and
// rows of 14 or 7 outputs ran mostly scalar; forward + backward went from 1.59 / 1.80 / 1.24 /
// 1.43 ms to 0.92 / 0.78 / 0.68 / 0.75 (pool1 f32 / bf16, pool2 f32 / bf16, 2026-12-06).

// oneDNN's simple / reference implementations (Note [own NCHW pooling]).
bool slow_impl(const std::string& impl) {
  return impl.rfind("simple", 0) == 0 || impl.rfind("ref", 0) == 0;
}

struct PoolBwdEntry {
  dnnl::pooling_backward prim;
  memory diff_dst, diff_src, ws;
  onednn::ExecArgs<3> args;
  bool supported = false;
  bool slow = false;
};

dnnl::algorithm pool_algorithm(PoolKind kind, const Pool2dParams& p) {
  if (kind == PoolKind::Max) return dnnl::algorithm::pooling_max;
  return p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                             : dnnl::algorithm::pooling_avg_exclude_padding;
}

struct PoolDescs {
  memory::desc src, dst;
  memory::dims strides, kernel, pad_l, pad_r;
};

PoolDescs pool_descs(const Shape& in, const Shape& out, DType dtype, const Pool2dParams& p) {
  PoolDescs d;
  const auto dt = onednn::to_dnnl(dtype);
  d.src = memory::desc(onednn::dims_of(in), dt, Tag::nchw);
  d.dst = memory::desc(onednn::dims_of(out), dt, Tag::nchw);
  d.strides = {p.stride[0], p.stride[1]};
  d.kernel = {p.kernel[0], p.kernel[1]};
  d.pad_l = {p.padding[0], p.padding[1]};
  d.pad_r = {p.padding[0], p.padding[1]};
  return d;
}

dnnl::pooling_forward::primitive_desc pool_fwd_pd(PoolKind kind, const PoolDescs& d,
                                                  const Pool2dParams& p, bool training) {
  using F = dnnl::pooling_forward;
  return F::primitive_desc(
      F::desc(training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
              pool_algorithm(kind, p), d.src, d.dst, d.strides, d.kernel, d.pad_l, d.pad_r),
      onednn::engine());
}

onednn::PrimKey pool_key(int dir, PoolKind kind, const Shape& in, DType dt, const Pool2dParams& p,
                         bool training) {
  onednn::PrimKey k;
  for (int64_t v : {int64_t(dir), int64_t(kind), int64_t(dt), int64_t(training), in[0], in[1],
                    in[2], in[3], p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0],
                    p.padding[1], int64_t(p.count_include_pad)})
    k.push(v);
  k.push(omp_get_max_threads());  // a primitive's decomposition is fixed at creation
  return k;
}

bool pool_fwd_onednn(PoolKind kind, const Tensor& x, Tensor& out, Tensor* workspace,
                     const Pool2dParams& p) {
  const TeamScope team;  // Note [team under load]: before the primitive lookup
  const bool training = kind == PoolKind::Max && workspace != nullptr;
  thread_local onednn::PrimCache<PoolFwdEntry> cache;
  PoolFwdEntry& e = cache.get(pool_key(0, kind, x.sizes(), x.dtype(), p, training), [&] {
    PoolFwdEntry n;
    if (onednn::to_dnnl(x.dtype()) == memory::data_type::undef) return n;
    const PoolDescs d = pool_descs(x.sizes(), out.sizes(), x.dtype(), p);
    n.supported = onednn::try_create("pool2d", [&] {
      const auto pd = pool_fwd_pd(kind, d, p, training);
      n.slow = slow_impl(pd.impl_info_str());
      n.prim = dnnl::pooling_forward(pd);
      if (training) {
        n.ws = onednn::unbound_memory(pd.workspace_desc());
        n.ws_bytes = int64_t(pd.workspace_desc().get_size());
      }
    });
    if (!n.supported) return n;
    n.src = onednn::unbound_memory(d.src);
    n.dst = onednn::unbound_memory(d.dst);
    n.args.add(DNNL_ARG_SRC, n.src);
    n.args.add(DNNL_ARG_DST, n.dst);
    if (training) n.args.add(DNNL_ARG_WORKSPACE, n.ws);
    return n;
  });
  if (!e.supported || (e.slow && cpu_pool() == CpuPool::Auto)) return false;
  onednn::bind(e.src, x.data_ptr(), "pool2d");
  onednn::bind(e.dst, out.data_ptr(), "pool2d");
  if (training) {
    *workspace = empty({std::max<int64_t>(e.ws_bytes, 1)}, TensorOptions(kUInt8));
    onednn::bind(e.ws, workspace->data_ptr(), "pool2d");
  }
  onednn::execute(e.prim, e.args, "pool2d");
  return true;
}

bool pool_bwd_onednn(PoolKind kind, const Tensor& gout, const Tensor& workspace, Tensor& gx,
                     const Pool2dParams& p) {
  const TeamScope team;  // Note [team under load]: before the primitive lookup
  const bool is_max = kind == PoolKind::Max;
  thread_local onednn::PrimCache<PoolBwdEntry> cache;
  PoolBwdEntry& e = cache.get(pool_key(1, kind, gx.sizes(), gx.dtype(), p, true), [&] {
    PoolBwdEntry n;
    if (onednn::to_dnnl(gx.dtype()) == memory::data_type::undef) return n;
    const PoolDescs d = pool_descs(gx.sizes(), gout.sizes(), gx.dtype(), p);
    n.supported = onednn::try_create("pool2d_backward", [&] {
      using B = dnnl::pooling_backward;
      const auto hint = pool_fwd_pd(kind, d, p, true);
      const B::primitive_desc pd(
          B::desc(pool_algorithm(kind, p), d.src, d.dst, d.strides, d.kernel, d.pad_l, d.pad_r),
          onednn::engine(), hint);
      n.slow = slow_impl(pd.impl_info_str());
      n.prim = B(pd);
      if (is_max) n.ws = onednn::unbound_memory(hint.workspace_desc());
    });
    if (!n.supported) return n;
    n.diff_dst = onednn::unbound_memory(d.dst);
    n.diff_src = onednn::unbound_memory(d.src);
    n.args.add(DNNL_ARG_DIFF_DST, n.diff_dst);
    n.args.add(DNNL_ARG_DIFF_SRC, n.diff_src);
    if (is_max) n.args.add(DNNL_ARG_WORKSPACE, n.ws);
    return n;
  });
  // Max pool follows its forward (the workspace's format); avg pool chooses as the forward does.
  if (!e.supported || (!is_max && e.slow && cpu_pool() == CpuPool::Auto)) return false;
  onednn::bind(e.diff_dst, gout.data_ptr(), "pool2d_backward");
  onednn::bind(e.diff_src, gx.data_ptr(), "pool2d_backward");
  if (is_max) onednn::bind(e.ws, workspace.data_ptr(), "pool2d_backward");
  onednn::execute(e.prim, e.args, "pool2d_backward");
  return true;
}

void pool2d_kernel(PoolKind kind, const Tensor& x, Tensor& out, Tensor* workspace,
                   const Pool2dParams& p) {
  if (x.dtype() == kFloat64) {
    const PoolGeom g = pool_geom(x.sizes(), out.sizes(), p);
    Tensor idx;
    if (kind == PoolKind::Max && workspace) idx = empty(out.sizes(), TensorOptions(kInt64));
    pool_fwd_ref<double>(kind, x.data<double>(), out.data<double>(),
                         idx.defined() ? idx.data<int64_t>() : nullptr, g, p.count_include_pad);
    if (workspace) *workspace = idx;
    return;
  }
  if (out.numel() == 0) return;
  // Note [own 2 x 2 max pool]: the training max pool of windows that do not overlap runs here
  // whatever oneDNN has.
  const bool own_first = kind == PoolKind::Max && workspace != nullptr && p.kernel[0] == 2 &&
                         p.kernel[1] == 2 && p.stride[0] == 2 && p.stride[1] == 2 &&
                         p.padding[1] == 0 && (x.dtype() == kFloat32 || x.dtype() == kBFloat16);
  if (cpu_pool() == CpuPool::OneDnn || (cpu_pool() == CpuPool::Auto && !own_first)) {
    if (pool_fwd_onednn(kind, x, out, workspace, p)) return;
  }
  // Note [own NCHW pooling]: oneDNN has none for this dtype, or only a slow one.
  const PoolGeom g = pool_geom(x.sizes(), out.sizes(), p);
  ACCEL_CHECK(g.h * g.w <= std::numeric_limits<int32_t>::max(), ShapeError, "pool2d",
              "an input plane of ", g.h, " x ", g.w, " is too large for int32 indices");
  Tensor idx;
  if (kind == PoolKind::Max && workspace) idx = empty(out.sizes(), TensorOptions(kInt32));
  dispatch_pool_float(x.dtype(), "pool2d", [&]<typename T>(T) {
    pool_fwd_own<T>(kind, x.data<T>(), out.data<T>(), idx.defined() ? idx.data<int32_t>() : nullptr,
                    g, p.count_include_pad);
  });
  if (workspace) *workspace = idx;
}

void pool2d_backward_kernel(PoolKind kind, const Tensor& gout, const Tensor& workspace, Tensor& gx,
                            const Pool2dParams& p) {
  if (gx.dtype() == kFloat64) {
    const PoolGeom g = pool_geom(gx.sizes(), gout.sizes(), p);
    pool_bwd_ref<double>(kind, gout.data<double>(),
                         kind == PoolKind::Max ? workspace.data<int64_t>() : nullptr,
                         gx.data<double>(), g, p.count_include_pad);
    return;
  }
  if (gout.numel() == 0) {
    fill_stub(gx.device(), gx, Scalar(0));
    return;
  }
  // A max pool's workspace says which forward ran: int32 indices come from pool_fwd_own.
  const bool own_ws = kind == PoolKind::Max && workspace.dtype() == kInt32;
  if (!own_ws && !(kind == PoolKind::Avg && cpu_pool() == CpuPool::Own) &&
      pool_bwd_onednn(kind, gout, workspace, gx, p))
    return;
  ACCEL_CHECK(kind != PoolKind::Max || own_ws, Error, "pool2d_backward",
              "no oneDNN backward for this max pool's workspace (", workspace.dtype(), ", input ",
              gx.sizes(), ")");
  const PoolGeom g = pool_geom(gx.sizes(), gout.sizes(), p);
  dispatch_pool_float(gx.dtype(), "pool2d_backward", [&]<typename T>(T) {
    pool_bwd_own<T>(kind, gout.data<T>(), own_ws ? workspace.data<int32_t>() : nullptr,
                    gx.data<T>(), g, p.count_include_pad);
  });
}

}  // namespace

void set_cpu_pool(CpuPool impl) { g_cpu_pool.store(int(impl), std::memory_order_relaxed); }
CpuPool cpu_pool() { return CpuPool(g_cpu_pool.load(std::memory_order_relaxed)); }

ACCEL_REGISTER_KERNEL(pool2d_stub, CPU, &pool2d_kernel);
ACCEL_REGISTER_KERNEL(pool2d_backward_stub, CPU, &pool2d_backward_kernel);

}  // namespace accel::cpu
