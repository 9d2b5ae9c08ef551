// CPU fused scaled dot-product attention: forward and backward, f32 (oneDNN sgemm), f64 (plain
// loops, the gradcheck reference) and bf16 (Note [bf16 fused attention]).
//
// Note [fused attention]
// Per (batch, head) slice, with Q: (T, D), K: (S, D), V: (S, Dv) read in place through their row
// strides (so head split/merge views of a packed (B, T, 3C) qkv buffer need no copies), M an
// optional additive mask read through its own strides (0 for broadcast dims), and the scores
//   X = scale * Q K^T + M, future (j > i) at -inf when causal        (T, S)
//   forward:  P = softmax(X) row-wise;  O = P V;  lse_i = log sum_j exp(X_ij)
//   backward: P = exp(X - lse);  dP = dO V^T;  delta_i = rowsum(dO_i * O_i) = rowsum(dP_i * P_i)
//             dS = P * (dP - delta);  dQ = scale dS K;  dK = scale dS^T Q;  dV = P^T dO
// Flash style (the FlashAttention-2 schedule, on the CPU): rows are taken in blocks of kRowBlock
// and keys in blocks of kColBlock; a block's scores live only in a (kRowBlock, kColBlock) scratch
// per thread, with the online softmax (running row max m and sum l; when m grows, the partial O
// rows and l are rescaled by exp(m_old - m_new)) folding each key block into O. What stays for
// the backward is O and lse: O(T) per slice, not the (T, S) matrix. The backward recomputes P
// blockwise from lse with one more GEMM (Q K^T) and accumulates dQ, dK, dV block by block.
// Causal (top-left aligned, torch's tril(ones(T, S))): row block [i0, i1) only touches columns
// [0, min(i1, S)), which skips about half the GEMM work on long rows.
//
// Note [attention probabilities kept for short rows]
// When the caller passes p (the op layer does for short rows, S <= kKeepProbsMaxS in
// autograd/ops/attention.cc), the forward writes the normalised P there (one key block spanning the
// row) and the backward reads it instead of recomputing it: at T = S = 128 (the gpt workload) P
// costs 16K values per slice, half of q, k, v, o together, and saves the backward a GEMM and an
// exp per score. Long rows never keep it.
//
// Fully masked rows (every score -inf) give NaN outputs and gradients, as softmax over them does
// in the composed ops and in PyTorch's math path.
//
// Note [bf16 fused attention]
// bf16 q, k, v, out, dq, dk, dv (and the kept P); lse and an additive mask in float32. The
// softmax, the online rescaling, delta and dS are float32; only GEMM operands are bf16. Two
// routes, picked per call:
//   - vdpbf16ps (a CPU with AVX512-BF16; compiled only in the AVX-512 pass, under a target
//     attribute, so the other passes carry none of it): the schedule above (row blocks of 64,
//     key blocks of 512 or the whole row when P is kept) with every product on one microkernel,
//     `tile`: C (MR <= 4 rows, 16 NV <= 64 columns) in zmm float32 accumulators, and per
//     reduction pair p one `vdpbf16ps` per zmm, adding A(m, 2p) B(2p, n) + A(m, 2p+1) B(2p+1, n)
//     into lane n (products exact in float32, float32 sums). Operands, in 32-bit words that hold
//     a bf16 pair, for a block of R <= 64 rows and w keys (W = round16(w), X2 = ceil(X / 2)):
//       A, row-major pairs, word (m, p) at a[m * lda + p]: Q (R, D2), dO (R, Dv2), and the bf16
//         copies of exp(S - m) (R, W / 2) and dS (R, W / 2);
//       A, the transpose of a pair-packed matrix (word (m, p) at a[m + p * ldb]): dS^T and P^T
//         (w, R2) for dK = dS^T Q and dV = P^T dO read the pair-packed dS and P below in place,
//         so no (R, w) block is ever transposed;
//       B, pair-packed, row p = round16(N) words, word n = B(2p, n) | B(2p + 1, n) << 16:
//         K^T (D2, W) and V^T (Dv2, W) for the scores and dP: a row's pairs are its 32-bit words,
//         so these are 32-bit transposes, 16 x 16 at a time in registers (pack_pairs_t);
//         V (w2, Dv16), K (w2, D16), Q (R2, D16), dO (R2, Dv16), P and dS (R2, W): two rows
//         interleaved (zero-extend, shift, or).
//     Float32 scratch: scores / exp (R, W), O (R, Dv16), dP / dS (R, W), dQ (R, D16), and per
//     slice dK (S, D16), dV (S, Dv16), rounded to bf16 once at the end.
//     Why these shapes: odd D, Dv, R or w end in a half pair that is zero in both operands (never
//     garbage: 0 * NaN would poison C); N padded to 16 means the microkernel has no column tails
//     (the scratch rows have the room); causal blocks skip the 4-row tiles' columns or pairs past
//     the diagonal (Tri). The softmax pass over a row is one AVX-512 loop (exp16: exp_f32's
//     steps on 16 lanes) that also writes the bf16 copy, so the float32 scores are read twice,
//     not five times.
//   - elsewhere (ACCEL_CPU_ISA=avx2 or baseline, or no AVX512-BF16): each work unit widens the
//     bf16 rows it reads (the forward's row block with its K and V rows, the backward's slice)
//     into float32 scratch, runs the float32 block loops and rounds its outputs once. No
//     tensor-sized copies; the result is within bf16 rounding of the first route.
// The kept P (Note [attention probabilities kept for short rows]) is bf16: half the bytes of
// float32 (at the gpt shape (128 slices, 128, 128): 4 MB per layer, written by the forward and
// read by the backward), and it is exactly the operand P^T dO needs; in dS = P (dP - delta) its
// rounding adds 2^-9 relative, the size of dS's own rounding before dS K. Accuracy: every result
// goes through at most four bf16 roundings of its terms (tests/autograd/test_attention.cc derives
// its tolerance from that).
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

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
#define ACCEL_ISA_SELF "kernels/cpu/nn_attention.cc"
#include "kernels/cpu/isa_foreach.h"
#else
#include "kernels/cpu/nn_attention.h"
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// Row-major C (M, N) = alpha * op(A) op(B) + beta * C; op(A): (M, K), op(B): (K, N).
// ta: A is stored (K, M) with leading dim lda; tb: B is stored (N, K) with leading dim ldb.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  ACCEL_CHECK(st == dnnl_success, Error, "scaled_dot_product_attention", "dnnl_sgemm failed (",
              int(st), ") for M=", M, " N=", N, " K=", K);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      }
      C[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  }
}

