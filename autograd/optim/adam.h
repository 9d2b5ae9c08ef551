// Adam and AdamW, PyTorch's updates (see kernels/stubs/optim.h for the formula). AdamW decays
// the weights directly (p *= 1 - lr * weight_decay), Adam adds weight_decay * p to the gradient.
// On the CPU the step is one fused pass per tensor (kernels/cpu/optim.cc); elsewhere, or with
// fused = false, it is written with framework ops.
#pragma once

#include "autograd/optim/optimizer.h"

namespace accel::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool fused = true;  // use the device's fused kernel when it has one
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool fused = true;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});
  using Optimizer::step;  // step(closure)
  void step() override;
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(const char* name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled);
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
};

}  // namespace accel::optim
