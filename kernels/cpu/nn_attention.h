// What nn_attention.cc and nn_attention_bf16.cc share (Note [fused attention] in nn_attention.cc):
// the block sizes, the strided operands and the slice geometry of the block loops, and the entry
// points of the vdpbf16ps route (Note [bf16 fused attention]) that the dispatch calls. Included
// at the start of each instruction-set pass of both files (Note [portable builds and ISA dispatch]
// in cpu_isa.h), outside any namespace: no include guard.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/threading.h"

// The pass that compiles the vdpbf16ps route (nn_attention_bf16.cc): the AVX-512 one, unless a
// native build's CPU lacks AVX512-BF16.
#if ACCEL_ISA_LEVEL == 2 && (!defined(ACCEL_CPU_NATIVE) || defined(__AVX512BF16__))
#define ACCEL_SDPA_BF16_INSN 1
#endif

namespace accel::cpu::ACCEL_ISA_NS {

#if defined(ACCEL_SDPA_BF16_INSN)
// The vdpbf16ps route (nn_attention_bf16.cc); the dispatch calls it when has_bf16_insn().
void sdpa_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p);
void sdpa_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                        double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv);
// Whether this CPU runs vdpbf16ps (the pass is compiled for it either way).
bool has_bf16_insn();
#endif

namespace {

// Rows per block. 64 measured faster than 32 at T = 128 (bench gpt): smaller blocks save FLOPs on
// the causal diagonal but double the number of small sgemm calls.
constexpr int64_t kRowBlock = 64;
// Keys per block: the (kRowBlock, kColBlock) f32 score scratch is 128 KiB and stays in L2 next
// to the K and V blocks its GEMMs read.
constexpr int64_t kColBlock = 512;

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
  const ::accel::cpu::TeamScope team(par);  // Notes [OpenMP wait default], [team under load]
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

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