// Forward of the rows [i0, i1) of one slice (Note [fused attention]): x.q, os, ls and ps (P's
// rows, row stride ldp) start at row i0, x.k and x.v at key 0; ps is null when P is not kept.
template <typename T>
void forward_rows(const Slice<T>& x, const MaskOperand<T>& M, int64_t b, int64_t h, int64_t i0,
                  int64_t i1, const Geometry& g, int64_t D, int64_t Dv, T scale, T* os, int64_t ldo,
                  T* ls, T* ps, int64_t ldp) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  thread_local std::vector<T> scratch;
  const int64_t rows = i1 - i0, nc = g.cols(i1);
  const T* qs = x.q;
  // With p the block spans the row and the scores are computed in place in p.
  const int64_t bc = ps ? nc : std::min(kColBlock, nc);
  T* sb = ps;
  int64_t lds = ldp;
  if (!ps) {
    if (scratch.size() < size_t(rows * bc)) scratch.resize(size_t(rows * bc));
    sb = scratch.data();
    lds = bc;
  }
  T m[kRowBlock], l[kRowBlock], alpha[kRowBlock];
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, T(0));
  for (int64_t c0 = 0; c0 < nc; c0 += bc) {
    const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
    gemm(false, true, rows, w, D, scale, qs, x.ldq, x.k + c0 * x.ldk, x.ldk, T(0), sb, lds);
    for (int64_t r = 0; r < rows; ++r) {
      T* row = sb + r * lds;
      const int64_t len = g.len(i0 + r, c0, c1);
      M.add_row(row, b, h, i0 + r, c0, len);
      const T m_new = std::max(m[r], T(row_max<T>(row, len)));
      T s = 0;
      if (m_new != kNegInf) {
        s = row_exp_store<T>(row, len, m_new, row);
      } else {
        std::fill(row, row + len, T(0));
      }
      std::fill(row + len, row + w, T(0));
      // m[r] == -inf: nothing was accumulated yet (the row of O is zero), exp would be NaN.
      alpha[r] = m[r] == kNegInf ? T(0) : exp_acc<T>(m[r] - m_new);
      l[r] = l[r] * alpha[r] + s;
      m[r] = m_new;
    }
    if (c0 > 0) {
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = os + r * ldo;
        const T a = alpha[r];
#pragma omp simd
        for (int64_t j = 0; j < Dv; ++j) orow[j] *= a;
      }
    }
    gemm(false, false, rows, Dv, w, T(1), sb, lds, x.v + c0 * x.ldv, x.ldv, T(c0 > 0 ? 1 : 0), os,
         ldo);
  }
  for (int64_t r = 0; r < rows; ++r) {
    // l == 0 (a fully masked row) gives 0 / 0 = NaN, as softmax does.
    const T inv = T(1) / l[r];
    T* orow = os + r * ldo;
#pragma omp simd
    for (int64_t j = 0; j < Dv; ++j) orow[j] *= inv;
    ls[r] = m[r] + std::log(l[r]);
    if (ps) {
      T* prow = ps + r * ldp;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) prow[j] *= inv;
      std::fill(prow + nc, prow + g.S, T(0));
    }
  }
}

