#include "optim/rmsprop.h"

#include "autograd/ops.h"

namespace accel::optim {

namespace {
RMSpropOptions checked(const RMSpropFields& o) {
  ACCEL_CHECK(o.alpha >= 0, ValueError, "RMSprop", "invalid alpha ", o.alpha);
  ACCEL_CHECK(o.eps >= 0, ValueError, "RMSprop", "invalid epsilon ", o.eps);
  ACCEL_CHECK(o.momentum >= 0, ValueError, "RMSprop", "invalid momentum ", o.momentum);
  return o;
}
}  // namespace

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropFields& options)
    : RMSprop(std::vector<ParamGroup>{ParamGroup{std::move(params), {}, {}}}, options) {}

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropFields& options)
    : Optimizer("RMSprop", std::move(groups), options.lr, options.weight_decay),
      options_(checked(options)) {}

std::unique_ptr<Optimizer> RMSprop::rebuild(std::vector<ParamGroup> groups) const {
  RMSpropFields o = options_;
  o.lr = default_lr_;
  o.weight_decay = default_weight_decay_;
  return std::make_unique<RMSprop>(rebuild_groups(typeid(RMSprop), std::move(groups)), o);
}

void RMSprop::step() {
  NoGradGuard no_grad;
  const double alpha = options_.alpha(), mom = options_.momentum();
  for (Group& grp : groups_) {
    for (size_t k = 0; k < grp.params.size(); ++k) {
      Tensor& p = grp.params[k];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ACCEL_CHECK(grad.dtype() == p.dtype(), DTypeError, name_, "gradient dtype ", grad.dtype(),
                  " differs from parameter dtype ", p.dtype(), " (shape ", p.sizes(), ")");
      State& st = state_[grp.first_index + k];
      st.slots.resize(3);
      Tensor& square_avg = st.slots[0];
      Tensor& buf = st.slots[1];
      Tensor& grad_avg = st.slots[2];
      if (!square_avg.defined()) square_avg = zeros_like(p);
      if (mom > 0 && !buf.defined()) buf = zeros_like(p);
      if (options_.centered() && !grad_avg.defined()) grad_avg = zeros_like(p);
      ++st.step;
      const Tensor g = grp.weight_decay != 0 ? add(grad, p, grp.weight_decay) : grad;
      square_avg.mul_(alpha).add_(g * g, 1.0 - alpha);
      Tensor avg;
      if (options_.centered()) {
        grad_avg.mul_(alpha).add_(g, 1.0 - alpha);
        avg = sqrt(square_avg - grad_avg * grad_avg);
      } else {
        avg = sqrt(square_avg);
      }
      avg.add_(options_.eps());
      if (mom > 0) {
        buf.mul_(mom).add_(g / avg);
        p.add_(buf, -grp.lr);
      } else {
        p.add_(g / avg, -grp.lr);
      }
    }
  }
}

}  // namespace accel::optim
