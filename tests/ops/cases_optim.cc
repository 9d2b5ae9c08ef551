// Op cases: the fused Adam/AdamW step (optimizer kernels are reached through the optimizers).
#include <cmath>

#include "op_table.h"
#include "optim/adam.h"

namespace accel::optable::detail {

namespace {
// Three steps on a copy of x[0] with gradients x[1], x[2], x[3]; the result is the parameter.
template <class Opt, class Options>
Tensor three_steps(const In& x, Options o) {
  Tensor p = x[0].detach().clone().requires_grad_(true);
  Opt opt({p}, o);
  for (int i = 1; i <= 3; ++i) {
    p.set_grad(x[size_t(i)]);
    opt.step();
  }
  return p.detach();
}
}  // namespace

void add_optim_cases(Table& t) {
  t.add("adamw_step", "3 steps, weight decay 0.1",
        OP_INPUTS(m.rnd_const({1000, 7}), m.rnd_const({1000, 7}), m.rnd_const({1000, 7}),
                  m.rnd_const({1000, 7})),
        OP_FN({
          optim::AdamWOptions o;
          o.lr(1e-2);
          o.weight_decay(0.1);
          return three_steps<optim::AdamW>(x, o);
        }))
      .not_differentiable()
      .tol_scale(4);
  t.add("adam_step", "3 steps, L2 weight decay 0.1",
        OP_INPUTS(m.rnd_const({1000, 7}), m.rnd_const({1000, 7}), m.rnd_const({1000, 7}),
                  m.rnd_const({1000, 7})),
        OP_FN({
          optim::AdamOptions o;
          o.lr(1e-2);
          o.weight_decay(0.1);
          return three_steps<optim::Adam>(x, o);
        }))
      .not_differentiable()
      .tol_scale(4);
}

}  // namespace accel::optable::detail
