// Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_).
#pragma once

#include <limits>
#include <vector>

#include "core/tensor.h"

namespace accel::nn {

constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// Scales the gradients of `params` in place so that their joint p-norm (the norm of all
// gradients concatenated; p = kInfNorm for the max norm) is at most max_norm, and returns that
// norm measured before clipping. Parameters without a gradient are skipped. The scale is
// max_norm / (norm + 1e-6), applied only when it is below 1. error_if_nonfinite throws
// ValueError when the norm is NaN or infinite (otherwise the gradients become NaN, as in
// PyTorch).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p = 2.0,
                       bool error_if_nonfinite = false);
// Clamps every gradient element into [-clip_value, clip_value].
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace accel::nn