// Gradients of one slice (Note [fused attention]). o, dO: the slice's output and its gradient;
// L: its lse; P: its kept probabilities (row stride S) or null; dq, dk, dv: written in full.
template <typename T>
void backward_slice(const Slice<T>& x, const MaskOperand<T>& M, int64_t b, int64_t h,
                    const Geometry& g, int64_t D, int64_t Dv, T scale, const T* o, int64_t ldo,
                    const T* dO, int64_t lddo, const T* L, const T* P, T* dqs0, int64_t ldq, T* dks,
                    int64_t ldk, T* dvs, int64_t ldv) {
  thread_local std::vector<T> pbuf, dsbuf;
  const int64_t Tq = g.T, S = g.S;
  for (int64_t j = 0; j < S; ++j) {
    std::fill(dks + j * ldk, dks + j * ldk + D, T(0));
    std::fill(dvs + j * ldv, dvs + j * ldv + Dv, T(0));
  }
  for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
    const int64_t i1 = std::min(Tq, i0 + kRowBlock), rows = i1 - i0, nc = g.cols(i1);
    const T* qs = x.q + i0 * x.ldq;
    const T* os = o + i0 * ldo;
    const T* dos = dO + i0 * lddo;
    const T* ls = L + i0;
    T* dqs = dqs0 + i0 * ldq;
    if (nc == 0) {
      for (int64_t r = 0; r < rows; ++r) std::fill(dqs + r * ldq, dqs + r * ldq + D, T(0));
      continue;
    }
    // delta_i = rowsum(dO_i * O_i): (rows)
    T delta[kRowBlock];
    for (int64_t r = 0; r < rows; ++r) delta[r] = row_dot(dos + r * lddo, os + r * ldo, Dv);
    const int64_t bc = P ? nc : std::min(kColBlock, nc);
    if (dsbuf.size() < size_t(rows * bc)) dsbuf.resize(size_t(rows * bc));
    if (!P && pbuf.size() < size_t(rows * bc)) pbuf.resize(size_t(rows * bc));
    T* ds = dsbuf.data();
    for (int64_t c0 = 0; c0 < nc; c0 += bc) {
      const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
      const T* ks = x.k + c0 * x.ldk;
      const T* vs = x.v + c0 * x.ldv;
      const T* pb;
      int64_t ldp;
      if (P) {
        pb = P + i0 * S + c0;
        ldp = S;
      } else {
        // P = exp(scale q k^T + mask - lse), recomputed for this block.
        T* pw = pbuf.data();
        gemm(false, true, rows, w, D, scale, qs, x.ldq, ks, x.ldk, T(0), pw, bc);
        for (int64_t r = 0; r < rows; ++r) {
          T* row = pw + r * bc;
          const int64_t len = g.len(i0 + r, c0, c1);
          M.add_row(row, b, h, i0 + r, c0, len);
          const T li = ls[r];
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) row[j] = exp_acc<T>(row[j] - li);
          std::fill(row + len, row + w, T(0));
        }
        pb = pw;
        ldp = bc;
      }
      // dS = P * (dO V^T - delta): (rows, w)
      gemm(false, true, rows, w, Dv, T(1), dos, lddo, vs, x.ldv, T(0), ds, bc);
      for (int64_t r = 0; r < rows; ++r) {
        T* d = ds + r * bc;
        const T* pr = pb + r * ldp;
        const int64_t len = g.len(i0 + r, c0, c1);
        const T dl = delta[r];
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) d[j] = pr[j] * (d[j] - dl);
        std::fill(d + len, d + w, T(0));
      }
      gemm(false, false, rows, D, w, scale, ds, bc, ks, x.ldk, T(c0 > 0 ? 1 : 0), dqs, ldq);
      gemm(true, false, w, D, rows, scale, ds, bc, qs, x.ldq, T(1), dks + c0 * ldk, ldk);
      gemm(true, false, w, Dv, rows, T(1), pb, ldp, dos, lddo, T(1), dvs + c0 * ldv, ldv);
    }
  }
}

