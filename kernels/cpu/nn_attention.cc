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
// autograd/ops/nn.cc), the forward writes the normalised P there (one key block spanning the
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
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// Rows per block. 64 measured faster than 32 at T = 128 (bench gpt): smaller blocks save FLOPs on
// the causal diagonal but double the number of small sgemm calls.
constexpr int64_t kRowBlock = 64;
// Keys per block: the (kRowBlock, kColBlock) f32 score scratch is 128 KiB and stays in L2 next
// to the K and V blocks its GEMMs read.
constexpr int64_t kColBlock = 512;

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

// Strided (B, H, rows, cols) operand with unit column stride: the slice pointer and row stride.
template <typename T>
struct Operand {
  T* base;
  int64_t sb, sh, ld;
  Operand(const Tensor& t)  // NOLINT: implicit on purpose, used for every argument
      : base(static_cast<T*>(const_cast<void*>(t.data_ptr()))),
        sb(t.stride(0)),
        sh(t.stride(1)),
        ld(t.stride(2)) {}
  T* at(int64_t b, int64_t h) const { return base + b * sb + h * sh; }
};

// The additive mask, (B, H, T, S) through any strides (0 where it broadcasts); absent when the
// tensor is undefined.
template <typename T>
struct MaskOperand {
  const T* base = nullptr;
  int64_t sb = 0, sh = 0, si = 0, sj = 0;
  explicit MaskOperand(const Tensor& m) {
    if (!m.defined()) return;
    base = static_cast<const T*>(m.data_ptr());
    sb = m.stride(0);
    sh = m.stride(1);
    si = m.stride(2);
    sj = m.stride(3);
  }
  // row[j] += M(b, h, i, c0 + j) for j < n.
  void add_row(T* row, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t n) const {
    if (base == nullptr) return;
    const T* mr = base + b * sb + h * sh + i * si + c0 * sj;
    if (sj == 1) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] += mr[j];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] += mr[j * sj];
    }
  }
};

// Which scores exist: row i sees columns [0, S), or [0, min(i + 1, S)) when causal.
struct Geometry {
  int64_t T, S;
  bool causal;
  int64_t row_blocks() const { return (T + kRowBlock - 1) / kRowBlock; }
  // Columns the rows [i0, i1) see at all.
  int64_t cols(int64_t i1) const { return causal ? std::min(i1, S) : S; }
  // Columns of [c0, c1) row i sees, counted from c0.
  int64_t len(int64_t i, int64_t c0, int64_t c1) const {
    return std::max<int64_t>(0, (causal ? std::min(i + 1, c1) : c1) - c0);
  }
};

// fn(u) for u in [0, n), spread over the OpenMP team.
template <typename F>
void parallel_for(int64_t n, F&& fn) {
  const bool par = n > 1 && !omp_in_parallel() && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < n; ++u) fn(u);
}

// One slice's operands as pointers and row strides, the form the block loops below work on:
// the tensors' own memory (f32 / f64) or per-block float32 copies of bf16 data
// (Note [bf16 fused attention], the converting route).
template <typename T>
struct Slice {
  const T *q, *k, *v;
  int64_t ldq, ldk, ldv;
};

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
    for (int64_t r = 0; r < rows; ++r) {
      const T* a = dos + r * lddo;
      const T* orow = os + r * ldo;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < Dv; ++j) s += a[j] * orow[j];
      delta[r] = s;
    }
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

#if ACCEL_ISA_LEVEL == 2 && (!defined(ACCEL_CPU_NATIVE) || defined(__AVX512BF16__))
#define ACCEL_SDPA_BF16_INSN 1
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
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < Dv; ++j) s += bf16_value(a[j]) * bf16_value(orow[j]);
      delta[r] = s;
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

// Whether this CPU runs vdpbf16ps (the pass is compiled for it either way).
bool has_bf16_insn() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}
#undef ACCEL_BF16_FN
#endif  // ACCEL_ISA_LEVEL == 2

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
