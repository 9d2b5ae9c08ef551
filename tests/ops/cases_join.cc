// Op cases: cat, stack, tril, triu, split/chunk (views, checked through "slice").
#include "op_table.h"

namespace accel::optable::detail {

void add_join_cases(Table& t) {
  t.add("cat", "dim 0", OP_INPUTS(m.rnd({2, 3}), m.rnd({1, 3})),
        OP_FN(return cat({x[0], x[1]}, 0);));
  t.add("cat", "dim -1, three inputs", OP_INPUTS(m.rnd({2, 1}), m.rnd({2, 3}), m.rnd({2, 2})),
        OP_FN(return cat({x[0], x[1], x[2]}, -1);));
  t.add("stack", "dim 1", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 3})),
        OP_FN(return stack({x[0], x[1]}, 1);));
  t.add("stack", "new last dim", OP_INPUTS(m.rnd({3}), m.rnd({3}), m.rnd({3})),
        OP_FN(return stack({x[0], x[1], x[2]}, -1);));
  t.add("tril", "diagonal 0", OP_INPUTS(m.rnd({3, 4})), OP_FN(return tril(x[0]);));
  t.add("tril", "batched, diagonal -1", OP_INPUTS(m.rnd({2, 3, 3})), OP_FN(return tril(x[0], -1);));
  t.add("triu", "diagonal 1", OP_INPUTS(m.rnd({4, 3})), OP_FN(return triu(x[0], 1);));
  t.add("triu", "non-contiguous", OP_INPUTS(m.rnd({3, 4})), OP_FN(return triu(x[0].t());));
  t.add("triu", "batched (3, 7, 9), diagonal 3", OP_INPUTS(m.rnd({3, 7, 9})),
        OP_FN(return triu(x[0], 3);))
      .no_gradcheck();
  t.add("slice", "split pieces", OP_INPUTS(m.rnd({5, 2})), OP_FN({
          std::vector<Tensor> p = split(x[0], 2, 0);
          return cat({mul(p[0], 2.0), p[2], p[1]}, 0);
        }));
  t.add("slice", "chunk pieces", OP_INPUTS(m.rnd({2, 6})), OP_FN({
          std::vector<Tensor> p = chunk(x[0], 3, 1);
          return mul(p[0], p[2]);
        }));
  t.add("tril/triu", "integer dtypes", OP_INPUTS(m.rnd_int({3, 7, 9}, 0, 9)),
        OP_FN(return add(tril(x[0], -2), triu(x[0], 3));))
      .not_differentiable()
      .only({kInt32, kInt64});
  t.add("repeat", "(2, 3) by (2, 1, 2)", OP_INPUTS(m.rnd({2, 3})),
        OP_FN(return repeat(x[0], {2, 1, 2});));
  t.add("repeat", "non-contiguous, all ones (still a copy)", OP_INPUTS(m.rnd({3, 2})),
        OP_FN(return add(repeat(x[0].t(), {1, 1}), repeat(x[0], {3, 1}).narrow(0, 0, 3).t());));
}

}  // namespace accel::optable::detail