template <typename T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                  double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<T> Q(q), K(k), V(v), O(out);
  const MaskOperand<T> M(mask);
  T* L = static_cast<T*>(lse.data_ptr());
  T* P = p.defined() ? static_cast<T*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  const int64_t nrb = g.row_blocks();
  // One unit per (slice, row block): row blocks are independent in the forward.
  parallel_for(B * H * nrb, [&](int64_t u) {
    const int64_t bh = u / nrb, b = bh / H, h = bh % H;
    const int64_t i0 = (u % nrb) * kRowBlock, i1 = std::min(Tq, i0 + kRowBlock);
    const Slice<T> x{Q.at(b, h) + i0 * Q.ld, K.at(b, h), V.at(b, h), Q.ld, K.ld, V.ld};
    forward_rows<T>(x, M, b, h, i0, i1, g, D, Dv, T(scale), O.at(b, h) + i0 * O.ld, O.ld,
                    L + bh * Tq + i0, P ? P + bh * Tq * S + i0 * S : nullptr, S);
  });
}

template <typename T>
void sdpa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                   double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<T> Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const MaskOperand<T> M(mask);
  const T* L = static_cast<const T*>(lse.data_ptr());
  const T* P = p.defined() ? static_cast<const T*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  // One unit per slice: every row block adds into the slice's dK and dV.
  parallel_for(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    const Slice<T> x{Q.at(b, h), K.at(b, h), V.at(b, h), Q.ld, K.ld, V.ld};
    backward_slice<T>(x, M, b, h, g, D, Dv, T(scale), O.at(b, h), O.ld, dO.at(b, h), dO.ld,
                      L + bh * Tq, P ? P + bh * Tq * S : nullptr, dQ.at(b, h), dQ.ld, dK.at(b, h),
                      dK.ld, dV.at(b, h), dV.ld);
  });
}

// ---- bf16 (Note [bf16 fused attention]) ----

// rows x n bf16 values (row stride ld) -> float32, row stride n (dst grows as needed).
const float* widen(const uint16_t* src, int64_t ld, int64_t rows, int64_t n,
                   std::vector<float>& dst) {
  if (dst.size() < size_t(rows * n)) dst.resize(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) bf16_to_f32(src + r * ld, dst.data() + r * n, n);
  return dst.data();
}
// rows x n float32 values (row stride n) -> bf16 rows of stride ld.
void narrow_rows(const float* src, int64_t rows, int64_t n, uint16_t* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(src + r * n, dst + r * ld, n);
}

// The converting route: bf16 blocks widened to float32 scratch, the float32 block loops above,
// the results rounded back. Per unit it converts the rows it reads (the forward's K and V rows
// once per row block), never a whole tensor.
void sdpa_forward_bf16_via_f32(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& mask, double scale, bool causal, Tensor& out,
                               Tensor& lse, Tensor& p) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<uint16_t> Q(q), K(k), V(v), O(out);
  const MaskOperand<float> M(mask);
  float* L = static_cast<float*>(lse.data_ptr());
  uint16_t* P = p.defined() ? static_cast<uint16_t*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  const int64_t nrb = g.row_blocks();
  parallel_for(B * H * nrb, [&](int64_t u) {
    thread_local std::vector<float> qf, kf, vf, of, pf;
    const int64_t bh = u / nrb, b = bh / H, h = bh % H;
    const int64_t i0 = (u % nrb) * kRowBlock, i1 = std::min(Tq, i0 + kRowBlock), rows = i1 - i0;
    const int64_t nc = g.cols(i1);
    const Slice<float> x{widen(Q.at(b, h) + i0 * Q.ld, Q.ld, rows, D, qf),
                         widen(K.at(b, h), K.ld, nc, D, kf),
                         widen(V.at(b, h), V.ld, nc, Dv, vf),
                         D,
                         D,
                         Dv};
    if (of.size() < size_t(rows * Dv)) of.resize(size_t(rows * Dv));
    if (P && pf.size() < size_t(rows * S)) pf.resize(size_t(rows * S));
    forward_rows<float>(x, M, b, h, i0, i1, g, D, Dv, float(scale), of.data(), Dv, L + bh * Tq + i0,
                        P ? pf.data() : nullptr, S);
    narrow_rows(of.data(), rows, Dv, O.at(b, h) + i0 * O.ld, O.ld);
    if (P) narrow_rows(pf.data(), rows, S, P + bh * Tq * S + i0 * S, S);
  });
}

