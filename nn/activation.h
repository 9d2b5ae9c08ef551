// Parameter-free modules: activations, Identity, Flatten. Each forwards to the op in
// autograd/ops.h; they exist so activations can sit in a Sequential.
//
// Those torch gives `inplace` take it as torch does, positionally (nn::ReLU(true),
// nn::LeakyReLU(0.2, true)) or through libtorch's options
// (nn::ReLU(nn::ReLUOptions().inplace(true)),
// nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2).inplace(true)); Note [options structs]
// in autograd/options.h), and then run the in-place op on their input (relu_, leaky_relu_, ...;
// Note [in-place activations] in autograd/ops/activation.cc): the input is overwritten and
// returned, so it must not be a leaf that requires grad or a tensor another op saved.
#pragma once

#include <string>

#include "nn/module.h"
#include "autograd/options.h"

namespace accel::nn {

struct Identity : Module {
  Tensor forward(const Tensor& x) override { return x; }
};

// Options of the activations whose only option is inplace (libtorch's ReLUOptions(inplace),
// ReLU6Options, SELUOptions).
struct InplaceFields {
  bool inplace = false;
};
struct InplaceOptions : InplaceFields {
  using Fields = InplaceFields;
  InplaceOptions(bool inplace = false) { Fields::inplace = inplace; }  // NOLINT: implicit
  ACCEL_OPTIONS_FROM_FIELDS(InplaceOptions)
  ACCEL_OPTION(inplace)
};
using ReLUOptions = InplaceOptions;
using ReLU6Options = InplaceOptions;
using SELUOptions = InplaceOptions;
using HardsigmoidOptions = InplaceOptions;
using HardswishOptions = InplaceOptions;

// torch.nn.ReLU(inplace=False).
struct ReLU : Module {
  explicit ReLU(bool inplace = false) : inplace(inplace) {}
  explicit ReLU(const InplaceFields& options) : inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

// torch.nn.ReLU6(inplace=False): min(max(x, 0), 6) (hardtanh(x, 0, 6)).
struct ReLU6 : Module {
  explicit ReLU6(bool inplace = false) : inplace(inplace) {}
  explicit ReLU6(const InplaceFields& options) : inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

// torch.nn.SELU(inplace=False): 1.0507 elu(x, 1.6733).
struct SELU : Module {
  explicit SELU(bool inplace = false) : inplace(inplace) {}
  explicit SELU(const InplaceFields& options) : inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

// torch.nn.Hardtanh(min_val=-1.0, max_val=1.0, inplace=False).
struct HardtanhFields {
  double min_val = -1.0;
  double max_val = 1.0;
  bool inplace = false;
};
struct HardtanhOptions : HardtanhFields {
  using Fields = HardtanhFields;
  HardtanhOptions() = default;
  ACCEL_OPTIONS_FROM_FIELDS(HardtanhOptions)
  ACCEL_OPTION(min_val)
  ACCEL_OPTION(max_val)
  ACCEL_OPTION(inplace)
};
struct Hardtanh : Module {
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0, bool inplace = false);
  explicit Hardtanh(const HardtanhFields& options)
      : Hardtanh(options.min_val, options.max_val, options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double min_val, max_val;
  bool inplace = false;
};

// torch.nn.CELU(alpha=1.0, inplace=False).
struct CELUFields {
  double alpha = 1.0;
  bool inplace = false;
};
struct CELUOptions : CELUFields {
  using Fields = CELUFields;
  CELUOptions() = default;
  ACCEL_OPTIONS_FROM_FIELDS(CELUOptions)
  ACCEL_OPTION(alpha)
  ACCEL_OPTION(inplace)
};
struct CELU : Module {
  explicit CELU(double alpha = 1.0, bool inplace = false);
  explicit CELU(const CELUFields& options) : CELU(options.alpha, options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double alpha;
  bool inplace = false;
};

// torch.nn.Threshold(threshold, value, inplace=False): x > threshold ? x : value.
struct ThresholdFields {
  double threshold = 0.0;
  double value = 0.0;
  bool inplace = false;
};
struct ThresholdOptions : ThresholdFields {
  using Fields = ThresholdFields;
  ThresholdOptions(double threshold, double value) {
    Fields::threshold = threshold;
    Fields::value = value;
  }
  ACCEL_OPTIONS_FROM_FIELDS(ThresholdOptions)
  ACCEL_OPTION(threshold)
  ACCEL_OPTION(value)
  ACCEL_OPTION(inplace)
};
struct Threshold : Module {
  Threshold(double threshold, double value, bool inplace = false)
      : threshold(threshold), value(value), inplace(inplace) {}
  explicit Threshold(const ThresholdFields& options)
      : Threshold(options.threshold, options.value, options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double threshold, value;
  bool inplace = false;
};

struct GELU : Module {
  // "none" (exact, erf) or "tanh".
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  std::string approximate;
};

// torch.nn.SiLU(inplace=False).
struct SiLU : Module {
  explicit SiLU(bool inplace = false) : inplace(inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

// torch.nn.Hardsigmoid(inplace=False): relu6(x + 3) / 6.
struct Hardsigmoid : Module {
  explicit Hardsigmoid(bool inplace = false) : inplace(inplace) {}
  explicit Hardsigmoid(const InplaceFields& options) : inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

// torch.nn.Hardswish(inplace=False): x relu6(x + 3) / 6 (MobileNetV3's activation).
struct Hardswish : Module {
  explicit Hardswish(bool inplace = false) : inplace(inplace) {}
  explicit Hardswish(const InplaceFields& options) : inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

struct Tanh : Module {
  Tensor forward(const Tensor& x) override;
};

struct Sigmoid : Module {
  Tensor forward(const Tensor& x) override;
};

// Flattens dims [start_dim, end_dim] into one: (N, C, H, W) -> (N, C*H*W) by default.
struct Flatten : Module {
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

// torch.nn.LeakyReLU(negative_slope=0.01, inplace=False): x > 0 ? x : negative_slope x.
struct LeakyReLUFields {
  double negative_slope = 0.01;
  bool inplace = false;
};
struct LeakyReLUOptions : LeakyReLUFields {
  using Fields = LeakyReLUFields;
  LeakyReLUOptions() = default;
  ACCEL_OPTIONS_FROM_FIELDS(LeakyReLUOptions)
  ACCEL_OPTION(negative_slope)
  ACCEL_OPTION(inplace)
};
struct LeakyReLU : Module {
  explicit LeakyReLU(double negative_slope = 0.01, bool inplace = false)
      : negative_slope(negative_slope), inplace(inplace) {}
  explicit LeakyReLU(const LeakyReLUFields& options)
      : LeakyReLU(options.negative_slope, options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double negative_slope;
  bool inplace = false;
};

// torch.nn.ELU(alpha=1.0, inplace=False): x > 0 ? x : alpha (exp(x) - 1).
struct ELUFields {
  double alpha = 1.0;
  bool inplace = false;
};
struct ELUOptions : ELUFields {
  using Fields = ELUFields;
  ELUOptions() = default;
  ACCEL_OPTIONS_FROM_FIELDS(ELUOptions)
  ACCEL_OPTION(alpha)
  ACCEL_OPTION(inplace)
};
struct ELU : Module {
  explicit ELU(double alpha = 1.0, bool inplace = false) : alpha(alpha), inplace(inplace) {}
  explicit ELU(const ELUFields& options) : ELU(options.alpha, options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double alpha;
  bool inplace = false;
};

// torch.nn.Softmax(dim) / LogSoftmax(dim); torch's dim=None (a legacy guess of the dim) is not
// offered: the dim is required.
struct Softmax : Module {
  explicit Softmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t dim;
};

struct LogSoftmax : Module {
  explicit LogSoftmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t dim;
};

}  // namespace accel::nn
