// RMSprop (Hinton's lecture 6e; centered: Graves 2013), PyTorch's torch.optim.RMSprop(params,
// lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False) update, per element:
//   g = grad + weight_decay * p
//   square_avg = alpha * square_avg + (1 - alpha) * g^2
//   centered:  grad_avg = alpha * grad_avg + (1 - alpha) * g
//              avg = sqrt(square_avg - grad_avg^2) + eps
//   otherwise: avg = sqrt(square_avg) + eps
//   momentum > 0: buf = momentum * buf + g / avg;  p -= lr * buf
//   otherwise:    p -= lr * g / avg
// State slots: square_avg; momentum_buffer (momentum > 0); grad_avg (centered). lr and
// weight_decay are per parameter group, the rest the optimizer's. Elementwise, so ZeRO shards
// its state (rebuild).
#pragma once

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::RMSprop(params, optim::RMSpropOptions(1e-3).momentum(0.9).centered(true))
//   optim::RMSprop(params, {.lr = 1e-3, .momentum = 0.9, .centered = true})
struct RMSpropFields {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
};

struct RMSpropOptions : RMSpropFields {
  using Fields = RMSpropFields;
  RMSpropOptions(double lr = 1e-2) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(RMSpropOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(alpha)
  ACCEL_OPTION(eps)
  ACCEL_OPTION(weight_decay)
  ACCEL_OPTION(momentum)
  ACCEL_OPTION(centered)
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, const RMSpropFields& options = {});
  RMSprop(std::vector<ParamGroup> groups, const RMSpropFields& options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const RMSpropOptions& options() const { return options_; }

 protected:
  std::vector<std::string> slot_names() const override {
    return {"square_avg", "momentum_buffer", "grad_avg"};
  }

 private:
  RMSpropOptions options_;
};

}  // namespace accel::optim
