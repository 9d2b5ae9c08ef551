// Gradcheck samples: matmul (1-D, 2-D, batched with broadcast, transposed views), mm, bmm,
// linear, conv2d, max_pool2d, avg_pool2d.
#include "samples.h"

using namespace accel;
using accel::testing::rnd;

// ---- matmul family ----
GRAD_SAMPLE("matmul", "2-D", (rnd({3, 4}), rnd({4, 2})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "1-D dot", (rnd({4}), rnd({4})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "1-D @ 2-D", (rnd({3}), rnd({3, 2})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "3-D @ 1-D", (rnd({2, 3, 4}), rnd({4})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "1-D @ 3-D", (rnd({3}), rnd({2, 3, 2})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "batched broadcast (2,1,3,4) @ (3,4,2)", (rnd({2, 1, 3, 4}), rnd({3, 4, 2})),
            { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "3-D @ 2-D (weight shared over batch)", (rnd({2, 3, 4}), rnd({4, 5})),
            { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "2-D @ 3-D", (rnd({3, 4}), rnd({2, 4, 2})), { return matmul(x[0], x[1]); });
GRAD_SAMPLE("matmul", "transposed operands", (rnd({4, 3}), rnd({2, 4})),
            { return matmul(x[0].t(), x[1].t()); });
GRAD_SAMPLE("mm", "", (rnd({3, 5}), rnd({5, 2})), { return mm(x[0], x[1]); });
GRAD_SAMPLE("bmm", "", (rnd({2, 3, 4}), rnd({2, 4, 3})), { return bmm(x[0], x[1]); });
GRAD_SAMPLE("bmm", "transposed rhs", (rnd({2, 3, 4}), rnd({2, 3, 4})),
            { return bmm(x[0], x[1].transpose(1, 2)); });
GRAD_SAMPLE("linear", "with bias", (rnd({4, 3}), rnd({5, 3}), rnd({5})),
            { return linear(x[0], x[1], x[2]); });
GRAD_SAMPLE("linear", "no bias, 3-D input", (rnd({2, 3, 4}), rnd({2, 4})),
            { return linear(x[0], x[1]); });
GRAD_SAMPLE("linear", "1-D input", (rnd({3}), rnd({2, 3}), rnd({2})),
            { return linear(x[0], x[1], x[2]); });

// ---- convolution and pooling (float64: the direct reference kernels) ----
GRAD_SAMPLE("conv2d", "3x3, bias, padding 1", (rnd({2, 2, 5, 5}), rnd({3, 2, 3, 3}), rnd({3})), {
  return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});
});
GRAD_SAMPLE("conv2d", "stride 2, no bias, rectangular kernel",
            (rnd({1, 3, 6, 5}), rnd({2, 3, 3, 2})), {
              return conv2d(x[0], x[1], Tensor(), {2, 2}, {0, 1});
            });
GRAD_SAMPLE("conv2d", "dilation 2, groups 2", (rnd({1, 4, 6, 6}), rnd({4, 2, 2, 2}), rnd({4})), {
  return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}, {2, 2}, 2);
});
GRAD_SAMPLE("conv2d", "3-D input", (rnd({2, 4, 4}), rnd({2, 2, 3, 3})), {
  return conv2d(x[0], x[1], Tensor(), {1, 2});
});
GRAD_SAMPLE("max_pool2d", "2x2", (rnd({2, 2, 4, 4})), { return max_pool2d(x[0], {2, 2}); });
GRAD_SAMPLE("max_pool2d", "3x3 stride 2 padding 1 (overlapping)", (rnd({1, 2, 5, 5})), {
  return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});
});
GRAD_SAMPLE("avg_pool2d", "2x2", (rnd({2, 2, 4, 4})), { return avg_pool2d(x[0], {2, 2}); });
GRAD_SAMPLE("avg_pool2d", "3x3 padding 1, count_include_pad", (rnd({1, 2, 5, 4})), {
  return avg_pool2d(x[0], {3, 3}, {2, 1}, {1, 1}, true);
});
GRAD_SAMPLE("avg_pool2d", "3x3 padding 1, exclude pad", (rnd({1, 2, 5, 4})), {
  return avg_pool2d(x[0], {3, 3}, {2, 1}, {1, 1}, false);
});
