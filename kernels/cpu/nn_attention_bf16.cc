// CPU fused attention in bf16 on vdpbf16ps (AVX512-BF16): the first route of Note [bf16 fused
// attention] in nn_attention.cc, which holds the other routes and the dispatch. Compiled only in
// the pass that has the instructions (ACCEL_SDPA_BF16_INSN, nn_attention.h); the dispatch checks
// the CPU has them first.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_convert.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/nn_attention_bf16.cc"
#include "kernels/cpu/isa_foreach.h"
#else
#include "kernels/cpu/nn_attention.h"
#if defined(ACCEL_SDPA_BF16_INSN)
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// The AVX-512 pass's features plus AVX512-BF16; the dispatcher checks the CPU has it first.
#define ACCEL_BF16_FN                                                            \
  __attribute__((                                                                \
      target("avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512bw,avx512cd," \
             "avx512dq,avx512vl,avx512bf16")))

constexpr int64_t kMr = 4;  // rows of C per microkernel tile

inline int64_t round16(int64_t n) { return (n + 15) & ~int64_t(15); }
inline int64_t pairs(int64_t n) { return (n + 1) / 2; }
inline __mmask16 first_n(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}
template <typename V>
V* grown(std::vector<V>& buf, int64_t n) {
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  return buf.data();
}
inline float bf16_value(uint16_t x) { return std::bit_cast<float>(uint32_t(x) << 16); }

// The microkernel: C (MR, 16 NV) = [C +] A B, reduced over k2 pairs with vdpbf16ps. A: bf16
// pairs as u32, pair p of row m at a[m * ars + p * aps] (ars = lda, aps = 1 for a row-major
// matrix; ars = 1, aps = ldb for the transpose of a pair-packed one); B: pair-packed, row p's 16 NV
// words at b + p * ldb. acc: add into C instead of overwriting it.
template <int MR, int NV>
ACCEL_BF16_FN void tile(int64_t k2, const uint32_t* a, int64_t ars, int64_t aps, const uint32_t* b,
                        int64_t ldb, float* c, int64_t ldc, bool acc) {
  __m512 s[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      s[r][v] = acc ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < k2; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r * ars + p * aps]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_dpbf16_ps(s[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, s[r][v]);
  }
}

using TileFn = void (*)(int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t,
                        float*, int64_t, bool);
constexpr TileFn kTiles[kMr][4] = {{&tile<1, 1>, &tile<1, 2>, &tile<1, 3>, &tile<1, 4>},
                                   {&tile<2, 1>, &tile<2, 2>, &tile<2, 3>, &tile<2, 4>},
                                   {&tile<3, 1>, &tile<3, 2>, &tile<3, 3>, &tile<3, 4>},
                                   {&tile<4, 1>, &tile<4, 2>, &tile<4, 3>, &tile<4, 4>}};

// Which part of a causal block's product can be nonzero, for C's row m (off relates the two
// index ranges; Note [bf16 fused attention]): NEnd: columns n <= m + off (scores, dP); KEnd:
// reduction index k <= m + off (P V, dS K); KBegin: k >= m + off (dS^T Q, P^T dO). Tiles skip
// the rest; with NEnd C's columns past the tile's last row's are left unwritten.
enum class Tri { None, NEnd, KEnd, KBegin };

// C (M, N) = [C +] A (M, 2 k2) B (2 k2, N) through the microkernel. B's rows hold round16(N)
// words (zero padded) and C has room for round16(N) columns.
ACCEL_BF16_FN void gemm_bf16(int64_t M, int64_t N, int64_t k2, const uint32_t* a, int64_t ars,
                             int64_t aps, const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                             bool acc, Tri tri = Tri::None, int64_t off = 0) {
  for (int64_t m0 = 0; m0 < M; m0 += kMr) {
    const int64_t mr = std::min(kMr, M - m0);
    int64_t n_end = N, p0 = 0, p1 = k2;
    if (tri == Tri::NEnd) n_end = std::clamp<int64_t>(m0 + mr + off, 0, N);
    if (tri == Tri::KEnd) p1 = std::clamp<int64_t>(pairs(m0 + mr + off), 0, k2);
    if (tri == Tri::KBegin) p0 = std::min(std::max<int64_t>(0, m0 + off) / 2, k2);
    for (int64_t n0 = 0; n0 < n_end; n0 += 64) {
      const int64_t nv = std::min<int64_t>(4, (n_end - n0 + 15) / 16);
      kTiles[mr - 1][nv - 1](std::max<int64_t>(0, p1 - p0), a + m0 * ars + p0 * aps, ars, aps,
                             b + p0 * ldb + n0, ldb, c + m0 * ldc + n0, ldc, acc);
    }
  }
}

