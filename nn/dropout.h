// The channel dropouts, each torch.nn's module of the same name with the same arguments and
// defaults, forwarding to the op of autograd/ops.h (autograd/ops/activation.cc): Dropout1d,
// Dropout2d, Dropout3d. (Dropout is in nn/linear.h with its options.)
#pragma once

#include <string>

#include "core/generator.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace accel::nn {

// torch.nn.Dropout1d / Dropout2d / Dropout3d(p=0.5, inplace=False): in training, zeroes each
// channel with probability p and scales the rest by 1 / (1 - p); identity in evaluation.
// Dropout1d: (N, C, L) or (C, L); Dropout2d: (N, C, H, W), and (N, C, L) for a 3-D input, as
// torch reads it (Note [channel dropout] in autograd/ops/activation.cc); Dropout3d:
// (N, C, D, H, W) or (C, D, H, W). Options: DropoutOptions (nn/linear.h), as libtorch.
// The generator comes last, after inplace (Dropout2d(0.5, &gen) and Dropout2d(0.5, true, &gen)).
using Dropout1dOptions = DropoutOptions;
using Dropout2dOptions = DropoutOptions;
using Dropout3dOptions = DropoutOptions;

class Dropout1d : public Module {
 public:
  explicit Dropout1d(double p = 0.5, Generator* gen = nullptr) : Dropout1d(p, false, gen) {}
  Dropout1d(double p, bool inplace, Generator* gen = nullptr);
  explicit Dropout1d(const DropoutFields& options, Generator* gen = nullptr)
      : Dropout1d(options.p, options.inplace, gen) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
  bool inplace = false;

 private:
  Generator* gen_;
};

class Dropout2d : public Module {
 public:
  explicit Dropout2d(double p = 0.5, Generator* gen = nullptr);
  Dropout2d(double p, bool inplace, Generator* gen = nullptr);
  explicit Dropout2d(const DropoutFields& options, Generator* gen = nullptr)
      : Dropout2d(options.p, options.inplace, gen) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
  bool inplace = false;

 private:
  Generator* gen_;
};

class Dropout3d : public Module {
 public:
  explicit Dropout3d(double p = 0.5, Generator* gen = nullptr) : Dropout3d(p, false, gen) {}
  Dropout3d(double p, bool inplace, Generator* gen = nullptr);
  explicit Dropout3d(const DropoutFields& options, Generator* gen = nullptr)
      : Dropout3d(options.p, options.inplace, gen) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
  bool inplace = false;

 private:
  Generator* gen_;
};

}  // namespace accel::nn
