// Fused optimizer kernels (kernels/<backend>/optim.*).
#pragma once

#include "core/dispatch.h"

namespace accel {

// One Adam / AdamW step, PyTorch's update:
//   decoupled (AdamW): p *= 1 - lr * weight_decay        else (Adam): g += weight_decay * p
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / bias_correction1) * m / (sqrt(v) / sqrt(bias_correction2) + eps)
// with bias_correction_k = 1 - beta_k ^ step computed by the caller.
struct AdamStepParams {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double bias_correction1 = 1.0, bias_correction2 = 1.0;
  bool decoupled = true;
};

// param, grad, exp_avg, exp_avg_sq: contiguous, same shape, same floating dtype, same device.
// Updates param, exp_avg and exp_avg_sq in place in one pass (half types compute in float).
ACCEL_DECLARE_STUB(adamw_stub, void (*)(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                        Tensor& exp_avg_sq, const AdamStepParams& p));

}  // namespace accel