// A row-major bf16 operand: rows x n values (row stride ld) -> rows of lda words, the odd last
// value's pair and everything past it zero.
ACCEL_BF16_FN void copy_rows(const uint16_t* src, int64_t ld, int64_t rows, int64_t n,
                             uint32_t* dst, int64_t lda) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst + r * lda);
    const uint16_t* s = src + r * ld;
    for (int64_t j = 0; j < 2 * lda; j += 16) {
      _mm256_mask_storeu_epi16(d + j, first_n(2 * lda - j),
                               _mm256_maskz_loadu_epi16(first_n(n - j), s + j));
    }
  }
}

// A pair-packed B operand from a row-major bf16 one, K x N (row stride ld): word n of row p is
// B(2p, n) | B(2p + 1, n) << 16, zero for n >= N and for row K when K is odd.
ACCEL_BF16_FN void pack_pairs(const uint16_t* src, int64_t ld, int64_t K, int64_t N, uint32_t* dst,
                              int64_t ldb) {
  for (int64_t p = 0; p < pairs(K); ++p) {
    const uint16_t* r0 = src + 2 * p * ld;
    const uint16_t* r1 = r0 + ld;
    const bool odd = 2 * p + 1 == K;
    for (int64_t n = 0; n < ldb; n += 16) {
      const __mmask16 mk = first_n(N - n);
      const __m512i lo = _mm512_maskz_cvtepu16_epi32(mk, _mm256_maskz_loadu_epi16(mk, r0 + n));
      const __m512i hi =
          odd ? _mm512_setzero_si512()
              : _mm512_maskz_cvtepu16_epi32(mk, _mm256_maskz_loadu_epi16(mk, r1 + n));
      _mm512_storeu_si512(dst + p * ldb + n,
                          _mm512_or_si512(lo, _mm512_maskz_slli_epi32(mk, hi, 16)));
    }
  }
}

// The same from float32, rounding each value to bf16.
ACCEL_BF16_FN void pack_pairs(const float* src, int64_t ld, int64_t K, int64_t N, uint32_t* dst,
                              int64_t ldb) {
  for (int64_t p = 0; p < pairs(K); ++p) {
    const float* r0 = src + 2 * p * ld;
    const float* r1 = r0 + ld;
    const bool odd = 2 * p + 1 == K;
    for (int64_t n = 0; n < ldb; n += 16) {
      const __mmask16 mk = first_n(N - n);
      const __m512i lo = _mm512_maskz_cvtepu16_epi32(
          mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r0 + n)));
      const __m512i hi =
          odd ? _mm512_setzero_si512()
              : _mm512_maskz_cvtepu16_epi32(
                    mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r1 + n)));
      _mm512_storeu_si512(dst + p * ldb + n,
                          _mm512_or_si512(lo, _mm512_maskz_slli_epi32(mk, hi, 16)));
    }
  }
}

