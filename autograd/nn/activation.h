// Parameter-free modules: activations, Identity, Flatten. Each forwards to the op in
// autograd/ops.h; they exist so activations can sit in a Sequential.
#pragma once

#include <string>

#include "autograd/nn/module.h"

namespace accel::nn {

struct Identity : Module {
  Tensor forward(const Tensor& x) override { return x; }
};

struct ReLU : Module {
  Tensor forward(const Tensor& x) override;
};

struct GELU : Module {
  // "none" (exact, erf) or "tanh".
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  std::string approximate;
};

struct SiLU : Module {
  Tensor forward(const Tensor& x) override;
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

// torch.nn.LeakyReLU(negative_slope=0.01): x > 0 ? x : negative_slope x.
struct LeakyReLU : Module {
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double negative_slope;
};

// torch.nn.ELU(alpha=1.0): x > 0 ? x : alpha (exp(x) - 1).
struct ELU : Module {
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double alpha;
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
