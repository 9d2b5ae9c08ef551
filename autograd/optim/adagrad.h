// Adagrad (Duchi et al. 2011), PyTorch's torch.optim.Adagrad(params, lr=1e-2, lr_decay=0,
// weight_decay=0, initial_accumulator_value=0, eps=1e-10) update (dense gradients), per element,
// at step t (1-based, per parameter):
//   g = grad + weight_decay * p
//   clr = lr / (1 + (t - 1) * lr_decay)
//   sum += g^2                      (sum starts at initial_accumulator_value)
//   p -= clr * g / (sqrt(sum) + eps)
// lr and weight_decay are per parameter group, the rest the optimizer's. Elementwise, so ZeRO
// shards its state (rebuild). The "sum" state appears with the first step (PyTorch creates it in
// the constructor with the same initial value: the trajectory is the same).
#pragma once

#include "autograd/optim/optimizer.h"

namespace accel::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  Adagrad(std::vector<ParamGroup> groups, AdagradOptions options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const AdagradOptions& options() const { return options_; }

 protected:
  std::vector<std::string> slot_names() const override { return {"sum"}; }

 private:
  AdagradOptions options_;
};

}  // namespace accel::optim
