// Gradcheck samples: cat, stack, tril, triu (split/chunk are views, checked through "slice").
#include "samples.h"

using namespace accel;
using accel::testing::rnd;

GRAD_SAMPLE("cat", "dim 0", (rnd({2, 3}), rnd({1, 3})), { return cat({x[0], x[1]}, 0); });
GRAD_SAMPLE("cat", "dim -1, three inputs", (rnd({2, 1}), rnd({2, 3}), rnd({2, 2})),
            { return cat({x[0], x[1], x[2]}, -1); });
GRAD_SAMPLE("stack", "dim 1", (rnd({2, 3}), rnd({2, 3})), { return stack({x[0], x[1]}, 1); });
GRAD_SAMPLE("stack", "new last dim", (rnd({3}), rnd({3}), rnd({3})),
            { return stack({x[0], x[1], x[2]}, -1); });
GRAD_SAMPLE("tril", "diagonal 0", (rnd({3, 4})), { return tril(x[0]); });
GRAD_SAMPLE("tril", "batched, diagonal -1", (rnd({2, 3, 3})), { return tril(x[0], -1); });
GRAD_SAMPLE("triu", "diagonal 1", (rnd({4, 3})), { return triu(x[0], 1); });
GRAD_SAMPLE("triu", "non-contiguous", (rnd({3, 4})), { return triu(x[0].t()); });
GRAD_SAMPLE("slice", "split pieces", (rnd({5, 2})), {
  std::vector<Tensor> p = split(x[0], 2, 0);
  return cat({mul(p[0], 2.0), p[2], p[1]}, 0);
});
GRAD_SAMPLE("slice", "chunk pieces", (rnd({2, 6})), {
  std::vector<Tensor> p = chunk(x[0], 3, 1);
  return mul(p[0], p[2]);
});
