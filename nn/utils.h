// torch.nn.utils: gradient clipping (clip_grad_norm_ / clip_grad_value_) and the flat parameter
// vector (parameters_to_vector / vector_to_parameters), as nn::utils::, libtorch's spelling (the
// rnn helpers are nn::utils::rnn, nn/rnn.h). The clipping functions are also reachable
// as nn::clip_grad_norm_ / nn::clip_grad_value_ (the spelling before; the same functions).
#pragma once

#include <limits>
#include <vector>

#include "core/tensor.h"

namespace accel::nn {

constexpr double kInfNorm = std::numeric_limits<double>::infinity();

namespace utils {

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

// torch.nn.utils.parameters_to_vector: every parameter flattened and concatenated, in order ->
// (sum of numel). All on one device and of one dtype (DeviceError / DTypeError naming the first
// that differs). Differentiable, as torch's.
Tensor parameters_to_vector(const std::vector<Tensor>& params);
// torch.nn.utils.vector_to_parameters: the slices of vec (1-D, sum of numel elements) written
// into the parameters in order. Unlike torch, which rebinds each param.data to a view of vec, the
// values are copied in place (without recording history), so the parameters keep their identity
// and what holds them (optimizers, DDP buckets) sees the new values.
void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& params);

}  // namespace utils

using utils::clip_grad_norm_;
using utils::clip_grad_value_;

}  // namespace accel::nn
