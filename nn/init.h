// Parameter initialisers (torch.nn.init). Each fills `t` in place (without recording history)
// and returns it; random ones draw from `gen`, or the default generator (manual_seed) when null.
// Values are drawn on the CPU in element order and copied to t's device, so a seed gives the
// same parameters on every device.
//
// A tensor whose storage is not allocated (built under nn::DeferredInit, Note [deferred init] in
// nn/module.cc) is left alone, but a random initialiser still advances the generator
// by the values it would have drawn, so constructors run unchanged under the guard and the
// generator stream stays that of eager construction.
#pragma once

#include <optional>
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace accel::nn::init {

enum class FanMode : uint8_t { FanIn, FanOut };

// For a weight (out, in, k...): fan_in = in * prod(k), fan_out = out * prod(k). Needs dim >= 2.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);
// torch.nn.init.calculate_gain(nonlinearity, param=None): the recommended gain for "linear",
// "conv1d/2d/3d", "conv_transpose1d/2d/3d", "sigmoid" (1), "tanh" (5/3), "relu" (sqrt 2),
// "leaky_relu" (sqrt(2 / (1 + slope^2)), param = negative slope, default 0.01), "selu" (3/4).
double calculate_gain(const char* nonlinearity, std::optional<double> param = std::nullopt);

// torch.nn.init.uniform_(tensor, a=0, b=1), normal_(tensor, mean=0, std=1), constant_, zeros_,
// ones_.
Tensor uniform_(Tensor t, double lo = 0.0, double hi = 1.0, Generator* gen = nullptr);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(Tensor t, Scalar value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
// torch.nn.init.eye_: the identity in a 2-D tensor (ones on the main diagonal).
Tensor eye_(Tensor t);
// torch.nn.init.trunc_normal_(tensor, mean=0, std=1, a=-2, b=2, generator=None): normal(mean,
// std) truncated to [a, b] (a, b absolute, not in stds), by inverse CDF of a uniform draw (one
// float64 draw per element), as torch. std > 0 and a < b.
Tensor trunc_normal_(Tensor t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                     Generator* gen = nullptr);
// torch.nn.init.orthogonal_(tensor, gain=1, generator=None): t viewed as (rows = size(0),
// cols = numel / rows) gets gain * Q, Q from the QR decomposition of a normal (rows, cols) matrix
// (transposed first when rows < cols) with each column's sign set so that R's diagonal is
// positive, as torch: orthonormal rows or columns, whichever are fewer. Needs dim >= 2.
Tensor orthogonal_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
// torch.nn.init.kaiming_uniform_(tensor, a=0, mode='fan_in', nonlinearity='leaky_relu',
// generator=None) and kaiming_normal_: std = calculate_gain(nonlinearity, a) / sqrt(fan), fan of
// the mode (calculate_fan_in_and_fan_out); uniform(-sqrt(3) std, sqrt(3) std) or normal(0, std).
// He initialisation. With a = sqrt(5) (what Linear/Conv2d use) the bound is 1/sqrt(fan_in).
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const char* nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       const char* nonlinearity = "leaky_relu", Generator* gen = nullptr);
// torch.nn.init.xavier_uniform_(tensor, gain=1, generator=None): uniform(-b, b),
// b = gain sqrt(6 / (fan_in + fan_out)); xavier_normal_: normal(0, gain sqrt(2 / (fan_in +
// fan_out))).
Tensor xavier_uniform_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
Tensor xavier_normal_(Tensor t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace accel::nn::init