void sdpa_backward_bf16_via_f32(const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& mask, const Tensor& out,
                                const Tensor& lse, const Tensor& p, double scale, bool causal,
                                Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const Operand<uint16_t> Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const MaskOperand<float> M(mask);
  const float* L = static_cast<const float*>(lse.data_ptr());
  const uint16_t* P = p.defined() ? static_cast<const uint16_t*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  parallel_for(B * H, [&](int64_t bh) {
    thread_local std::vector<float> qf, kf, vf, of, dof, pf, dqf, dkf, dvf;
    const int64_t b = bh / H, h = bh % H;
    const Slice<float> x{widen(Q.at(b, h), Q.ld, Tq, D, qf),
                         widen(K.at(b, h), K.ld, S, D, kf),
                         widen(V.at(b, h), V.ld, S, Dv, vf),
                         D,
                         D,
                         Dv};
    const float* of32 = widen(O.at(b, h), O.ld, Tq, Dv, of);
    const float* do32 = widen(dO.at(b, h), dO.ld, Tq, Dv, dof);
    const float* p32 = P ? widen(P + bh * Tq * S, S, Tq, S, pf) : nullptr;
    for (auto* buf : {&dqf, &dkf, &dvf}) {
      const size_t n = size_t(std::max(Tq, S) * std::max(D, Dv));
      if (buf->size() < n) buf->resize(n);
    }
    backward_slice<float>(x, M, b, h, g, D, Dv, float(scale), of32, Dv, do32, Dv, L + bh * Tq, p32,
                          dqf.data(), D, dkf.data(), D, dvf.data(), Dv);
    narrow_rows(dqf.data(), Tq, D, dQ.at(b, h), dQ.ld);
    narrow_rows(dkf.data(), S, D, dK.at(b, h), dK.ld);
    narrow_rows(dvf.data(), S, Dv, dV.at(b, h), dV.ld);
  });
}

void check_kernel_dtype(const Tensor& q, const Tensor& lse, const Tensor& mask) {
  const DType dt = q.dtype();
  ACCEL_CHECK(dt == kFloat32 || dt == kFloat64 || dt == kBFloat16, DTypeError,
              "scaled_dot_product_attention",
              "the CPU kernel takes float32, float64 or bfloat16, got ", dt, " of shape ",
              q.sizes());
  // bf16 operands come with float32 statistics and mask (kernels/stubs/nn.h).
  const DType stat = dt == kBFloat16 ? kFloat32 : dt;
  ACCEL_INTERNAL_ASSERT(lse.dtype() == stat && (!mask.defined() || mask.dtype() == stat));
}

void sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  if (out.numel() == 0) return;
  check_kernel_dtype(q, lse, mask);
  if (q.dtype() == kBFloat16) {
#if defined(ACCEL_SDPA_BF16_INSN)
    if (has_bf16_insn()) return sdpa_forward_bf16(q, k, v, mask, scale, causal, out, lse, p);
#endif
    return sdpa_forward_bf16_via_f32(q, k, v, mask, scale, causal, out, lse, p);
  }
  if (q.dtype() == kFloat32) return sdpa_forward<float>(q, k, v, mask, scale, causal, out, lse, p);
  sdpa_forward<double>(q, k, v, mask, scale, causal, out, lse, p);
}

void sdpa_backward_kernel(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                          double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_kernel_dtype(q, lse, mask);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    for (Tensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) fill_stub(t->device(), *t, Scalar(0));
    }
    return;
  }
  if (q.dtype() == kBFloat16) {
#if defined(ACCEL_SDPA_BF16_INSN)
    if (has_bf16_insn()) {
      return sdpa_backward_bf16(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
    }
#endif
    return sdpa_backward_bf16_via_f32(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
  }
  if (q.dtype() == kFloat32) {
    return sdpa_backward<float>(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
  }
  sdpa_backward<double>(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#undef ACCEL_SDPA_BF16_INSN
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(sdpa_stub, CPU, ACCEL_ISA_DISPATCH(sdpa_kernel));
ACCEL_REGISTER_KERNEL(sdpa_backward_stub, CPU, ACCEL_ISA_DISPATCH(sdpa_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
