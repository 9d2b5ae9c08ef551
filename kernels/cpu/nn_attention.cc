// CPU fused scaled dot-product attention: forward and backward, f32 (oneDNN sgemm) and f64
// (plain loops, the gradcheck reference).
//
// Note [fused attention]
// Per (batch, head) slice, with Q: (T, D), K: (S, D), V: (S, Dv) read in place through their row
// strides (so head split/merge views of a packed (B, T, 3C) qkv buffer need no copies):
//   forward:  P = softmax(scale * Q K^T, future masked)      (T, S), saved for the backward
//             O = P V                                         (T, Dv)
//   backward: dP = dO V^T;  dS = scale * P * (dP - rowsum(dP * P))
//             dQ = dS K;  dK = dS^T Q;  dV = P^T dO
// The composed version (matmul, masked_fill, softmax, matmul) makes four passes over the
// (B, H, T, T) scores in the forward and more in the backward, runs its strided mask through the
// scalar `where` loop and copies for the head merge; here each slice stays in L2 and the mask
// is a loop bound. Slices run in parallel (one thread each, sgemm single-threaded inside).
// Causal: rows are taken in blocks of kCausalBlock and block [i0, i1) only touches columns
// [0, i1), which skips ~25 % of the GEMM work at T = 128 (only the diagonal blocks are half
// wasted); entries above the diagonal are written as exact zeros in P and dS.
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

// 64 measured faster than 32 at T = 128 (bench gpt): smaller blocks save FLOPs but double the
// number of small sgemm calls.
constexpr int64_t kCausalBlock = 64;

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

// Row blocks [i0, i1) and the number of key columns each one needs.
struct Blocks {
  int64_t T, S, bs;
  bool causal;
  int64_t count() const { return (T + bs - 1) / bs; }
  int64_t begin(int64_t r) const { return r * bs; }
  int64_t end(int64_t r) const { return std::min(T, (r + 1) * bs); }
  int64_t cols(int64_t r) const { return causal ? end(r) : S; }
  int64_t row_len(int64_t i) const { return causal ? i + 1 : S; }
};

Blocks make_blocks(int64_t T, int64_t S, bool causal) {
  return Blocks{T, S,
                causal ? std::max<int64_t>(1, std::min(kCausalBlock, T)) : std::max<int64_t>(T, 1),
                causal};
}

// Runs fn(b, h) over every slice, spread over the OpenMP team.
template <typename F>
void for_each_slice(int64_t B, int64_t H, F&& fn) {
  const int64_t n = B * H;
  const bool par = n > 1 && !omp_in_parallel() && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t s = 0; s < n; ++s) fn(s / H, s % H);
}

template <typename T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale_d, bool causal,
                  Tensor& out, Tensor& p) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const T scale = T(scale_d);
  const Operand<T> Q(q), K(k), V(v), O(out);
  T* P = static_cast<T*>(p.data_ptr());
  const Blocks blk = make_blocks(Tq, S, causal);
  for_each_slice(B, H, [&](int64_t b, int64_t h) {
    const T* qs = Q.at(b, h);
    const T* ks = K.at(b, h);
    const T* vs = V.at(b, h);
    T* os = O.at(b, h);
    T* ps = P + (b * H + h) * Tq * S;
    for (int64_t r = 0; r < blk.count(); ++r) {
      const int64_t i0 = blk.begin(r), i1 = blk.end(r), nc = blk.cols(r);
      // Scores of the block's rows against the keys they may see: (i1 - i0, nc).
      gemm(false, true, i1 - i0, nc, D, scale, qs + i0 * Q.ld, Q.ld, ks, K.ld, T(0), ps + i0 * S,
           S);
      for (int64_t i = i0; i < i1; ++i) {
        T* row = ps + i * S;
        const int64_t len = blk.row_len(i);
        const acc_t<T> m = row_max<T>(row, len);
        const acc_t<T> inv = acc_t<T>(1) / row_exp_store<T>(row, len, m, row);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) row[j] *= inv;
        std::fill(row + len, row + S, T(0));
      }
      gemm(false, false, i1 - i0, Dv, nc, T(1), ps + i0 * S, S, vs, V.ld, T(0), os + i0 * O.ld,
           O.ld);
    }
  });
}

