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

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::Adagrad(params, optim::AdagradOptions(0.01).lr_decay(0.01))
//   optim::Adagrad(params, {.lr = 0.01, .lr_decay = 0.01})
struct AdagradFields {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

struct AdagradOptions : AdagradFields {
  using Fields = AdagradFields;
  AdagradOptions(double lr = 1e-2) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(AdagradOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(lr_decay)
  ACCEL_OPTION(weight_decay)
  ACCEL_OPTION(initial_accumulator_value)
  ACCEL_OPTION(eps)
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, const AdagradFields& options = {});
  Adagrad(std::vector<ParamGroup> groups, const AdagradFields& options = {});
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
