// Op cases: conv2d, max_pool2d, avg_pool2d.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

void add_conv_cases(Table& t) {
  OpCase& c3 = t.add("conv2d", "3x3, bias, padding 1",
                     OP_INPUTS(m.rnd({2, 2, 5, 5}), m.rnd({3, 2, 3, 3}), m.rnd({3})),
                     OP_FN(return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});))
                   .tol_scale(4);
  // Bench rows conv2d/ours/<name>_NxCxHxW_Cout: the mnist convnet's two layers, 3x3 padding 1.
  struct ConvShape {
    const char* name;
    int64_t n, cin, h, w, cout;
  };
  const ConvShape conv_shapes[] = {{"conv1", 128, 1, 28, 28, 32}, {"conv2", 128, 32, 14, 14, 64}};
  for (const ConvShape& s : conv_shapes) {
    c3.bench(
        "conv2d",
        std::string(s.name) + "_" + dims_str({s.n, s.cin, s.h, s.w}) + "_" + std::to_string(s.cout),
        [s](Maker& m) {
          return In{m.rnd({s.n, s.cin, s.h, s.w}), m.rnd({s.cout, s.cin, 3, 3}), m.rnd({s.cout})};
        },
        2.0 * double(s.n * s.cout * s.h * s.w) * double(s.cin * 9), true, Tol{1e-4, 1e-4});
  }
  t.add("conv2d", "stride 2, no bias, rectangular kernel",
        OP_INPUTS(m.rnd({1, 3, 6, 5}), m.rnd({2, 3, 3, 2})),
        OP_FN(return conv2d(x[0], x[1], Tensor(), {2, 2}, {0, 1});))
      .tol_scale(4);
  t.add("conv2d", "dilation 2, groups 2",
        OP_INPUTS(m.rnd({1, 4, 6, 6}), m.rnd({4, 2, 2, 2}), m.rnd({4})),
        OP_FN(return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}, {2, 2}, 2);))
      .tol_scale(4);
  t.add("conv2d", "3-D input", OP_INPUTS(m.rnd({2, 4, 4}), m.rnd({2, 2, 3, 3})),
        OP_FN(return conv2d(x[0], x[1], Tensor(), {1, 2});))
      .tol_scale(4);
  t.add("conv2d", "3x3 (4, 3, 17, 15) -> 8 channels",
        OP_INPUTS(m.rnd({4, 3, 17, 15}), m.rnd({8, 3, 3, 3}), m.rnd({8})),
        OP_FN(return conv2d(x[0], x[1], x[2]);))
      .no_gradcheck()
      .tol_scale(std::sqrt(27.0))
      // dx sums Cout*3*3 = 72 terms, dw and db the 4*17*15 output positions.
      .grad_scales({std::sqrt(72.0 / 27), 2 * std::sqrt(4.0 * 17 * 15 / 27),
                    2 * std::sqrt(4.0 * 17 * 15 / 27)});
  // Distinct values (a permutation, exact in every dtype): no ties, so every device picks the
  // same maximum and the gradient lands on the same element.
  t.add("max_pool2d", "2x2", OP_INPUTS(m.perm(64, {2, 2, 4, 4})),
        OP_FN(return max_pool2d(x[0], {2, 2});));
  t.add("max_pool2d", "3x3 stride 2 padding 1 (overlapping)", OP_INPUTS(m.perm(50, {1, 2, 5, 5})),
        OP_FN(return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});));
  t.add("max_pool2d", "3x3 stride 2 ceil_mode (a window over the end)",
        OP_INPUTS(m.perm(64, {1, 1, 8, 8})),
        OP_FN(return max_pool2d(x[0], {3, 3}, {2, 2}, {0, 0}, {1, 1}, true);));
  t.add("avg_pool2d", "2x2", OP_INPUTS(m.rnd({2, 2, 4, 4})),
        OP_FN(return avg_pool2d(x[0], {2, 2});));
  t.add("avg_pool2d", "3x3 padding 1, count_include_pad", OP_INPUTS(m.rnd({1, 2, 5, 4})),
        OP_FN(return avg_pool2d(x[0], {3, 3}, {2, 1}, {1, 1}, true);));
  t.add("avg_pool2d", "3x3 padding 1, exclude pad", OP_INPUTS(m.rnd({1, 2, 5, 4})),
        OP_FN(return avg_pool2d(x[0], {3, 3}, {2, 1}, {1, 1}, false);));
}

}  // namespace accel::optable::detail
