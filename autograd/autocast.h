// Autocast: a thread-local mixed-precision scope that the matmul-class ops (matmul, mm, bmm,
// linear, conv2d, attention) consult to run in bfloat16 / float16 while the parameters stay
// float32 ("master weights"), and that the precision-sensitive ops (softmax, log_softmax,
// norms, losses, reductions) consult to run in float32.
//
//   {
//     AutocastGuard autocast(true, kBFloat16);
//     Tensor y = model->forward(x);   // linear/conv inputs cast by autocast_cast()
//     Tensor loss = cross_entropy(autocast_upcast(y), target);
//   }
//
// Note [autocast on CPU]
// On CUDA, autocast_cast() converts float32 inputs to the low-precision dtype, so the kernel
// runs in bf16/fp16 and the output has that dtype (as torch.autocast does). On CPU it rounds the
// inputs to the low-precision dtype and back to float32 (x.to(bf16).to(f32)): the product of
// bf16-rounded values is computed exactly as a bf16 kernel with an fp32 accumulator would (the
// oneDNN bf16 path), the output stays float32, and the rest of the graph needs no mixed-dtype
// support. Both casts are differentiable, so the gradients flowing back into the weights are
// rounded the same way. Inputs that are not float32 (float64 gradcheck inputs, integers) pass
// through untouched.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

namespace accel {

// Whether the current thread is inside an enabled autocast scope.
bool autocast_enabled();
// The low-precision dtype of the current scope (kBFloat16 or kFloat16; kBFloat16 outside one).
DType autocast_dtype();
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

// Input cast for a matmul-class op (Note [autocast on CPU]): identity outside autocast or for a
// tensor that is not float32.
Tensor autocast_cast(const Tensor& x);
// Input cast for a float32-only op: bf16/fp16 tensors become float32 inside autocast; identity
// otherwise.
Tensor autocast_upcast(const Tensor& x);
// Round x (float32, CPU or CUDA) to `dtype` and back, differentiably.
Tensor round_to_precision(const Tensor& x, DType dtype);

}  // namespace accel
