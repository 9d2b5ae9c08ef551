// Adadelta (Zeiler 2012), PyTorch's torch.optim.Adadelta(params, lr=1.0, rho=0.9, eps=1e-6,
// weight_decay=0) update, per element:
//   g = grad + weight_decay * p
//   square_avg = rho * square_avg + (1 - rho) * g^2
//   delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
//   acc_delta = rho * acc_delta + (1 - rho) * delta^2
//   p -= lr * delta
// lr and weight_decay are per parameter group; rho and eps are the optimizer's. Elementwise, so
// ZeRO shards its state (rebuild).
#pragma once

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::Adadelta(params, optim::AdadeltaOptions(1.0).rho(0.95))
//   optim::Adadelta(params, {.lr = 1.0, .rho = 0.95})
struct AdadeltaFields {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0.0;
};

struct AdadeltaOptions : AdadeltaFields {
  using Fields = AdadeltaFields;
  AdadeltaOptions(double lr = 1.0) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(AdadeltaOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(rho)
  ACCEL_OPTION(eps)
  ACCEL_OPTION(weight_decay)
};

class Adadelta : public Optimizer {
 public:
  Adadelta(std::vector<Tensor> params, const AdadeltaFields& options = {});
  Adadelta(std::vector<ParamGroup> groups, const AdadeltaFields& options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const AdadeltaOptions& options() const { return options_; }

 protected:
  std::vector<std::string> slot_names() const override { return {"square_avg", "acc_delta"}; }

 private:
  AdadeltaOptions options_;
};

}  // namespace accel::optim
