// Stochastic gradient descent with momentum, dampening, Nesterov and L2 weight decay, with
// PyTorch's update:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
//   p -= lr * g
#pragma once

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::SGD(params, optim::SGDOptions(0.1).momentum(0.9).nesterov(true))
//   optim::SGD(params, {.lr = 0.1, .momentum = 0.9, .nesterov = true})
struct SGDFields {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct SGDOptions : SGDFields {
  using Fields = SGDFields;
  SGDOptions(double lr = 1e-3) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(SGDOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(momentum)
  ACCEL_OPTION(dampening)
  ACCEL_OPTION(weight_decay)
  ACCEL_OPTION(nesterov)
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDFields& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDFields& options = {});
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
