#include "optim/sgd.h"

#include "autograd/ops.h"

namespace accel::optim {

namespace {
SGDOptions checked(const SGDFields& o) {
  ACCEL_CHECK(o.momentum >= 0, ValueError, "SGD", "invalid momentum ", o.momentum);
  ACCEL_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), ValueError, "SGD",
              "Nesterov momentum requires a momentum > 0 and zero dampening (momentum ", o.momentum,
              ", dampening ", o.dampening, ")");
  return o;
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDFields& options)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), {}, {}}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDFields& options)
    : Optimizer("SGD", std::move(groups), options.lr, options.weight_decay),
      options_(checked(options)) {}

std::unique_ptr<Optimizer> SGD::rebuild(std::vector<ParamGroup> groups) const {
  SGDFields o = options_;
  o.lr = default_lr_;
  o.weight_decay = default_weight_decay_;
  return std::make_unique<SGD>(rebuild_groups(typeid(SGD), std::move(groups)), o);
}

void SGD::step() {
  NoGradGuard no_grad;
  const double mom = options_.momentum();
  for (Group& grp : groups_) {
    for (size_t k = 0; k < grp.params.size(); ++k) {
      Tensor& p = grp.params[k];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      State& st = state_[grp.first_index + k];
      st.slots.resize(1);
      Tensor d = grad;
      if (grp.weight_decay != 0) d = add(grad, p, grp.weight_decay);
      if (mom != 0) {
        Tensor& buf = st.slots[0];
        if (!buf.defined()) {
          buf = d.clone();
        } else {
          buf.mul_(mom).add_(d, 1.0 - options_.dampening());
        }
        d = options_.nesterov() ? add(d, buf, mom) : buf;
      }
      p.add_(d, -grp.lr);
      ++st.step;
    }
  }
}

}  // namespace accel::optim