// r[c] = column c of the 16 x 16 matrix of 32-bit words whose row i is r[i].
ACCEL_BF16_FN inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(0xffff, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[2 * i], r[2 * i + 1]);
  }
  // Lane L (128 bits) of r[4 i + j]: column 4 L + j of rows 4 i .. 4 i + 3.
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_maskz_shuffle_i32x4(0xffff, r[j], r[4 + j], 0x44);  // a0 a1 b0 b1
    const __m512i x1 = _mm512_maskz_shuffle_i32x4(0xffff, r[j], r[4 + j], 0xee);  // a2 a3 b2 b3
    const __m512i y0 = _mm512_maskz_shuffle_i32x4(0xffff, r[8 + j], r[12 + j], 0x44);
    const __m512i y1 = _mm512_maskz_shuffle_i32x4(0xffff, r[8 + j], r[12 + j], 0xee);
    t[j] = _mm512_maskz_shuffle_i32x4(0xffff, x0, y0, 0x88);       // column j
    t[4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, x0, y0, 0xdd);   // column 4 + j
    t[8 + j] = _mm512_maskz_shuffle_i32x4(0xffff, x1, y1, 0x88);   // column 8 + j
    t[12 + j] = _mm512_maskz_shuffle_i32x4(0xffff, x1, y1, 0xdd);  // column 12 + j
  }
  for (int c = 0; c < 16; ++c) r[c] = t[c];
}

// The pair-packed transpose of a row-major bf16 matrix N x K (row stride ld), i.e. B = src^T:
// word n of row p is src(n, 2p) | src(n, 2p + 1) << 16. A row's pairs are its 32-bit words, so
// this is a 32-bit transpose, done in 16 x 16 blocks in registers (the masked loads zero the
// upper half of the last pair when K is odd, and rows n >= N).
ACCEL_BF16_FN void pack_pairs_t(const uint16_t* src, int64_t ld, int64_t N, int64_t K,
                                uint32_t* dst, int64_t ldb) {
  const int64_t k2 = pairs(K);
  for (int64_t n0 = 0; n0 < ldb; n0 += 16) {
    for (int64_t p0 = 0; p0 < k2; p0 += 16) {
      const int64_t left = K - 2 * p0;
      const __mmask32 mk = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = n0 + i < N ? _mm512_maskz_loadu_epi16(mk, src + (n0 + i) * ld + 2 * p0)
                          : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int64_t c = 0; c < std::min<int64_t>(16, k2 - p0); ++c) {
        _mm512_storeu_si512(dst + (p0 + c) * ldb + n0, r[c]);
      }
    }
  }
}

// d[j] = bf16(s[j]) for j < n (vcvtneps2bf16, round to nearest even).
ACCEL_BF16_FN inline void store_bf16(const float* s, uint16_t* d, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mk = first_n(n - j);
    _mm256_mask_storeu_epi16(d + j, mk,
                             (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, s + j)));
  }
}

// exp_f32 (Note [vectorised exp] in softmax_rows.h) on 16 lanes: the same constants and steps.
ACCEL_BF16_FN inline __m512 exp16(__m512 x) {
  const __m512 xc = _mm512_maskz_min_ps(
      0xffff, _mm512_maskz_max_ps(0xffff, x, _mm512_set1_ps(-86.0f)), _mm512_set1_ps(88.7228394f));
  const __m512 round = _mm512_set1_ps(12582912.0f);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), round), round);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_maskz_slli_epi32(
      0xffff, _mm512_add_epi32(_mm512_maskz_cvttps_epi32(0xffff, n), _mm512_set1_epi32(126)), 23);
  __m512 res = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e)), _mm512_set1_ps(2.0f));
  res = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_LT_OQ), res,
                             _mm512_setzero_ps());
  res = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.7228394f), _CMP_GT_OQ), res,
                             _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), res, x);
}

// Horizontal max and sum of 16 lanes (through memory: once per row, and GCC 12's
// _mm512_reduce_* warn about their undefined temporaries).
ACCEL_BF16_FN inline float hmax(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float m = t[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, t[i]);
  return m;
}
ACCEL_BF16_FN inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (int i = 0; i < 16; ++i) s += t[i];
  return s;
}

// row[j] = scale * row[j] for j < len, in place; returns their max (-inf for len 0).
ACCEL_BF16_FN inline float scale_max(float* row, int64_t len, float scale) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 mk = first_n(len - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, row + j), sc);
    _mm512_mask_storeu_ps(row + j, mk, x);
    m = _mm512_mask_max_ps(m, mk, m, x);
  }
  return hmax(m);
}

