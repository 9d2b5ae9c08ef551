// LayerNorm and RMSNorm over the trailing `normalized_shape` dims (fused ops of
// autograd/ops.h). Weight starts at 1, bias at 0.
#pragma once

#include <optional>
#include <string>

#include "autograd/nn/module.h"

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
  Tensor weight, bias;  // normalized_shape; undefined without affine / bias
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
  Tensor weight;
};

}  // namespace accel::nn
