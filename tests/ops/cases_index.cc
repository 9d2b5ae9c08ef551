// Op cases: embedding, index_select, gather, scatter_add, index_add.
#include "op_table.h"

namespace accel::optable::detail {

void add_index_cases(Table& t) {
  // Repeated indices: the backward adds duplicates, in another order under a GPU's atomics.
  t.add("embedding", "repeated indices",
        OP_INPUTS(m.rnd({5, 3}), m.idx({1, 3, 1, 0, 4, 1}, {2, 3})),
        OP_FN(return embedding(x[0], x[1]);))
      .grad_scale(8);
  t.add("embedding", "int32 indices", OP_INPUTS(m.rnd({4, 2}), m.idx({3, 3, 0}, {3}, kInt32)),
        OP_FN(return embedding(x[0], x[1]);));
  t.add("index_select", "dim 0, repeats", OP_INPUTS(m.rnd({4, 3}), m.idx({2, 0, 2}, {3})),
        OP_FN(return index_select(x[0], 0, x[1]);))
      .grad_scale(8);
  t.add("index_select", "dim 1", OP_INPUTS(m.rnd({2, 4, 3}), m.idx({3, 1}, {2})),
        OP_FN(return index_select(x[0], 1, x[1]);));
  t.add("gather", "dim 1", OP_INPUTS(m.rnd({3, 4}), m.idx({0, 3, 1, 1, 2, 0}, {3, 2})),
        OP_FN(return gather(x[0], 1, x[1]);));
  t.add("gather", "dim 0, smaller index",
        OP_INPUTS(m.rnd({3, 4}), m.idx({2, 0, 1, 1, 0, 2}, {2, 3})),
        OP_FN(return gather(x[0], 0, x[1]);));
  t.add("scatter_add", "dim 0, duplicates",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({2, 3}), m.idx({0, 2, 0, 0, 1, 0}, {2, 3})),
        OP_FN(return scatter_add(x[0], 0, x[2], x[1]);))
      .tol_scale(8);
  t.add("scatter_add", "dim 1, source larger than index",
        OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 4}), m.idx({2, 2, 0, 1}, {2, 2})),
        OP_FN(return scatter_add(x[0], 1, x[2], x[1]);));
  t.add("index_add", "dim 0, duplicates",
        OP_INPUTS(m.rnd({4, 3}), m.rnd({3, 3}), m.idx({1, 3, 1}, {3})),
        OP_FN(return index_add(x[0], 0, x[2], x[1]);))
      .tol_scale(8);
  t.add("index_add", "dim 1", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 2}), m.idx({2, 0}, {2})),
        OP_FN(return index_add(x[0], 1, x[2], x[1]);));

  // Larger, int32 indices, many duplicates (atomics on a GPU add them in another order).
  t.add("index_select", "int32, (50, 40, 6) dim 1, 77 indices",
        OP_INPUTS(m.rnd({50, 40, 6}), m.rnd_idx(0, 40, {77}, kInt32)),
        OP_FN(return index_select(x[0], 1, x[1]);))
      .no_gradcheck()
      .grad_scale(8);
  t.add("gather", "strided input, int32",
        OP_INPUTS(m.rnd({50, 40, 6}), m.rnd_idx(0, 6, {6, 40, 50}, kInt32)),
        OP_FN(return gather(x[0].transpose(0, 2), 0, x[1]);))
      .no_gradcheck()
      .grad_scale(8);
  t.add("scatter_add", "(50, 40, 6) dim 0",
        OP_INPUTS(m.rnd({50, 40, 6}), m.rnd({50, 40, 4}), m.rnd_idx(0, 50, {50, 40, 4})),
        OP_FN(return scatter_add(x[0], 0, x[2], x[1]);))
      .no_gradcheck()
      .tol_scale(8);
  t.add("index_add", "(50, 40, 6) dim 0, 77 indices",
        OP_INPUTS(m.rnd({50, 40, 6}), m.rnd({77, 40, 6}), m.rnd_idx(0, 50, {77})),
        OP_FN(return index_add(x[0], 0, x[2], x[1]);))
      .no_gradcheck()
      .tol_scale(8);
  t.add("index ops", "integer dtypes: index_select, gather, index_add, scatter_add",
        OP_INPUTS(m.rnd_int({9, 8}, 0, 9), m.rnd_int({5, 8}, 0, 9), m.rnd_idx(0, 9, {5}),
                  m.rnd_idx(0, 9, {5, 8})),
        OP_FN(return add(add(index_select(x[0], 0, x[2]), gather(x[0], 0, x[3])),
                         sum(add(index_add(x[0], 0, x[2], x[1]), scatter_add(x[0], 0, x[3], x[1])),
                             {0}, true));))
      .not_differentiable()
      .only({kInt32, kInt64});
}

}  // namespace accel::optable::detail
