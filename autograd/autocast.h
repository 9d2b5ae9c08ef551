// Autocast: a thread-local mixed-precision scope that the matmul-class ops (matmul, mm, bmm,
// linear, conv2d, attention) consult to run in bfloat16 / float16 while the parameters stay
// float32 ("master weights"), and that the precision-sensitive ops (softmax, log_softmax, the
// losses; layer_norm and rms_norm off the CPU) consult to run in float32. On the CPU the norms
// keep a 16-bit input 16-bit, with float32 statistics and parameters (Note [autocast norms] in
// autograd/ops/nn.cc).
//
//   {
//     AutocastGuard autocast(true, kBFloat16);
//     Tensor y = model->forward(x);   // linear/conv inputs cast by autocast_cast()
//     Tensor loss = cross_entropy(y, target);   // upcasts a bf16 y itself: loss is float32
//   }
//
// Note [autocast on CPU]
// On CPU as on CUDA (and as torch.autocast does on both), autocast_cast() converts float32 inputs
// of the matmul-class ops to the low-precision dtype, so oneDNN runs its bf16 (fp16) kernel with
// an fp32 accumulator and writes the 16-bit output directly; linear fuses its bias into that
// call. The output therefore has the low-precision dtype, elementwise ops after it run on 16-bit
// data (half the bytes), binary ops that meet a float32 tensor promote, and the
// precision-sensitive ops (softmax, losses; the norms off the CPU) upcast to float32 (Note
// [autocast in ops]); on the CPU the norms keep 16-bit activations 16-bit (Note [autocast norms]).
// Where the device's 16-bit GEMM is slower than its float32 one (the CPU without AMX for bf16,
// every CPU for f16: matmul_lowp_preferred_stub), linear (and matmul / mm by a 2-D weight) instead
// runs as one node that computes
// the same values in float32 on rounded operands, with no cast nodes: the float32 input is rounded
// inside the kernel, the weight through a cached float32 image (autocast_weight_image), and float32
// inputs get float32 gradients rounded by the kernel (Note [autocast linear in float32] in
// kernels/stubs/linalg.h). The output is still 16-bit, and every value is the one the casts give.
// Where the CPU's bf16 GEMM is the faster one, linear (and matmul / mm by a 2-D weight) is also
// one node, on the 16-bit GEMM, whose float32 inputs get the GEMM's float32 accumulator as their
// gradient (Note [autocast linear, native 16-bit] in autograd/ops/linalg.cc): the same forward
// bits, gradients within a bf16 rounding of the casts' (more accurate). conv2d and bmm cast.
// Until 2026-12 the CPU path instead rounded the inputs and kept float32 (x.to(bf16).to(f32)):
// the same products, but two conversions per input and an fp32 GEMM, so autocast could only be
// slower than float32 (docs/performance.md, "bf16 autocast on the CPU").
// Both casts are differentiable: the gradients come back in the low-precision dtype through the
// matmul-class backward (which runs on the 16-bit tensors it saved) and the cast's backward turns
// them into float32 for the master weights. float64 (gradcheck) and non-floating inputs pass
// through untouched, as torch.autocast leaves float64 alone.
//
// Note [autocast weight cache]
// A parameter used by several ops of one forward (or by every micro-step of a region) would be
// converted on every call. As PyTorch's autocast does, the low-precision copy of a leaf tensor
// that requires grad is cached per thread, keyed on the tensor, and reused while
//   - the tensor's storage is the same and its version (bumped by every in-place update and by
//     the optimizers) is unchanged, and
//   - grad mode is the same as when it was made (a copy made under no_grad has no history).
// The float32 images of the fused linear (Note [autocast on CPU]) are cached the same way, in
// grad mode or not (they carry no history). The cache holds references to the parameters and
// copies; it is cleared when the outermost
// AutocastGuard (enabled or not) is destroyed, so it lives for one autocast region / step.
// Non-leaf tensors (activations) are converted on each use, as they are used once.
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
// Outermost guard's destructor clears the weight cache (Note [autocast weight cache]).
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
//   fp32-only (softmax, log_softmax, the losses; layer_norm, rms_norm off the CPU):
//     if (ACCEL_UNLIKELY(autocast_wants_upcast(x, t))) return op(autocast_upcast(x), ...);
//     (after the upcast no input is low precision, so the nested call does not recurse again).
// Outside autocast this costs one thread-local bool load per op and no call.

// Input cast for a matmul-class op (Note [autocast on CPU]): identity outside autocast and for
// float64 and non-floating tensors. float32 and the other 16-bit dtype become the autocast dtype,
// through the weight cache for leaf tensors that require grad (Note [autocast weight cache]).
Tensor autocast_cast(const Tensor& x);

// x converted to `low` (kBFloat16 / kFloat16) without autograd history, for the native 16-bit
// linear of Note [autocast linear, native 16-bit] (autograd/ops/linalg.cc), which records one
// node and gives float32 inputs their gradients itself. A leaf that requires grad is cached inside
// an AutocastGuard like autocast_cast's copies (Note [autocast weight cache]), in grad mode or not.
// x of dtype `low` comes back detached as it is.
Tensor autocast_cast_detached(const Tensor& x, DType low);

// The float32 image of x rounded to `low` for matmul_lowp_stub (Note [autocast linear in float32]
// in kernels/stubs/linalg.h), detached. For a leaf float32 tensor that requires grad inside an
// AutocastGuard it is cached like the 16-bit copies (Note [autocast weight cache]) and *exact is
// set (the kernel uses it as it is); otherwise x itself comes back with *exact false (the kernel
// rounds it as it reads it). x must be float32.
Tensor autocast_weight_image(const Tensor& x, DType low, bool* exact);

// Weight cache counters of the current thread (Note [autocast weight cache]); for tests and the
// bench. `conversions` counts the casts autocast_cast() made (cached or not), `hits` the casts it
// saved.
struct AutocastCacheStats {
  int64_t conversions = 0;
  int64_t hits = 0;
  int64_t entries = 0;  // copies held now
};
AutocastCacheStats autocast_cache_stats();
// Drops the current thread's cached copies (the outermost AutocastGuard does it on exit).
void clear_autocast_cache();
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
