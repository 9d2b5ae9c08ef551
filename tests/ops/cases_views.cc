// Op cases: views, copies and conversions.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

void add_views_cases(Table& t) {
  t.add("view", "", OP_INPUTS(m.rnd({2, 6})), OP_FN(return x[0].view({3, -1});));
  t.add("reshape", "non-contiguous source", OP_INPUTS(m.rnd({3, 4})),
        OP_FN(return x[0].t().reshape({12});));
  t.add("transpose", "", OP_INPUTS(m.rnd({2, 3, 4})), OP_FN(return x[0].transpose(0, 2);));
  t.add("permute", "", OP_INPUTS(m.rnd({2, 3, 4})), OP_FN(return x[0].permute({1, 2, 0});));
  t.add("slice", "step 2", OP_INPUTS(m.rnd({5, 3})), OP_FN(return x[0].slice(0, 1, 5, 2);));
  t.add("slice", "narrow", OP_INPUTS(m.rnd({4, 5})), OP_FN(return x[0].narrow(1, 1, 3);));
  t.add("select", "", OP_INPUTS(m.rnd({3, 4})), OP_FN(return x[0].select(1, -1);));
  t.add("expand", "", OP_INPUTS(m.rnd({3, 1})), OP_FN(return x[0].expand({2, 3, 4});));
  t.add("squeeze", "", OP_INPUTS(m.rnd({3, 1, 2})), OP_FN(return x[0].squeeze();));
  t.add("unsqueeze", "", OP_INPUTS(m.rnd({3, 2})), OP_FN(return x[0].unsqueeze(1);));
  t.add("contiguous", "", OP_INPUTS(m.rnd({3, 2})), OP_FN(return x[0].t().contiguous();));
  t.add("clone", "", OP_INPUTS(m.rnd({3, 2})), OP_FN(return x[0].clone();));
  // Note [gradcheck through float32]: a float32 intermediate cannot resolve a 1e-6 step, so this
  // case uses inputs on a 2^-10 grid and a step of 2^-10: x +- eps is exact in float32 and the
  // central difference of this piecewise-linear function is exact too.
  t.add(
       "to_dtype", "f64 -> f32 -> f64",
       [](Maker& m) {
         std::vector<double> v =
             uniform({4}, -1.0, 1.0, TensorOptions(kFloat64), &m.gen()).to_vector<double>();
         for (double& e : v) e = std::round(e * 1024) / 1024;
         return In{m.values(v, {4}, /*grad=*/true)};
       },
       OP_FN(return mul(x[0].to(kFloat32), 2.0).to(kFloat64);))
      .eps(1.0 / 1024);
}

}  // namespace accel::optable::detail
