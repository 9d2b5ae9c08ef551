#include "optim/adam.h"

#include <cmath>

#include "autograd/ops.h"
#include "kernels/stubs/optim.h"

namespace accel::optim {

namespace {

AdamOptions checked(const char* name, const AdamFields& o) {
  const auto [beta1, beta2] = o.betas;
  ACCEL_CHECK(o.eps >= 0, ValueError, name, "invalid epsilon ", o.eps);
  ACCEL_CHECK(beta1 >= 0 && beta1 < 1, ValueError, name,
              "invalid beta parameter at index 0: ", beta1, " (expected [0, 1))");
  ACCEL_CHECK(beta2 >= 0 && beta2 < 1, ValueError, name,
              "invalid beta parameter at index 1: ", beta2, " (expected [0, 1))");
  return o;
}

AdamFields from_adamw(const AdamWFields& o) {
  return AdamFields{o.lr, o.betas, o.eps, o.weight_decay, o.fused};
}

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  return {ParamGroup{std::move(params), {}, {}}};
}

// The same update as the fused kernel, with framework ops (any device, any strides).
void adam_step_ops(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, const AdamStepParams& hp) {
  Tensor g = grad;
  if (hp.decoupled) {
    if (hp.weight_decay != 0) p.mul_(1.0 - hp.lr * hp.weight_decay);
  } else if (hp.weight_decay != 0) {
    g = add(grad, p, hp.weight_decay);
  }
  m.mul_(hp.beta1).add_(g, 1.0 - hp.beta1);
  v.mul_(hp.beta2).add_(g * g, 1.0 - hp.beta2);
  const Tensor denom = sqrt(v) * (1.0 / std::sqrt(hp.bias_correction2)) + hp.eps;
  p.add_(m / denom, -hp.lr / hp.bias_correction1);
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamFields& options)
    : Adam("Adam", one_group(std::move(params)), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamFields& options)
    : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(const char* name, std::vector<ParamGroup> groups, const AdamFields& options,
           bool decoupled)
    : Optimizer(name, std::move(groups), options.lr, options.weight_decay),
      options_(checked(name, options)),
      decoupled_(decoupled) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWFields& options)
    : Adam("AdamW", one_group(std::move(params)), from_adamw(options), true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWFields& options)
    : Adam("AdamW", std::move(groups), from_adamw(options), true) {}

std::unique_ptr<Optimizer> Adam::rebuild(std::vector<ParamGroup> groups) const {
  AdamFields o = options_;
  o.lr = default_lr_;
  o.weight_decay = default_weight_decay_;
  return std::make_unique<Adam>(rebuild_groups(typeid(Adam), std::move(groups)), o);
}

std::unique_ptr<Optimizer> AdamW::rebuild(std::vector<ParamGroup> groups) const {
  const AdamOptions& a = options();
  const AdamWFields o{default_lr_, a.betas(), a.eps(), default_weight_decay_, a.fused()};
  return std::make_unique<AdamW>(rebuild_groups(typeid(AdamW), std::move(groups)), o);
}

void Adam::step() {
  NoGradGuard no_grad;
  AdamStepParams hp;
  std::tie(hp.beta1, hp.beta2) = options_.betas();
  hp.eps = options_.eps();
  hp.decoupled = decoupled_;
  for (Group& grp : groups_) {
    hp.lr = grp.lr;
    hp.weight_decay = grp.weight_decay;
    for (size_t k = 0; k < grp.params.size(); ++k) {
      Tensor& p = grp.params[k];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ACCEL_CHECK(grad.dtype() == p.dtype(), DTypeError, name_, "gradient dtype ", grad.dtype(),
                  " differs from parameter dtype ", p.dtype(), " (shape ", p.sizes(), ")");
      State& st = state_[grp.first_index + k];
      st.slots.resize(2);
      if (!st.slots[0].defined()) st.slots[0] = zeros_like(p);
      if (!st.slots[1].defined()) st.slots[1] = zeros_like(p);
      ++st.step;
      hp.bias_correction1 = 1.0 - std::pow(hp.beta1, double(st.step));
      hp.bias_correction2 = 1.0 - std::pow(hp.beta2, double(st.step));
      Tensor& m = st.slots[0];
      Tensor& v = st.slots[1];
      const bool fusable = options_.fused() && adamw_stub.has(p.device().type) &&
                           p.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
                           m.dtype() == p.dtype() && v.dtype() == p.dtype();
      if (fusable) {
        if (!grad.is_contiguous()) grad = grad.contiguous();
        adamw_stub(p.device(), p, grad, m, v, hp);
        p.storage()->bump_version();
      } else {
        adam_step_ops(p, grad, m, v, hp);
      }
    }
  }
}

}  // namespace accel::optim
