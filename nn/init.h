// Parameter initialisers (torch.nn.init). Each fills `t` in place (without recording history)
// and returns it; random ones draw from `gen`, or the default generator (manual_seed) when null.
// Values are drawn on the CPU in element order and copied to t's device, so a seed gives the
// same parameters on every device.
//
// A tensor whose storage is not allocated (built under nn::DeferredInit, Note [deferred init] in
// nn/module.cc) is left alone, but a random initialiser still advances the generator
// by the values it would have drawn, so constructors run unchanged under the guard and the
// generator stream stays that of eager construction. While a value sink is bound to such a
// tensor (SinkScope below), the values are handed to the sink instead of being thrown away.
#pragma once

#include <functional>
#include <optional>
#include <utility>
#include <vector>

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

// ---- value sinks (Note [value sinks] in nn/init.cc) ----
// Receives `values` (1-D, on the CPU, in the dtype the initialiser drew: the tensor's for
// uniform_ and constant_, float64 for normal_ and trunc_normal_, rounded by the receiver as
// copy_ rounds) = elements [offset, offset + values.numel()) of the whole tensor in row-major
// order. An initialiser calls it in ascending offsets covering the tensor once.
using ValueSink = std::function<void(int64_t offset, const Tensor& values)>;

// Binds sinks to unallocated tensors on this thread for its lifetime (scopes nest; the innermost
// that binds a storage wins). Each tensor must be contiguous, at offset 0 and cover its whole
// storage (a deferred tensor as nn::deferred_tensor makes it). uniform_, normal_, trunc_normal_,
// constant_ / zeros_ / ones_, and kaiming_* / xavier_* through them, stream the whole tensor's
// values to its sink in chunks of kSinkChunk elements; the fans come from the tensor's (full)
// shape. What cannot stream marks the scope needs_whole(): orthogonal_ and eye_ on a bound
// tensor, an initialiser on a part of one (a view that is not the whole storage), and asking
// nn::is_deferred about one (a reset_parameters that acts on values, e.g. Embedding's padding
// row). The values then streamed are not the tensor's: the caller materialises it whole.
class SinkScope {
 public:
  explicit SinkScope(std::vector<std::pair<Tensor, ValueSink>> sinks);
  ~SinkScope();
  SinkScope(const SinkScope&) = delete;
  SinkScope& operator=(const SinkScope&) = delete;
  bool needs_whole() const { return needs_whole_; }

  // The sink bound to t's storage by the innermost scope binding it, or nullptr. A bound tensor
  // that is not its whole storage marks that scope needs_whole and gives nullptr.
  static const ValueSink* find(const Tensor& t);
  // t's storage is bound: the caller needs its values (marks needs_whole). Cheap when no scope is
  // active.
  static void note_value_needed(const Tensor& t);

 private:
  struct Binding {
    const void* storage;
    ValueSink sink;
  };
  Binding* lookup(const Tensor& t);
  std::vector<Binding> sinks_;
  SinkScope* outer_ = nullptr;
  bool needs_whole_ = false;
};
// Elements per call of a sink.
inline constexpr int64_t kSinkChunk = 8192;

}  // namespace accel::nn::init