template <typename T>
void sdpa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& p, double scale_d, bool causal, Tensor& dq, Tensor& dk,
                   Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const T scale = T(scale_d);
  const Operand<T> Q(q), K(k), V(v), dO(dout), dQ(dq), dK(dk), dV(dv);
  const T* P = static_cast<const T*>(p.data_ptr());
  const Blocks blk = make_blocks(Tq, S, causal);
  for_each_slice(B, H, [&](int64_t b, int64_t h) {
    // dS for this slice: (Tq, S), 64 KiB at T = S = 128, reused across calls.
    thread_local std::vector<T> scratch;
    if (scratch.size() < size_t(Tq * S)) scratch.resize(size_t(Tq * S));
    T* ds = scratch.data();
    const T* qs = Q.at(b, h);
    const T* ks = K.at(b, h);
    const T* vs = V.at(b, h);
    const T* dos = dO.at(b, h);
    const T* ps = P + (b * H + h) * Tq * S;
    T* dqs = dQ.at(b, h);
    T* dks = dK.at(b, h);
    T* dvs = dV.at(b, h);
    for (int64_t r = 0; r < blk.count(); ++r) {
      const int64_t i0 = blk.begin(r), i1 = blk.end(r), nc = blk.cols(r);
      gemm(false, true, i1 - i0, nc, Dv, T(1), dos + i0 * dO.ld, dO.ld, vs, V.ld, T(0), ds + i0 * S,
           S);  // dP
      for (int64_t i = i0; i < i1; ++i) {
        T* d = ds + i * S;
        const T* pr = ps + i * S;
        const int64_t len = blk.row_len(i);
        acc_t<T> dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < len; ++j) dot += d[j] * pr[j];
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) d[j] = scale * pr[j] * (d[j] - T(dot));
        std::fill(d + len, d + nc, T(0));
      }
      gemm(false, false, i1 - i0, D, nc, T(1), ds + i0 * S, S, ks, K.ld, T(0), dqs + i0 * dQ.ld,
           dQ.ld);
    }
    // Key/value rows [j0, j1) are seen by query rows [j0, Tq) when causal (all rows otherwise);
    // dS and P are exact zeros above the diagonal inside that range.
    for (int64_t c = 0; c < (S + blk.bs - 1) / blk.bs; ++c) {
      const int64_t j0 = c * blk.bs, j1 = std::min(S, j0 + blk.bs);
      const int64_t r0 = causal ? j0 : 0;
      gemm(true, false, j1 - j0, D, Tq - r0, T(1), ds + r0 * S + j0, S, qs + r0 * Q.ld, Q.ld, T(0),
           dks + j0 * dK.ld, dK.ld);
      gemm(true, false, j1 - j0, Dv, Tq - r0, T(1), ps + r0 * S + j0, S, dos + r0 * dO.ld, dO.ld,
           T(0), dvs + j0 * dV.ld, dV.ld);
    }
  });
}

void check_kernel_dtype(const Tensor& q) {
  ACCEL_CHECK(q.dtype() == kFloat32 || q.dtype() == kFloat64, DTypeError,
              "scaled_dot_product_attention", "the CPU kernel takes float32 or float64, got ",
              q.dtype(), " of shape ", q.sizes());
}

void sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 Tensor& out, Tensor& p) {
  if (out.numel() == 0) return;
  check_kernel_dtype(q);
  if (q.dtype() == kFloat32) return sdpa_forward<float>(q, k, v, scale, causal, out, p);
  sdpa_forward<double>(q, k, v, scale, causal, out, p);
}

void sdpa_backward_kernel(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& p, double scale, bool causal, Tensor& dq, Tensor& dk,
                          Tensor& dv) {
  check_kernel_dtype(q);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    for (Tensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) fill_stub(t->device(), *t, Scalar(0));
    }
    return;
  }
  if (q.dtype() == kFloat32) {
    return sdpa_backward<float>(dout, q, k, v, p, scale, causal, dq, dk, dv);
  }
  sdpa_backward<double>(dout, q, k, v, p, scale, causal, dq, dk, dv);
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
