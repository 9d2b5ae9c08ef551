// Gradcheck samples: views, copies and conversions, reductions sum/mean.
#include <cmath>

#include "samples.h"

using namespace accel;
using accel::testing::rnd;

namespace {
Tensor round_to_grid(const Tensor& x) {
  NoGradGuard ng;
  std::vector<double> v = x.tolist();
  for (double& e : v) e = std::round(e * 1024) / 1024;
  return tensor(v, x.sizes());
}
}  // namespace

GRAD_SAMPLE("view", "", (rnd({2, 6})), { return x[0].view({3, -1}); });
GRAD_SAMPLE("reshape", "non-contiguous source", (rnd({3, 4})),
            { return x[0].t().reshape({12}); });
GRAD_SAMPLE("transpose", "", (rnd({2, 3, 4})), { return x[0].transpose(0, 2); });
GRAD_SAMPLE("permute", "", (rnd({2, 3, 4})), { return x[0].permute({1, 2, 0}); });
GRAD_SAMPLE("slice", "step 2", (rnd({5, 3})), { return x[0].slice(0, 1, 5, 2); });
GRAD_SAMPLE("slice", "narrow", (rnd({4, 5})), { return x[0].narrow(1, 1, 3); });
GRAD_SAMPLE("select", "", (rnd({3, 4})), { return x[0].select(1, -1); });
GRAD_SAMPLE("expand", "", (rnd({3, 1})), { return x[0].expand({2, 3, 4}); });
GRAD_SAMPLE("squeeze", "", (rnd({3, 1, 2})), { return x[0].squeeze(); });
GRAD_SAMPLE("unsqueeze", "", (rnd({3, 2})), { return x[0].unsqueeze(1); });
GRAD_SAMPLE("contiguous", "", (rnd({3, 2})), { return x[0].t().contiguous(); });
GRAD_SAMPLE("clone", "", (rnd({3, 2})), { return x[0].clone(); });
// Note [gradcheck through float32]: a float32 intermediate cannot resolve a 1e-6 step, so this
// sample uses inputs on a 2^-10 grid and a step of 2^-10: x +- eps is exact in float32 and the
// central difference of this piecewise-linear function is exact too.
GRAD_SAMPLE("to_dtype", "f64 -> f32 -> f64",
            (round_to_grid(testing::rnd({4})).requires_grad_()),
            { return mul(x[0].to(kFloat32), 2.0).to(kFloat64); });
static testing::GradSampleEps to_dtype_eps(1.0 / 1024);
GRAD_SAMPLE("sum", "all", (rnd({2, 3})), { return sum(x[0]); });
GRAD_SAMPLE("sum", "dims keepdim", (rnd({2, 3, 4})), { return sum(x[0], {0, 2}, true); });
GRAD_SAMPLE("mean", "dim", (rnd({2, 3, 4})), { return mean(x[0], {1}); });
GRAD_SAMPLE("amax", "dim, unique max", (rnd({3, 4})), { return amax(x[0], {1}); });
GRAD_SAMPLE("amax", "ties share the gradient", (rnd({3})), {
  return amax(x[0].expand({2, 3}), {0});
});
GRAD_SAMPLE("amin", "all", (rnd({3, 4})), { return amin(x[0]); });
GRAD_SAMPLE("max_dim", "values", (rnd({3, 4})), { return std::get<0>(max(x[0], 1)); });
GRAD_SAMPLE("max_dim", "keepdim", (rnd({3, 4})), { return std::get<0>(max(x[0], 0, true)); });
GRAD_SAMPLE("min_dim", "values", (rnd({3, 4})), { return std::get<0>(min(x[0], -1)); });
GRAD_SAMPLE("var", "unbiased dim", (rnd({3, 4})), { return var(x[0], {1}); });
GRAD_SAMPLE("var", "population all", (rnd({5})), { return var(x[0], {}, 0); });
GRAD_SAMPLE("std_dev", "", (rnd({3, 4})), { return std_dev(x[0], {0}); });
GRAD_SAMPLE("prod", "dim", (rnd({3, 4})), { return prod(x[0], {1}); });
GRAD_SAMPLE("prod", "with a zero", (rnd({4})), {
  return prod(mul(x[0], tensor(std::vector<double>{1.0, 0.0, 1.0, 1.0}, {4})));
});
GRAD_SAMPLE("norm", "l2", (rnd({3, 4})), { return norm(x[0]); });
GRAD_SAMPLE("norm", "l3", (rnd({5})), { return norm(x[0], 3.0); });
