// LayerNorm and RMSNorm over the trailing `normalized_shape` dims (fused ops of
// autograd/ops.h). Weight starts at 1, bias at 0.
#pragma once

#include <optional>
#include <string>

#include "nn/module.h"

namespace accel::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true)
      : LayerNorm(Shape{dim}, eps, elementwise_affine, bias) {}
  // x: (..., *normalized_shape) -> same shape
  Tensor forward(const Tensor& x) override;
  // weight = 1, bias = 0.
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  Shape normalized_shape;
  double eps;
  Parameter weight, bias;  // normalized_shape; None without affine / bias
};

class RMSNorm : public Module {
 public:
  // eps = nullopt uses the machine epsilon of the input's dtype (PyTorch's default).
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);
  explicit RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true)
      : RMSNorm(Shape{dim}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  // weight = 1.
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  Shape normalized_shape;
  std::optional<double> eps;
  Parameter weight;
};

// torch.nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True): x (N, C, *) normalised
// over each group of C / num_groups channels (fused kernel); weight (C) = 1, bias (C) = 0.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t num_groups, num_channels;
  double eps;
  bool affine;
  Parameter weight, bias;  // (C) when affine
};

// torch.nn.InstanceNorm2d(num_features, eps=1e-5, momentum=0.1, affine=False,
// track_running_stats=False): x (N, C, H, W) or (C, H, W), each (n, c) plane normalised by its own
// statistics (group_norm with C groups) when training or not tracking; with
// track_running_stats, training updates running_mean / running_var (C) (unbiased variance,
// averaged over N) and evaluation normalises with them. weight / bias (C) = 1 / 0 when affine.
class InstanceNorm2d : public Module {
 public:
  explicit InstanceNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false);
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  void reset_running_stats();
  std::string extra_repr() const override;

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Parameter weight, bias;                                 // (C) when affine
  Buffer running_mean, running_var, num_batches_tracked;  // when track_running_stats
};

}  // namespace accel::nn