// row[j] = e_j = exp(row[j] - mx) for j < len and 0 in [len, round16(w)); the same values rounded
// to bf16 into pa[0, round16(w)) (both need that room); returns sum e_j. One pass: the scores'
// exp, the probabilities' bf16 copy for the P V product and the row sum.
ACCEL_BF16_FN inline float exp_row(float* row, int64_t len, int64_t w, float mx, uint16_t* pa) {
  __m512 s = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(mx);
  for (int64_t j = 0; j < w; j += 16) {
    const __mmask16 mk = first_n(len - j);
    const __m512 e =
        _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, row + j), m)));
    _mm512_storeu_ps(row + j, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pa + j), (__m256i)_mm512_cvtneps_pbh(e));
    s = _mm512_add_ps(s, e);
  }
  return hsum(s);
}

// Forward of rows [i0, i1) of one slice, bf16 operands (Note [bf16 fused attention]); the same
// schedule and arguments as forward_rows.
ACCEL_BF16_FN void forward_rows_bf16(const Slice<uint16_t>& x, const MaskOperand<float>& M,
                                     int64_t b, int64_t h, int64_t i0, int64_t i1,
                                     const Geometry& g, int64_t D, int64_t Dv, float scale,
                                     uint16_t* os, int64_t ldo, float* ls, uint16_t* ps,
                                     int64_t ldp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  thread_local std::vector<uint32_t> qa_, kt_, pa_, vp_;
  thread_local std::vector<float> s_, o_;
  const int64_t rows = i1 - i0, nc = g.cols(i1);
  const int64_t bc = ps ? nc : std::min(kColBlock, nc);
  // pa's rows hold bcp values (not just bc rounded to even): exp_row stores whole vectors.
  const int64_t d2 = pairs(D), bcp = round16(bc), bc2 = bcp / 2, dvp = round16(Dv);
  uint32_t* qa = grown(qa_, rows * d2);   // Q rows            (rows, d2) words
  uint32_t* kt = grown(kt_, d2 * bcp);    // K^T pair-packed   (d2, bcp)
  float* sb = grown(s_, rows * bcp);      // scores, then exp  (rows, bcp)
  uint32_t* pa = grown(pa_, rows * bc2);  // exp in bf16      (rows, bcp / 2) words
  uint32_t* vp = grown(vp_, bc2 * dvp);   // V pair-packed    (bc2, dvp)
  float* ob = grown(o_, rows * dvp);      // O accumulator    (rows, dvp)
  const Tri tri_n = g.causal ? Tri::NEnd : Tri::None, tri_k = g.causal ? Tri::KEnd : Tri::None;
  copy_rows(x.q, x.ldq, rows, D, qa, d2);
  float m[kRowBlock], l[kRowBlock], alpha[kRowBlock];
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.f);
  for (int64_t c0 = 0; c0 < nc; c0 += bc) {
    const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
    pack_pairs_t(x.k + c0 * x.ldk, x.ldk, w, D, kt, bcp);
    gemm_bf16(rows, w, d2, qa, d2, 1, kt, bcp, sb, bcp, false, tri_n, i0 - c0);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = sb + r * bcp;
      const int64_t len = g.len(i0 + r, c0, c1);
      float mx = scale_max(row, len, scale);
      if (M.base != nullptr) {
        M.add_row(row, b, h, i0 + r, c0, len);
        mx = row_max<float>(row, len);
      }
      const float m_new = std::max(m[r], mx);
      // m_new == -inf (nothing seen yet): every e_j is 0 (exp(-inf - -inf) would be NaN).
      const float s = exp_row(row, m_new != kNegInf ? len : 0, w, m_new,
                              reinterpret_cast<uint16_t*>(pa + r * bc2));
      alpha[r] = m[r] == kNegInf ? 0.f : exp_acc<float>(m[r] - m_new);
      l[r] = l[r] * alpha[r] + s;
      m[r] = m_new;
    }
    if (c0 > 0) {
      for (int64_t r = 0; r < rows; ++r) {
        float* orow = ob + r * dvp;
        const float a = alpha[r];
#pragma omp simd
        for (int64_t j = 0; j < Dv; ++j) orow[j] *= a;
      }
    }
    pack_pairs(x.v + c0 * x.ldv, x.ldv, w, Dv, vp, dvp);
    gemm_bf16(rows, Dv, pairs(w), pa, bc2, 1, vp, dvp, ob, dvp, c0 > 0, tri_k, i0 - c0);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / l[r];
    float* orow = ob + r * dvp;
