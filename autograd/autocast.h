// Autocast: a thread-local mixed-precision scope that the matmul-class ops (matmul, mm, bmm,
// linear, conv2d, attention) consult to run in bfloat16 / float16 while the parameters stay
// float32 ("master weights"), and that the precision-sensitive ops (softmax, log_softmax,
// layer_norm, rms_norm, the losses) consult to run in float32.
//
//   {
//     AutocastGuard autocast(true, kBFloat16);
//     Tensor y = model->forward(x);   // linear/conv inputs cast by autocast_cast()
//     Tensor loss = cross_entropy(y, target);   // upcasts a bf16 y itself: loss is float32
//   }
//
// Note [autocast on CPU]
// On CUDA, autocast_cast() converts float32 inputs to the low-precision dtype, so the kernel
// runs in bf16/fp16 and the output has that dtype (as torch.autocast does). On CPU it rounds the
// inputs to the low-precision dtype and back to float32 (x.to(bf16).to(f32)): the product of
// bf16-rounded values is computed exactly as a bf16 kernel with an fp32 accumulator would (the
// oneDNN bf16 path), the output stays float32, and the rest of the graph needs no mixed-dtype
// support. Both casts are differentiable, so the gradients flowing back into the weights are
// rounded the same way. float64 (gradcheck) and non-floating inputs pass through untouched, as
// torch.autocast leaves float64 alone. The matmul-class ops' own backward runs on the rounded
// inputs they saved; the gradients they hand back are rounded to the low-precision dtype by the
// backward of the casts (as bf16 gradients would be) before they reach the float32 weights.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

namespace accel {

namespace detail {
struct AutocastState {
  bool enabled = false;
  DType dtype = kBFloat16;
};
// Read inline by every matmul-class and fp32-only op (Note [autocast in ops]); constinit so
// other translation units access it without a TLS init wrapper call.
extern constinit thread_local AutocastState tls_autocast __attribute__((tls_model("initial-exec")));
}  // namespace detail

// Whether the current thread is inside an enabled autocast scope.
inline bool autocast_enabled() { return detail::tls_autocast.enabled; }
// The low-precision dtype of the current scope (kBFloat16 or kFloat16; kBFloat16 outside one).
inline DType autocast_dtype() { return detail::tls_autocast.dtype; }
void set_autocast_enabled(bool enabled);
// Throws DTypeError for anything but kBFloat16 / kFloat16.
void set_autocast_dtype(DType dtype);

// Sets (enabled, dtype) for its lifetime and restores the previous state; nests.
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled = true, DType dtype = kBFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

// Note [autocast in ops]
// The ops consult autocast at their public entry, before any check, so the rest of the op sees
// ordinary tensors and its error messages name the dtypes it really ran with:
//   matmul-class (matmul, mm, bmm, linear, conv2d):
//     if (ACCEL_UNLIKELY(autocast_enabled())) {
//       Tensor xc = autocast_cast(x), wc = autocast_cast(w);
//       AutocastSuspend off;          // the cast inputs must not be cast again
//       return linear(xc, wc, ...);
//     }
//   fp32-only (softmax, log_softmax, layer_norm, rms_norm, the losses):
//     if (ACCEL_UNLIKELY(autocast_wants_upcast(x, t))) return op(autocast_upcast(x), ...);
//     (after the upcast no input is low precision, so the nested call does not recurse again).
// Outside autocast this costs one thread-local bool load per op and no call.

// Input cast for a matmul-class op (Note [autocast on CPU]): identity outside autocast and for
// float64 and non-floating tensors. float32 (and, on CPU, an already low-precision input) becomes
// the autocast dtype: converted on CUDA, rounded and kept as float32 on CPU.
Tensor autocast_cast(const Tensor& x);
// Input cast for a float32-only op: bf16/fp16 tensors become float32 inside autocast; identity
// otherwise.
Tensor autocast_upcast(const Tensor& x);

inline bool is_low_precision(const Tensor& x) {
  return x.defined() && (x.dtype() == kBFloat16 || x.dtype() == kFloat16);
}
// Inside autocast and any argument is bf16/fp16: the fp32-only op must upcast first.
inline bool autocast_wants_upcast(const Tensor& a, const Tensor& b = Tensor(),
                                  const Tensor& c = Tensor()) {
  return autocast_enabled() && (is_low_precision(a) || is_low_precision(b) || is_low_precision(c));
}

// Turns autocast off for its lifetime (keeping the dtype), restoring it after; no checks, for the
// ops' nested call of Note [autocast in ops] and for backward passes.
class AutocastSuspend {
 public:
  AutocastSuspend() : prev_(detail::tls_autocast.enabled) { detail::tls_autocast.enabled = false; }
  ~AutocastSuspend() { detail::tls_autocast.enabled = prev_; }
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  bool prev_;
};
// Round x (float32, CPU or CUDA) to `dtype` and back, differentiably.
Tensor round_to_precision(const Tensor& x, DType dtype);

}  // namespace accel
