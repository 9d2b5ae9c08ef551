#include "optim/adadelta.h"

#include "autograd/ops.h"

namespace accel::optim {

namespace {
AdadeltaOptions checked(const AdadeltaFields& o) {
  ACCEL_CHECK(o.rho >= 0 && o.rho <= 1, ValueError, "Adadelta", "invalid rho ", o.rho,
              " (expected [0, 1])");
  ACCEL_CHECK(o.eps >= 0, ValueError, "Adadelta", "invalid epsilon ", o.eps);
  return o;
}
}  // namespace

Adadelta::Adadelta(std::vector<Tensor> params, const AdadeltaFields& options)
    : Adadelta(std::vector<ParamGroup>{ParamGroup{std::move(params), {}, {}}}, options) {}

Adadelta::Adadelta(std::vector<ParamGroup> groups, const AdadeltaFields& options)
    : Optimizer("Adadelta", std::move(groups), options.lr, options.weight_decay),
      options_(checked(options)) {}

std::unique_ptr<Optimizer> Adadelta::rebuild(std::vector<ParamGroup> groups) const {
  AdadeltaFields o = options_;
  o.lr = default_lr_;
  o.weight_decay = default_weight_decay_;
  return std::make_unique<Adadelta>(rebuild_groups(typeid(Adadelta), std::move(groups)), o);
}

void Adadelta::step() {
  NoGradGuard no_grad;
  const double rho = options_.rho(), eps = options_.eps();
  for (Group& grp : groups_) {
    for (size_t k = 0; k < grp.params.size(); ++k) {
      Tensor& p = grp.params[k];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ACCEL_CHECK(grad.dtype() == p.dtype(), DTypeError, name_, "gradient dtype ", grad.dtype(),
                  " differs from parameter dtype ", p.dtype(), " (shape ", p.sizes(), ")");
      State& st = state_[grp.first_index + k];
      st.slots.resize(2);
      Tensor& square_avg = st.slots[0];
      Tensor& acc_delta = st.slots[1];
      if (!square_avg.defined()) square_avg = zeros_like(p);
      if (!acc_delta.defined()) acc_delta = zeros_like(p);
      ++st.step;
      const Tensor g = grp.weight_decay != 0 ? add(grad, p, grp.weight_decay) : grad;
      square_avg.mul_(rho).add_(g * g, 1.0 - rho);
      const Tensor std_dev = sqrt(square_avg + eps);
      Tensor delta = sqrt(acc_delta + eps);
      delta.div_(std_dev).mul_(g);
      acc_delta.mul_(rho).add_(delta * delta, 1.0 - rho);
      p.add_(delta, -grp.lr);
    }
  }
}

}  // namespace accel::optim
