// Entry points of the .cu files, called by the host side of this folder (Note [CUDA host/device
// split] in kernel_args.h). Pointers are device pointers to the first element; `n` counts
// elements; `max_blocks` caps grid-stride grids (a few blocks per multiprocessor). Each launcher
// queues its kernels on `stream` and checks the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/optim.h"
#include "kernels/cuda/kernel_args.h"

namespace accel::cuda {

// ---- elementwise (elementwise_unary.cu, elementwise_binary.cu, elementwise_copy.cu) ----
// `vec`: elements per vector access for Layout::Contiguous / ScalarB (1 when pointers are not
// 16-byte aligned), ignored for Strided.
void launch_unary(UOp op, double p0, double p1, Code in_t, Code out_t, Layout layout, int vec,
                  const void* in, void* out, int64_t n, const OffsetCalc<2>& calc, int max_blocks,
                  cudaStream_t stream);
void launch_binary(BOp op, double alpha, Code in_t, Code out_t, Layout layout, int vec,
                   const void* a, const void* b, void* out, int64_t n, const OffsetCalc<3>& calc,
                   int max_blocks, cudaStream_t stream);
// out = cond ? a : b, all through calc (operands: out, cond, a, b).
void launch_where(int elem_size, const void* cond, const void* a, const void* b, void* out,
                  int64_t n, const OffsetCalc<4>& calc, int max_blocks, cudaStream_t stream);
// Same dtype, strided (operands: dst, src).
void launch_copy_strided(int elem_size, void* dst, const void* src, int64_t n,
                         const OffsetCalc<2>& calc, int max_blocks, cudaStream_t stream);
// dtype conversion; calc == nullptr means both contiguous.
void launch_convert(Code dst_t, Code src_t, void* dst, const void* src, int64_t n,
                    const OffsetCalc<2>* calc, int max_blocks, cudaStream_t stream);
// Writes the `elem_size`-byte pattern `bits`; calc == nullptr means contiguous.
void launch_fill(int elem_size, uint64_t bits, void* dst, int64_t n, const OffsetCalc<1>* calc,
                 int max_blocks, cudaStream_t stream);

// ---- reductions (reduce.cu) ----
// x: (rows, n) contiguous of in_t. Each row is cut into `splits` chunks of `chunk` elements;
// with splits > 1 the caller passes a (rows, splits) workspace as `out` (out_t = the
// accumulator code) and reduces it with a second call. mean_div > 0: divide the result by it.
// Arg ops write int64 indices and need splits == 1.
void launch_reduce_rows(ROp op, Code in_t, const void* x, int64_t rows, int64_t n, int64_t splits,
                        int64_t chunk, Code out_t, void* out, int64_t mean_div,
                        cudaStream_t stream);
// Sum over the leading dim: x: (n, cols) contiguous -> out (splits, cols); same contract.
void launch_reduce_cols(Code in_t, const void* x, int64_t n, int64_t cols, int64_t splits,
                        int64_t chunk, Code out_t, void* out, int64_t mean_div,
                        cudaStream_t stream);

// ---- fused optimizer step (optim.cu) ----
using AdamScalars = common::AdamScalars;  // kernels/common/optim.h
// p, g: param_t; m, v: state_t (param_t, or f32 for 16-bit params); all contiguous, n elements.
void launch_adam(Code param_t, Code state_t, void* p, const void* g, void* m, void* v, int64_t n,
                 const AdamScalars& s, int max_blocks, cudaStream_t stream);

// ---- softmax, norms, losses (nn.cu); floating types only, rows contiguous ----
// x: (outer, n, inner) around the softmax dim.
void launch_softmax(Code t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                    bool log, int max_blocks, cudaStream_t stream);
void launch_softmax_backward(Code t, const void* grad, const void* y, void* dx, int64_t outer,
                             int64_t n, int64_t inner, bool log, int max_blocks,
                             cudaStream_t stream);
// x: (rows, n); weight/bias (n) or null; mean (null for rms) and rstd: (rows) in the accumulate
// type.
void launch_norm_forward(Code t, bool rms, const void* x, const void* weight, const void* bias,
                         int64_t rows, int64_t n, double eps, void* y, void* mean, void* rstd,
                         cudaStream_t stream);
void launch_norm_backward_dx(Code t, bool rms, const void* grad, const void* x, const void* mean,
                             const void* rstd, const void* weight, int64_t rows, int64_t n,
                             void* dx, cudaStream_t stream);
// dweight = sum_rows grad * xhat, dbias = sum_rows grad (either may be null); `partial` is an
// accumulate-type workspace of (splits, 2, n).
void launch_norm_backward_params(Code t, const void* grad, const void* x, const void* mean,
                                 const void* rstd, int64_t rows, int64_t n, int64_t splits,
                                 void* partial, void* dweight, void* dbias, cudaStream_t stream);
// logits: (rows, classes); target: (rows) of idx_t; loss (rows) in t; lse (rows) in the accumulate
// type.
void launch_cross_entropy(Code t, Code idx_t, const void* logits, const void* target, int64_t rows,
                          int64_t classes, int64_t ignore_index, double label_smoothing, void* loss,
                          void* lse, cudaStream_t stream);
void launch_cross_entropy_backward(Code t, Code idx_t, const void* grad, bool grad_per_row,
                                   const void* logits, const void* target, const void* lse,
                                   int64_t rows, int64_t classes, int64_t ignore_index,
                                   double label_smoothing, void* dlogits, cudaStream_t stream);
// weight: null (every class weighs 1) or (C) of dtype t.
void launch_nll_loss(Code t, Code idx_t, const void* log_probs, const void* target,
                     const void* weight, int64_t rows, int64_t classes, int64_t ignore_index,
                     void* loss, cudaStream_t stream);
// out (one element of dtype t) = sum of weight[target[r]] over the rows r not ignored, summed
// by one block in a fixed order (deterministic).
void launch_nll_weight_sum(Code t, Code idx_t, const void* target, const void* weight, int64_t rows,
                           int64_t classes, int64_t ignore_index, void* out, cudaStream_t stream);
// dlog_probs must be zeroed by the caller.
void launch_nll_loss_backward(Code t, Code idx_t, const void* grad, bool grad_per_row,
                              const void* target, const void* weight, int64_t rows, int64_t classes,
                              int64_t ignore_index, void* dlog_probs, cudaStream_t stream);

// ---- attention softmax (nn.cu): rows of a contiguous (B, H, T, S) buffer ----
// The additive mask of the scores (kernels/stubs/nn.h sdpa_stub): null, or read at
// mask + b * sb + h * sh + i * si + j * sj for row (b, h, i) = ((b * H) + h) * T + i.
struct SdpaMaskArgs {
  const void* mask = nullptr;
  int64_t H = 1, sb = 0, sh = 0, si = 0, sj = 0;
};
// In place: p = softmax(scale * p + mask) over each row, entries j > i (i = row % T) set to 0
// when causal; lse (null: not written) receives each row's logsumexp, in p's dtype.
void launch_sdpa_softmax(Code t, void* p, int64_t rows, int64_t T, int64_t S, double scale,
                         bool causal, const SdpaMaskArgs& mask, void* lse, cudaStream_t stream);
// In place: dp = scale * p * (dp - rowsum(dp * p)).
void launch_sdpa_softmax_backward(Code t, void* dp, const void* p, int64_t rows, int64_t S,
                                  double scale, cudaStream_t stream);

// ---- 2-D pooling (nn.cu), NCHW contiguous; planes = N * C ----
struct PoolArgs {
  int64_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};
// Max: idx (may be null) gets the argmax as a flat index in the plane (-1: empty window).
void launch_pool_forward(Code t, bool max, const PoolArgs& a, const void* x, void* y, int32_t* idx,
                         int max_blocks, cudaStream_t stream);
// gx must be zeroed by the caller; contributions are added atomically.
void launch_pool_backward(Code t, bool max, const PoolArgs& a, const void* gy, const int32_t* idx,
                          void* gx, int max_blocks, cudaStream_t stream);

// ---- indexing (index.cu) ----
// result[0] = smallest position p with index[p] outside [0, size) (ignoring `ignore` when
// has_ignore), UINT64_MAX if none; result[1] += count of entries != ignore. The caller sets
// result to {UINT64_MAX, 0} first.
void launch_check_indices(Code idx_t, const void* index, int64_t n, int64_t size, bool has_ignore,
                          int64_t ignore, unsigned long long* result, int max_blocks,
                          cudaStream_t stream);
// out[o, j, :] = x[o, index[j], :] -- x (outer, n, inner), out (outer, k, inner).
void launch_index_select(int elem_size, const void* x, Code idx_t, const void* index, int64_t outer,
                         int64_t n, int64_t inner, int64_t k, void* out, cudaStream_t stream);
// out[o, index[j], :] += src[o, j, :] (atomic: duplicates accumulate).
void launch_index_add(Code t, void* out, Code idx_t, const void* index, const void* src,
                      int64_t outer, int64_t n, int64_t inner, int64_t k, cudaStream_t stream);
// Operands of calc: 0 = out (contiguous, index shape), 1 = index, 2 = x with the gather dim's
// stride set to 0; x_dim_stride is that stride. out[i] = x[off2 + index[i] * x_dim_stride].
void launch_gather(int elem_size, const void* x, Code idx_t, const void* index, void* out,
                   int64_t numel, const OffsetCalc<3>& calc, int64_t x_dim_stride, int max_blocks,
                   cudaStream_t stream);
// Operands of calc: 0 = index, 1 = out with the dim's stride set to 0, 2 = src.
// out[off1 + index[i] * out_dim_stride] += src[off2] (atomic).
void launch_scatter_add(Code t, void* out, Code idx_t, const void* index, const void* src,
                        int64_t numel, const OffsetCalc<3>& calc, int64_t out_dim_stride,
                        int max_blocks, cudaStream_t stream);
// x, out: (batch, rows, cols) contiguous; keeps j - i <= diagonal (tril) or >= diagonal (triu).
void launch_trilu(int elem_size, const void* x, void* out, int64_t batch, int64_t rows,
                  int64_t cols, int64_t diagonal, bool upper, int max_blocks, cudaStream_t stream);

// ---- advanced indexing (index_advanced.cu; contract: kernels/stubs/index.h) ----
// Operands of calc: 0 = out (contiguous), 1 = src (restrided), 2 = offsets (int64).
// out[off0] = src[off1 + offsets[off2]].
void launch_index(int elem_size, const void* src, const int64_t* offsets, void* out, int64_t numel,
                  const OffsetCalc<3>& calc, int max_blocks, cudaStream_t stream);
// Operands of calc: 0 = dst (restrided), 1 = values, 2 = offsets (int64).
// dst[off0 + offsets[off2]] = values[off1] (accumulate: atomic +=, dtype t).
void launch_index_put(Code t, int elem_size, bool accumulate, void* dst, const void* values,
                      const int64_t* offsets, int64_t numel, const OffsetCalc<3>& calc,
                      int max_blocks, cudaStream_t stream);
// nonzero of a contiguous x of n elements in `blocks` chunks of `chunk` elements: first the count
// of each chunk (counts: `blocks` int64), then, with each chunk's exclusive prefix (starts), the
// row-major coordinates (out: (total, nd) int64) of x viewed with `sizes` (nd <= kMaxNonzeroDims).
constexpr int kMaxNonzeroDims = 16;
void launch_nonzero_count(Code t, const void* x, int64_t n, int64_t chunk, int blocks,
                          int64_t* counts, cudaStream_t stream);
void launch_nonzero_write(Code t, const void* x, int64_t n, int64_t chunk, int blocks,
                          const int64_t* starts, const int64_t* sizes, int nd, int64_t* out,
                          cudaStream_t stream);

// ---- sorting and sampling (sort.cu; contract: kernels/stubs/sort.h) ----
// x: (rows, n) contiguous of dtype t; keys (rows, p) of t and idx (rows, p) int64 are workspaces
// with p the power of two >= n; values (rows, k) of t and indices (rows, k) int64 the outputs.
// A bitonic sort of each padded row in the total order of the contract (padding last).
void launch_sort(Code t, const void* x, int64_t rows, int64_t n, int64_t p, int64_t k,
                 bool descending, void* keys, int64_t* idx, void* values, int64_t* indices,
                 int max_blocks, cudaStream_t stream);
// probs (rows, n) of dtype t; uniforms (rows, s) double; cdf (rows, n) double and last (rows)
// int64 are workspaces; out (rows, s) int64.
void launch_multinomial(Code t, const void* probs, const double* uniforms, int64_t rows, int64_t n,
                        int64_t s, double* cdf, int64_t* last, int64_t* out, int max_blocks,
                        cudaStream_t stream);

// ---- group_norm (nn_group_norm.cu; contract: kernels/stubs/nn.h) ----
// x: (n, c, s) contiguous; weight / bias (c) or null; mean, rstd: (n, groups) in the accumulate
// type.
void launch_group_norm_forward(Code t, const void* x, const void* weight, const void* bias,
                               int64_t n, int64_t c, int64_t s, int64_t groups, double eps, void* y,
                               void* mean, void* rstd, cudaStream_t stream);
// sums: an accumulate-type workspace of (n, c, 2); dx, dweight, dbias may each be null.
void launch_group_norm_backward(Code t, const void* grad, const void* x, const void* mean,
                                const void* rstd, const void* weight, int64_t n, int64_t c,
                                int64_t s, int64_t groups, void* sums, void* dx, void* dweight,
                                void* dbias, cudaStream_t stream);

}  // namespace accel::cuda
