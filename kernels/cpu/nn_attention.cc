// CPU fused scaled dot-product attention: forward and backward, f32 (oneDNN sgemm) and f64
// (plain loops, the gradcheck reference).
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
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"

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

template <typename T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                  double scale_d, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const T scale = T(scale_d);
  const Operand<T> Q(q), K(k), V(v), O(out);
  const MaskOperand<T> M(mask);
  T* L = static_cast<T*>(lse.data_ptr());
  T* P = p.defined() ? static_cast<T*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  const int64_t nrb = g.row_blocks();
  // One unit per (slice, row block): row blocks are independent in the forward.
  parallel_for(B * H * nrb, [&](int64_t u) {
    thread_local std::vector<T> scratch;
    const int64_t bh = u / nrb, b = bh / H, h = bh % H;
    const int64_t i0 = (u % nrb) * kRowBlock, i1 = std::min(Tq, i0 + kRowBlock), rows = i1 - i0;
    const int64_t nc = g.cols(i1);
    const T* qs = Q.at(b, h) + i0 * Q.ld;
    const T* ks = K.at(b, h);
    const T* vs = V.at(b, h);
    T* os = O.at(b, h) + i0 * O.ld;
    T* ls = L + bh * Tq + i0;
    T* ps = P ? P + bh * Tq * S + i0 * S : nullptr;
    // With p the block spans the row and the scores are computed in place in p.
    const int64_t bc = P ? nc : std::min(kColBlock, nc);
    T* sb = ps;
    int64_t lds = S;
    if (!P) {
      if (scratch.size() < size_t(rows * bc)) scratch.resize(size_t(rows * bc));
      sb = scratch.data();
      lds = bc;
    }
    T m[kRowBlock], l[kRowBlock], alpha[kRowBlock];
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, T(0));
    for (int64_t c0 = 0; c0 < nc; c0 += bc) {
      const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
      gemm(false, true, rows, w, D, scale, qs, Q.ld, ks + c0 * K.ld, K.ld, T(0), sb, lds);
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
          T* orow = os + r * O.ld;
          const T a = alpha[r];
#pragma omp simd
          for (int64_t j = 0; j < Dv; ++j) orow[j] *= a;
        }
      }
      gemm(false, false, rows, Dv, w, T(1), sb, lds, vs + c0 * V.ld, V.ld, T(c0 > 0 ? 1 : 0), os,
           O.ld);
    }
    for (int64_t r = 0; r < rows; ++r) {
      // l == 0 (a fully masked row) gives 0 / 0 = NaN, as softmax does.
      const T inv = T(1) / l[r];
      T* orow = os + r * O.ld;
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) orow[j] *= inv;
      ls[r] = m[r] + std::log(l[r]);
      if (ps) {
        T* prow = ps + r * S;
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j) prow[j] *= inv;
        std::fill(prow + nc, prow + S, T(0));
      }
    }
  });
}

