// Parameter initialisers (torch.nn.init). Each fills `t` in place (without recording history)
// and returns it; random ones draw from `gen`, or the default generator (manual_seed) when null.
// Values are drawn on the CPU in element order and copied to t's device, so a seed gives the
// same parameters on every device.
//
// A tensor whose storage is not allocated (built under nn::DeferredInit, Note [deferred init] in
// autograd/nn/module.cc) is left alone, but a random initialiser still advances the generator
// by the values it would have drawn, so constructors run unchanged under the guard and the
// generator stream stays that of eager construction.
#pragma once

#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace accel::nn::init {

enum class FanMode : uint8_t { FanIn, FanOut };

// For a weight (out, in, k...): fan_in = in * prod(k), fan_out = out * prod(k). Needs dim >= 2.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);
// Recommended gain for a nonlinearity: "linear", "conv2d", "sigmoid", "tanh", "relu",
// "leaky_relu" (param = negative slope, default 0.01), "selu".
double calculate_gain(const char* nonlinearity, double param = -1.0);

Tensor uniform_(Tensor t, double lo = 0.0, double hi = 1.0, Generator* gen = nullptr);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(Tensor t, Scalar value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
// He initialisation. With a = sqrt(5) (what Linear/Conv2d use) the bound is 1/sqrt(fan_in).
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const char* nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       const char* nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor xavier_uniform_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
Tensor xavier_normal_(Tensor t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace accel::nn::init