#pragma omp simd
    for (int64_t j = 0; j < Dv; ++j) orow[j] *= inv;
    store_bf16(orow, os + r * ldo, Dv);
    ls[r] = m[r] + std::log(l[r]);
    if (ps) {
      float* prow = sb + r * bcp;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) prow[j] *= inv;
      store_bf16(prow, ps + r * ldp, nc);
      std::fill(ps + r * ldp + nc, ps + r * ldp + g.S, uint16_t(0));
    }
  }
}

// 16 probabilities from float32 or (kept, bf16) memory; lanes outside mk are 0.
ACCEL_BF16_FN inline __m512 load_p(const float* p, __mmask16 mk) {
  return _mm512_maskz_loadu_ps(mk, p);
}
ACCEL_BF16_FN inline __m512 load_p(const uint16_t* p, __mmask16 mk) {
  const __m512i u = _mm512_maskz_cvtepu16_epi32(mk, _mm256_maskz_loadu_epi16(mk, p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(mk, u, 16));
}

// One row of dS in place of dP: d[j] = P_j (d[j] - delta) for j < len, 0 in [len, round16(w));
// its bf16 copy into da (the row-major A of dS K). Both need round16(w) room.
template <typename PT>
ACCEL_BF16_FN inline void ds_row(float* d, const PT* p, int64_t len, int64_t w, float delta,
                                 uint16_t* da) {
  const __m512 dl = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < w; j += 16) {
    const __mmask16 mk = first_n(len - j);
    const __m512 v = _mm512_maskz_mul_ps(mk, load_p(p + j, mk),
                                         _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, d + j), dl));
    _mm512_storeu_ps(d + j, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(da + j), (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// Gradients of one slice, bf16 operands; the same schedule and arguments as backward_slice.
ACCEL_BF16_FN void backward_slice_bf16(const Slice<uint16_t>& x, const MaskOperand<float>& M,
                                       int64_t b, int64_t h, const Geometry& g, int64_t D,
                                       int64_t Dv, float scale, const uint16_t* o, int64_t ldo,
                                       const uint16_t* dO, int64_t lddo, const float* L,
                                       const uint16_t* P, uint16_t* dqs0, int64_t ldq,
                                       uint16_t* dks, int64_t ldk, uint16_t* dvs, int64_t ldv) {
  thread_local std::vector<uint32_t> qa_, qb_, doa_, dob_, kt_, vt_, kb_, pp_, dsp_, dsa_;
  thread_local std::vector<float> dka_, dva_, dqa_, p_, ds_;
  const int64_t Tq = g.T, S = g.S;
  const int64_t d2 = pairs(D), dv2 = pairs(Dv), dp = round16(D), dvp = round16(Dv);
  const Tri tri_n = g.causal ? Tri::NEnd : Tri::None, tri_k = g.causal ? Tri::KEnd : Tri::None,
            tri_kb = g.causal ? Tri::KBegin : Tri::None;
  float* dka = grown(dka_, S * dp);   // dK accumulator (S, dp)
  float* dva = grown(dva_, S * dvp);  // dV accumulator (S, dvp)
  std::fill(dka, dka + S * dp, 0.f);
  std::fill(dva, dva + S * dvp, 0.f);
  for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
    const int64_t i1 = std::min(Tq, i0 + kRowBlock), rows = i1 - i0, nc = g.cols(i1);
    const int64_t r2 = pairs(rows);
    const uint16_t* qs = x.q + i0 * x.ldq;
    const uint16_t* os = o + i0 * ldo;
    const uint16_t* dos = dO + i0 * lddo;
    const float* ls = L + i0;
    uint16_t* dqs = dqs0 + i0 * ldq;
    if (nc == 0) {
      for (int64_t r = 0; r < rows; ++r) std::fill(dqs + r * ldq, dqs + r * ldq + D, uint16_t(0));
      continue;
    }
    float delta[kRowBlock];
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* a = dos + r * lddo;
      const uint16_t* orow = os + r * ldo;
      float acc[kLanes<float>] = {};  // Note [lane sums] in softmax_rows.h
      int64_t j = 0;
      for (; j + kLanes<float> <= Dv; j += kLanes<float>) {
#pragma omp simd
        for (int k = 0; k < kLanes<float>; ++k)
          acc[k] += bf16_value(a[j + k]) * bf16_value(orow[j + k]);
      }
      float tail = 0;
      for (; j < Dv; ++j) tail += bf16_value(a[j]) * bf16_value(orow[j]);
      delta[r] = lane_tree(acc) + tail;
    }
    const int64_t bc = P ? nc : std::min(kColBlock, nc);
    const int64_t bcp = round16(bc), bc2 = pairs(bc), ldsa = bcp / 2;
    uint32_t* qa = grown(qa_, rows * d2);      // Q rows (scores)           (rows, d2)
    uint32_t* qb = grown(qb_, r2 * dp);        // Q pair-packed (dK)        (r2, dp)
    uint32_t* doa = grown(doa_, rows * dv2);   // dO rows (dP)             (rows, dv2)
    uint32_t* dob = grown(dob_, r2 * dvp);     // dO pair-packed (dV)      (r2, dvp)
    uint32_t* kt = grown(kt_, d2 * bcp);       // K^T pair-packed (scores) (d2, bcp)
    uint32_t* vt = grown(vt_, dv2 * bcp);      // V^T pair-packed (dP)     (dv2, bcp)
    uint32_t* kb = grown(kb_, bc2 * dp);       // K pair-packed (dQ)       (bc2, dp)
    uint32_t* pp = grown(pp_, r2 * bcp);       // P pair-packed (dV)       (r2, bcp)
    uint32_t* dsp = grown(dsp_, r2 * bcp);     // dS pair-packed (dK)      (r2, bcp)
    uint32_t* dsa = grown(dsa_, rows * ldsa);  // dS rows (dQ)            (rows, bcp / 2)
    float* pf = grown(p_, rows * bcp);         // P, when recomputed (rows, bcp)
    float* ds = grown(ds_, rows * bcp);        // dP, then dS              (rows, bcp)
    float* dqa = grown(dqa_, rows * dp);       // dQ accumulator           (rows, dp)
    if (!P) copy_rows(qs, x.ldq, rows, D, qa, d2);
    pack_pairs(qs, x.ldq, rows, D, qb, dp);
    copy_rows(dos, lddo, rows, Dv, doa, dv2);
    pack_pairs(dos, lddo, rows, Dv, dob, dvp);
    for (int64_t c0 = 0; c0 < nc; c0 += bc) {
      const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
      const uint16_t* ks = x.k + c0 * x.ldk;
      const uint16_t* vs = x.v + c0 * x.ldv;
      const uint16_t* pk = P ? P + i0 * S + c0 : nullptr;  // kept P rows (row stride S)
      if (P) {
        pack_pairs(pk, S, rows, w, pp, bcp);
      } else {
        pack_pairs_t(ks, x.ldk, w, D, kt, bcp);
        gemm_bf16(rows, w, d2, qa, d2, 1, kt, bcp, pf, bcp, false, tri_n, i0 - c0);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = pf + r * bcp;
          const int64_t len = g.len(i0 + r, c0, c1);
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) row[j] *= scale;
          M.add_row(row, b, h, i0 + r, c0, len);
          const float li = ls[r];
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) row[j] = exp_acc<float>(row[j] - li);
          std::fill(row + len, row + w, 0.f);
        }
        pack_pairs(pf, bcp, rows, w, pp, bcp);
      }
      // dS = P * (dO V^T - delta)
      pack_pairs_t(vs, x.ldv, w, Dv, vt, bcp);
      gemm_bf16(rows, w, dv2, doa, dv2, 1, vt, bcp, ds, bcp, false, tri_n, i0 - c0);
      for (int64_t r = 0; r < rows; ++r) {
        uint16_t* da = reinterpret_cast<uint16_t*>(dsa + r * ldsa);
        const int64_t len = g.len(i0 + r, c0, c1);
        if (P) {
          ds_row(ds + r * bcp, pk + r * S, len, w, delta[r], da);
        } else {
          ds_row(ds + r * bcp, pf + r * bcp, len, w, delta[r], da);
        }
      }
      pack_pairs(ds, bcp, rows, w, dsp, bcp);
      pack_pairs(ks, x.ldk, w, D, kb, dp);
      gemm_bf16(rows, D, pairs(w), dsa, ldsa, 1, kb, dp, dqa, dp, c0 > 0, tri_k, i0 - c0);
      gemm_bf16(w, D, r2, dsp, 1, bcp, qb, dp, dka + c0 * dp, dp, true, tri_kb, c0 - i0);
      gemm_bf16(w, Dv, r2, pp, 1, bcp, dob, dvp, dva + c0 * dvp, dvp, true, tri_kb, c0 - i0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = dqa + r * dp;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) row[j] *= scale;
      store_bf16(row, dqs + r * ldq, D);
    }
  }
  for (int64_t j = 0; j < S; ++j) {
    float* row = dka + j * dp;
#pragma omp simd
    for (int64_t t = 0; t < D; ++t) row[t] *= scale;
    store_bf16(row, dks + j * ldk, D);
    store_bf16(dva + j * dvp, dvs + j * ldv, Dv);
  }
}

}  // namespace