template <typename T>
void sdpa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                   double scale_d, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const T scale = T(scale_d);
  const Operand<T> Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const MaskOperand<T> M(mask);
  const T* L = static_cast<const T*>(lse.data_ptr());
  const T* P = p.defined() ? static_cast<const T*>(p.data_ptr()) : nullptr;
  const Geometry g{Tq, S, causal};
  // One unit per slice: every row block adds into the slice's dK and dV.
  parallel_for(B * H, [&](int64_t bh) {
    thread_local std::vector<T> pbuf, dsbuf;
    const int64_t b = bh / H, h = bh % H;
    const T* ks = K.at(b, h);
    const T* vs = V.at(b, h);
    T* dks = dK.at(b, h);
    T* dvs = dV.at(b, h);
    for (int64_t j = 0; j < S; ++j) {
      std::fill(dks + j * dK.ld, dks + j * dK.ld + D, T(0));
      std::fill(dvs + j * dV.ld, dvs + j * dV.ld + Dv, T(0));
    }
    for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
      const int64_t i1 = std::min(Tq, i0 + kRowBlock), rows = i1 - i0, nc = g.cols(i1);
      const T* qs = Q.at(b, h) + i0 * Q.ld;
      const T* os = O.at(b, h) + i0 * O.ld;
      const T* dos = dO.at(b, h) + i0 * dO.ld;
      const T* ls = L + bh * Tq + i0;
      T* dqs = dQ.at(b, h) + i0 * dQ.ld;
      if (nc == 0) {
        for (int64_t r = 0; r < rows; ++r) std::fill(dqs + r * dQ.ld, dqs + r * dQ.ld + D, T(0));
        continue;
      }
      // delta_i = rowsum(dO_i * O_i): (rows)
      T delta[kRowBlock];
      for (int64_t r = 0; r < rows; ++r) {
        const T* a = dos + r * dO.ld;
        const T* o = os + r * O.ld;
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < Dv; ++j) s += a[j] * o[j];
        delta[r] = s;
      }
      const int64_t bc = P ? nc : std::min(kColBlock, nc);
      if (dsbuf.size() < size_t(rows * bc)) dsbuf.resize(size_t(rows * bc));
      if (!P && pbuf.size() < size_t(rows * bc)) pbuf.resize(size_t(rows * bc));
      T* ds = dsbuf.data();
      for (int64_t c0 = 0; c0 < nc; c0 += bc) {
        const int64_t c1 = std::min(nc, c0 + bc), w = c1 - c0;
        const T* pb;
        int64_t ldp;
        if (P) {
          pb = P + bh * Tq * S + i0 * S + c0;
          ldp = S;
        } else {
          // P = exp(scale q k^T + mask - lse), recomputed for this block.
          T* pw = pbuf.data();
          gemm(false, true, rows, w, D, scale, qs, Q.ld, ks + c0 * K.ld, K.ld, T(0), pw, bc);
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
        gemm(false, true, rows, w, Dv, T(1), dos, dO.ld, vs + c0 * V.ld, V.ld, T(0), ds, bc);
        for (int64_t r = 0; r < rows; ++r) {
          T* d = ds + r * bc;
          const T* pr = pb + r * ldp;
          const int64_t len = g.len(i0 + r, c0, c1);
          const T dl = delta[r];
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) d[j] = pr[j] * (d[j] - dl);
          std::fill(d + len, d + w, T(0));
        }
        gemm(false, false, rows, D, w, scale, ds, bc, ks + c0 * K.ld, K.ld, T(c0 > 0 ? 1 : 0), dqs,
             dQ.ld);
        gemm(true, false, w, D, rows, scale, ds, bc, qs, Q.ld, T(1), dks + c0 * dK.ld, dK.ld);
        gemm(true, false, w, Dv, rows, T(1), pb, ldp, dos, dO.ld, T(1), dvs + c0 * dV.ld, dV.ld);
      }
    }
  });
}

void check_kernel_dtype(const Tensor& q) {
  ACCEL_CHECK(q.dtype() == kFloat32 || q.dtype() == kFloat64, DTypeError,
              "scaled_dot_product_attention", "the CPU kernel takes float32 or float64, got ",
              q.dtype(), " of shape ", q.sizes());
}

void sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  if (out.numel() == 0) return;
  check_kernel_dtype(q);
  if (q.dtype() == kFloat32) return sdpa_forward<float>(q, k, v, mask, scale, causal, out, lse, p);
  sdpa_forward<double>(q, k, v, mask, scale, causal, out, lse, p);
}

void sdpa_backward_kernel(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                          double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_kernel_dtype(q);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    for (Tensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) fill_stub(t->device(), *t, Scalar(0));
    }
    return;
  }
  if (q.dtype() == kFloat32) {
    return sdpa_backward<float>(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
  }
  sdpa_backward<double>(dout, q, k, v, mask, out, lse, p, scale, causal, dq, dk, dv);
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(sdpa_stub, CPU, ACCEL_ISA_DISPATCH(sdpa_kernel));
ACCEL_REGISTER_KERNEL(sdpa_backward_stub, CPU, ACCEL_ISA_DISPATCH(sdpa_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
