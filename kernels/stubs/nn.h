// Kernels of the fused neural-network ops (kernels/<backend>/softmax.*, norm.*, loss.*).
//
// Every tensor argument is contiguous unless stated otherwise; the op in autograd/ops/nn.cc
// makes it so. Statistics saved for the backward (mean, rstd, lse) are stored in the
// accumulation dtype acc_dtype(x.dtype()) (kernels/common/acc_dtype.h): float32 for
// f32/f16/bf16 inputs, float64 for f64.
#pragma once

#include "core/dispatch.h"
#include "kernels/common/acc_dtype.h"

namespace accel {

// ---- softmax family ----
// x, y: same shape, contiguous; normalised over `dim` (already wrapped; 0 for a 0-dim x).
// log = true computes log_softmax.
ACCEL_DECLARE_STUB(softmax_stub, void (*)(const Tensor& x, int64_t dim, bool log, Tensor& y));
// grad, y (the forward output), dx: same shape, contiguous.
//   softmax:     dx = y * (grad - sum(grad * y))
//   log_softmax: dx = grad - exp(y) * sum(grad)
ACCEL_DECLARE_STUB(softmax_backward_stub, void (*)(const Tensor& grad, const Tensor& y, int64_t dim,
                                                   bool log, Tensor& dx));

// ---- normalisation over the trailing n elements of each row ----
// x: (M * n) elements viewed as (M, n); weight, bias: (n) or undefined; y like x;
// mean, rstd: (M) in the accumulation dtype. weight / bias (and dweight / dbias) have x's dtype,
// or on the CPU only float32 with a bfloat16 / float16 x (Note [mixed-dtype norms] in
// kernels/cpu/nn_norm.cc; the op never sends that mix to another device).
ACCEL_DECLARE_STUB(layer_norm_stub,
                   void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                            double eps, Tensor& y, Tensor& mean, Tensor& rstd));
// Any of dx, dweight, dbias may be undefined (not needed). dweight/dbias are overwritten.
ACCEL_DECLARE_STUB(layer_norm_backward_stub,
                   void (*)(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& rstd, const Tensor& weight, int64_t n, Tensor& dx,
                            Tensor& dweight, Tensor& dbias));
// RMSNorm: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
ACCEL_DECLARE_STUB(rms_norm_stub, void (*)(const Tensor& x, const Tensor& weight, int64_t n,
                                           double eps, Tensor& y, Tensor& rstd));
ACCEL_DECLARE_STUB(rms_norm_backward_stub,
                   void (*)(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                            const Tensor& weight, int64_t n, Tensor& dx, Tensor& dweight));

// ---- classification losses over rows ----
// logits: (R, C); target: (R) int32/int64. Per row r with t = target[r] != ignore_index:
//   loss[r] = (1 - ls) * (lse[r] - logits[r, t]) + ls * (lse[r] - mean_c logits[r, c])
// and loss[r] = 0 for ignored rows. lse: (R) log-sum-exp in the accumulation dtype; valid: one
// element = number of rows not ignored. loss and valid are in the logits' dtype or (the CPU's
// autocast route for 16-bit logits, Note [autocast cross-entropy]) in the accumulation dtype. A
// target outside [0, C) that is not ignore_index throws IndexError naming `op`.
ACCEL_DECLARE_STUB(cross_entropy_stub,
                   void (*)(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                            double label_smoothing, const char* op, Tensor& loss, Tensor& lse,
                            Tensor& valid));
// grad: one element (broadcast to every row) or (R), in the logits' dtype or the accumulation
// dtype (the CPU's autocast route). dlogits: (R, C), the logits' dtype, overwritten with
//   grad[r] * (softmax(logits[r]) - (1 - ls) * onehot(t) - ls / C), zero for ignored rows.
ACCEL_DECLARE_STUB(cross_entropy_backward_stub,
                   void (*)(const Tensor& grad, const Tensor& logits, const Tensor& target,
                            const Tensor& lse, int64_t ignore_index, double label_smoothing,
                            Tensor& dlogits));
// log_probs: (R, C); weight: undefined (every class weighs 1) or (C) contiguous, log_probs'
// dtype, on its device. loss[r] = -w[t] log_probs[r, t] with t = target[r] (0 when ignored);
// valid: one element (log_probs' dtype) = the sum of w[t] over the rows not ignored (their count
// without weights), the denominator of torch's weighted mean. Target checks as cross_entropy's.
ACCEL_DECLARE_STUB(nll_loss_stub,
                   void (*)(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                            int64_t ignore_index, const char* op, Tensor& loss, Tensor& valid));
// dlog_probs: (R, C), overwritten: -w[t] grad[r] at (r, t = target[r]), zero elsewhere; grad one
// element (broadcast to every row) or (R); weight as in nll_loss_stub.
ACCEL_DECLARE_STUB(nll_loss_backward_stub,
                   void (*)(const Tensor& grad, const Tensor& target, const Tensor& weight,
                            int64_t ignore_index, Tensor& dlog_probs));

// ---- fused scaled dot-product attention (Note [fused attention], kernels/cpu/nn_attention.cc)
// ---- q: (B, H, T, D), k: (B, H, S, D), v: (B, H, S, Dv), out: (B, H, T, Dv): any strides with a
// unit stride in the last dim (views into a packed qkv buffer are fine); S > 0. mask: undefined,
// or an additive mask of lse's dtype viewed (B, H, T, S) with any strides (0 where it
// broadcasts). Scores: scale * q k^T + mask, and when causal j > i is -inf (top-left aligned: row i
// sees keys [0, min(i + 1, S))). lse: (B, H, T) contiguous, q's dtype (float32 for bf16 q: the CPU
// kernel, Note [bf16 fused attention]; the CUDA one takes q's dtype), receives each row's logsumexp
// of the scores. p: undefined, or (B, H, T, S) contiguous: then it receives the probabilities as
// well (zeros where masked by causality) and the backward reads them instead of recomputing (Note
// [attention probabilities kept for short rows]).
ACCEL_DECLARE_STUB(sdpa_stub,
                   void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p));
// dout like out; mask, out, lse and p as the forward had them; dq, dk, dv like q, k, v (same rule
// on strides), fully overwritten.
ACCEL_DECLARE_STUB(sdpa_backward_stub,
                   void (*)(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& mask, const Tensor& out, const Tensor& lse,
                            const Tensor& p, double scale, bool causal, Tensor& dq, Tensor& dk,
                            Tensor& dv));

// ---- group normalisation (kernels/<backend>/nn_group_norm.*) ----
// x: (N, C, *) contiguous, S = numel / (N C) elements per channel; `groups` divides C, each group
// of C / groups channels normalised over its (C / groups) S elements: y like x,
//   y = (x - mean[n, g]) * rstd[n, g] * weight[c] + bias[c];
// weight, bias: (C) or undefined (1 and 0); mean, rstd: (N, groups) in the accumulation dtype.
ACCEL_DECLARE_STUB(group_norm_stub,
                   void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            int64_t groups, double eps, Tensor& y, Tensor& mean, Tensor& rstd));
// grad like x; each of dx (like x), dweight, dbias ((C)) is undefined (not wanted) or
// preallocated and overwritten.
ACCEL_DECLARE_STUB(group_norm_backward_stub,
                   void (*)(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& rstd, const Tensor& weight, int64_t groups, Tensor& dx,
                            Tensor& dweight, Tensor& dbias));

}  // namespace accel