void sdpa_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<uint16_t> Q(q), K(k), V(v), O(out);
  const MaskOperand<float> M(mask);
  float* L = static_cast<float*>(lse.data_ptr());
  uint16_t* P = p.defined() ? static_cast<uint16_t*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  const int64_t nrb = g.row_blocks();
  parallel_for(B * H * nrb, [&](int64_t u) {
    const int64_t bh = u / nrb, b = bh / H, h = bh % H;
    const int64_t i0 = (u % nrb) * kRowBlock, i1 = std::min(Tq, i0 + kRowBlock);
    const Slice<uint16_t> x{Q.at(b, h) + i0 * Q.ld, K.at(b, h), V.at(b, h), Q.ld, K.ld, V.ld};
    forward_rows_bf16(x, M, b, h, i0, i1, g, D, Dv, float(scale), O.at(b, h) + i0 * O.ld, O.ld,
                      L + bh * Tq + i0, P ? P + bh * Tq * S + i0 * S : nullptr, S);
  });
}

void sdpa_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                        double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<uint16_t> Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const MaskOperand<float> M(mask);
  const float* L = static_cast<const float*>(lse.data_ptr());
  const uint16_t* P = p.defined() ? static_cast<const uint16_t*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  parallel_for(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    const Slice<uint16_t> x{Q.at(b, h), K.at(b, h), V.at(b, h), Q.ld, K.ld, V.ld};
    backward_slice_bf16(x, M, b, h, g, D, Dv, float(scale), O.at(b, h), O.ld, dO.at(b, h), dO.ld,
                        L + bh * Tq, P ? P + bh * Tq * S : nullptr, dQ.at(b, h), dQ.ld, dK.at(b, h),
                        dK.ld, dV.at(b, h), dV.ld);
  });
}

bool has_bf16_insn() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}
#undef ACCEL_BF16_FN

}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_SDPA_BF16_INSN
#undef ACCEL_SDPA_BF16_INSN
#endif  // ACCEL_ISA_NS
