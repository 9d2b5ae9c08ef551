// Stochastic gradient descent with momentum, dampening, Nesterov and L2 weight decay, with
// PyTorch's update:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
//   p -= lr * g
#pragma once

#include "autograd/optim/optimizer.h"

namespace accel::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const SGDOptions& options() const { return options_; }

 protected:
  std::vector<std::string> slot_names() const override { return {"momentum_buffer"}; }

 private:
  SGDOptions options_;
};

}  // namespace accel::optim
