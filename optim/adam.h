// Adam and AdamW, PyTorch's updates (see kernels/stubs/optim.h for the formula). AdamW decays
// the weights directly (p *= 1 - lr * weight_decay), Adam adds weight_decay * p to the gradient.
// On the CPU the step is one fused pass per tensor (kernels/cpu/optim.cc); elsewhere, or with
// fused = false, it is written with framework ops.
#pragma once

#include <tuple>

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::AdamW(params, optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1))
//   optim::AdamW(params, {.lr = 3e-4, .betas = {0.9, 0.95}, .weight_decay = 0.1})
// betas is torch's (beta1, beta2): std::get<0>(o.betas()) is beta1.
struct AdamFields {
  double lr = 1e-3;
  std::tuple<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool fused = true;  // use the device's fused kernel when it has one
};

struct AdamOptions : AdamFields {
  using Fields = AdamFields;
  AdamOptions(double lr = 1e-3) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(AdamOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(betas)
  ACCEL_OPTION(eps)
  ACCEL_OPTION(weight_decay)
  ACCEL_OPTION(fused)
};

// AdamW's: the same fields, weight_decay 1e-2 by default (torch's).
struct AdamWFields {
  double lr = 1e-3;
  std::tuple<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool fused = true;
};

struct AdamWOptions : AdamWFields {
  using Fields = AdamWFields;
  AdamWOptions(double lr = 1e-3) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(AdamWOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(betas)
  ACCEL_OPTION(eps)
  ACCEL_OPTION(weight_decay)
  ACCEL_OPTION(fused)
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamFields& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamFields& options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(const char* name, std::vector<ParamGroup> groups, const AdamFields& options, bool decoupled);
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWFields& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWFields& options = {});
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
};

}  // namespace accel::optim
