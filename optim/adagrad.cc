#include "optim/adagrad.h"

#include "autograd/ops.h"

namespace accel::optim {

namespace {
AdagradOptions checked(const AdagradFields& o) {
  ACCEL_CHECK(o.lr_decay >= 0, ValueError, "Adagrad", "invalid lr_decay ", o.lr_decay);
  ACCEL_CHECK(o.initial_accumulator_value >= 0, ValueError, "Adagrad",
              "invalid initial_accumulator_value ", o.initial_accumulator_value);
  ACCEL_CHECK(o.eps >= 0, ValueError, "Adagrad", "invalid epsilon ", o.eps);
  return o;
}
}  // namespace

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradFields& options)
    : Adagrad(std::vector<ParamGroup>{ParamGroup{std::move(params), {}, {}}}, options) {}

Adagrad::Adagrad(std::vector<ParamGroup> groups, const AdagradFields& options)
    : Optimizer("Adagrad", std::move(groups), options.lr, options.weight_decay),
      options_(checked(options)) {}

std::unique_ptr<Optimizer> Adagrad::rebuild(std::vector<ParamGroup> groups) const {
  AdagradFields o = options_;
  o.lr = default_lr_;
  o.weight_decay = default_weight_decay_;
  return std::make_unique<Adagrad>(rebuild_groups(typeid(Adagrad), std::move(groups)), o);
}

void Adagrad::step() {
  NoGradGuard no_grad;
  for (Group& grp : groups_) {
    for (size_t k = 0; k < grp.params.size(); ++k) {
      Tensor& p = grp.params[k];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ACCEL_CHECK(grad.dtype() == p.dtype(), DTypeError, name_, "gradient dtype ", grad.dtype(),
                  " differs from parameter dtype ", p.dtype(), " (shape ", p.sizes(), ")");
      State& st = state_[grp.first_index + k];
      st.slots.resize(1);
      Tensor& sum = st.slots[0];
      if (!sum.defined()) sum = full_like(p, options_.initial_accumulator_value());
      ++st.step;
      const Tensor g = grp.weight_decay != 0 ? add(grad, p, grp.weight_decay) : grad;
      const double clr = grp.lr / (1.0 + double(st.step - 1) * options_.lr_decay());
      sum.add_(g * g);
      Tensor std_dev = sqrt(sum);
      std_dev.add_(options_.eps());
      p.add_(g / std_dev, -clr);
    }
  }
}

}  // namespace accel::optim
