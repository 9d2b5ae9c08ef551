// Op cases: advanced indexing (index, index_put, masked_select, masked_scatter, take_along_dim,
// nonzero), sorting and sampling (sort, argsort, topk, multinomial). Index tensors are inputs
// (m.idx, m.mask) so that they land on the device under test.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

using namespace accel::indexing;

void add_indexing_cases(Table& t) {
  // ---- index (reading) ----
  // Repeated indices: the backward adds duplicates, in another order under a GPU's atomics.
  OpCase& rows =
      t.add("index", "x[idx], repeated indices",
            OP_INPUTS(m.rnd({4, 3}), m.idx({2, 0, 2, -1}, {4})), OP_FN(return index(x[0], {x[1]});))
          .grad_scale(8);
  // Bench rows index/ours and index_put/ours: 4096 random rows of a (4096, 1024) matrix; bytes
  // read and written (index_put: the copy of x, then values read and rows read and written).
  rows.bench("index", "4096x1024[4096 rows]",
             OP_INPUTS(m.rnd({4096, 1024}), m.rnd_idx(0, 4096, {4096})), 2.0 * 4096 * 1024 * 4,
             false, Tol{0, 0});
  t.add("index", "x[rows, labels]",
        OP_INPUTS(m.rnd({3, 4}), m.idx({0, 2, 2}, {3}), m.idx({1, 3, 0}, {3}, kInt32)),
        OP_FN(return index(x[0], {x[1], x[2]});));
  t.add("index", "x[i, :, j]: separated, result dims first",
        OP_INPUTS(m.rnd({2, 3, 4}), m.idx({0, 1, 1, 0}, {2, 2}), m.idx({3, 0, 2, 1}, {2, 2})),
        OP_FN(return index(x[0], {x[1], Slice(), x[2]});));
  t.add("index", "x[1:, None, ..., -1]: basic only (a view)", OP_INPUTS(m.rnd({3, 4, 5})),
        OP_FN(return index(x[0], {Slice(1, None), None, Ellipsis, -1});));
  t.add("index", "x[::2, idx, None, ...] on a transposed input",
        OP_INPUTS(m.rnd({4, 3, 5}), m.idx({2, -3, 1}, {3})),
        OP_FN(return index(x[0].transpose(0, 2), {Slice(None, None, 2), x[1], None, "..."});));
  t.add("index", "x[mask] over two dims",
        OP_INPUTS(m.rnd({2, 3, 4}), m.mask({1, 0, 1, 0, 1, 1}, {2, 3})),
        OP_FN(return index(x[0], {x[1]});));
  t.add("index", "x[:, mask, idx]: mask and index tensor broadcast",
        OP_INPUTS(m.rnd({2, 4, 3}), m.mask({0, 1, 1, 0}, {4}), m.idx({2, 0}, {2})),
        OP_FN(return index(x[0], {Slice(), x[1], x[2]});));
  t.add("index", "x[rows (3, 1), cols (1, 4)]",
        OP_INPUTS(m.rnd({5, 6}), m.idx({4, 0, 2}, {3, 1}), m.idx({5, 1, 1, 3}, {1, 4})),
        OP_FN(return index(x[0], {x[1], x[2]});))
      .grad_scale(8);
  t.add("index", "x[True, 1, False]-style bools and empty index",
        OP_INPUTS(m.rnd({2, 3}), m.idx({}, {0})),
        OP_FN(return add(sum(index(x[0], {true, 1})), sum(index(x[0], {x[1], false})));));
  t.add("index", "0-dim input: x[None, mask0]", OP_INPUTS(m.rnd({}), m.mask({1}, {})),
        OP_FN(return index(x[0], {None, x[1]});));

  // ---- index_put ----
  OpCase& acc = t.add("index_put", "accumulate, duplicate indices",
                      OP_INPUTS(m.rnd({4, 3}), m.rnd({3, 3}), m.idx({1, 3, 1}, {3})),
                      OP_FN(return index_put(x[0], {x[2]}, x[1], true);))
                    .tol_scale(8);
  acc.bench("index_put", "4096x1024[4096 rows, accumulate]",
            OP_INPUTS(m.rnd({4096, 1024}), m.rnd({4096, 1024}), m.rnd_idx(0, 4096, {4096})),
            5.0 * 4096 * 1024 * 4, false, Tol{1e-6, 1e-5});
  t.add("index_put", "x[rows, labels] = v, v broadcast",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({1}), m.idx({0, 2}, {2}), m.idx({1, 3}, {2})),
        OP_FN(return index_put(x[0], {x[2], x[3]}, x[1]);));
  t.add("index_put", "x[1:, idx] = v (basic steps first)",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({2, 2}), m.idx({0, -2}, {2})),
        OP_FN(return index_put(x[0], {Slice(1, None), x[2]}, x[1]);));
  t.add("index_put", "x[:, 1] += v (basic only)", OP_INPUTS(m.rnd({3, 4}), m.rnd({3})),
        OP_FN(return index_put(x[0], {Slice(), 1}, x[1], true);));
  t.add("index_put", "x[mask] = v",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({5}), m.mask({1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 1}, {3, 4})),
        OP_FN(return index_put(x[0], {x[2]}, x[1]);));
  t.add("index_put", "x[i, :, j] += v, separated",
        OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({2, 3}), m.idx({0, 1}, {2}), m.idx({3, 1}, {2})),
        OP_FN(return index_put(x[0], {x[2], Slice(), x[3]}, x[1], true);));
  // Integer and bool data move as bytes (index, assignment) and add as integers (accumulate).
  t.add("index ops", "integer dtypes: index, index_put, accumulate",
        OP_INPUTS(m.rnd_int({5, 4}, -9, 9), m.rnd_int({3, 4}, -9, 9), m.idx({4, 0, 4}, {3}),
                  m.idx({1, 2, 0}, {3})),
        OP_FN(return add(index_put(x[0], {x[2]}, x[1], true),
                         index_put(x[0], {x[3]}, index(x[0], {x[2]})));))
      .not_differentiable()
      .only({kInt32, kInt64});

  // In place on a non-leaf (x * 1: a leaf that requires grad refuses in-place writes), so that
  // gradcheck differentiates through the recorded in-place node (Note [in-place methods]).
  t.add("index_put_", "x[rows, labels] += v on a non-leaf",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({3}), m.idx({0, 2, 0}, {3}), m.idx({1, 3, 1}, {3})), OP_FN({
          Tensor y = mul(x[0], 1.0);
          y.index_put_({x[2], x[3]}, x[1], true);
          return mul(y, x[0]);
        }))
      .tol_scale(8);
  t.add("index_put_", "x[:, mask] = 0.5 through a view",
        OP_INPUTS(m.rnd({2, 3, 4}), m.mask({1, 0, 0, 1}, {4})), OP_FN({
          Tensor y = mul(x[0], 1.0);
          y.select(0, 1).index_put_({Slice(), x[1]}, 0.5);
          return mul(y, y);
        }));
  t.add("masked_scatter_", "on a non-leaf",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({8}), m.mask({0, 1, 1, 0}, {4})), OP_FN({
          Tensor y = mul(x[0], 1.0);
          y.masked_scatter_(x[2], x[1]);
          return mul(y, x[0]);
        }));

  // ---- masked_select, masked_scatter, take_along_dim, nonzero ----
  t.add("masked_select", "mask broadcast", OP_INPUTS(m.rnd({3, 4}), m.mask({1, 0, 1, 1}, {4})),
        OP_FN(return masked_select(x[0], x[1]);));
  t.add("masked_scatter", "source longer than the mask's count",
        OP_INPUTS(m.rnd({3, 4}), m.rnd({3, 5}), m.mask({0, 1, 1, 0}, {4})),
        OP_FN(return masked_scatter(x[0], x[2], x[1]);));
  t.add("take_along_dim", "dim 1, indices broadcast",
        OP_INPUTS(m.rnd({3, 4}), m.idx({3, 0}, {1, 2})),
        OP_FN(return take_along_dim(x[0], x[1], 1);));
  t.add("take_along_dim", "flattened", OP_INPUTS(m.rnd({3, 4}), m.idx({11, 0, 5, 5}, {4})),
        OP_FN(return take_along_dim(x[0], x[1]);))
      .grad_scale(8);
  t.add("nonzero", "zeros, -0.0 and NaN",
        OP_INPUTS(m.values({0, 1, -0.0, 2, NAN, 0, 0, 3}, {2, 4})), OP_FN(return nonzero(x[0]);))
      .not_differentiable()
      .only({kFloat32, kFloat64, kFloat16, kBFloat16});
  t.add("nonzero", "integer dtypes, (3, 40, 50)", OP_INPUTS(m.rnd_int({3, 40, 50}, -1, 1)),
        OP_FN(return nonzero(x[0]);))
      .not_differentiable()
      .only({kInt32, kInt64, kFloat32});

  // ---- sort, argsort, topk ----
  OpCase& srt = t.add("sort", "dim 1", OP_INPUTS(m.perm(12, {3, 4})),
                      OP_FN(return std::get<0>(sort(x[0], 1));));
  // Bench rows sort/ours (512 rows of 4096) and topk/ours (k = 2 of 32768): bytes read and written.
  srt.bench("sort", "512x4096", OP_INPUTS(m.rnd({512, 4096})), 512.0 * 4096 * (4 + 4 + 8), false,
            Tol{0, 0});
  t.add("sort", "dim 0, descending, non-contiguous", OP_INPUTS(m.perm(12, {4, 3})),
        OP_FN(return std::get<0>(sort(x[0].t(), 1, true));));
  t.add("sort", "indices: ties in input order, every dtype", OP_INPUTS(m.rnd_int({4, 9}, 0, 3)),
        OP_FN(return std::get<1>(sort(x[0], 1, false, true));))
      .not_differentiable()
      .only({kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64});
  t.add("sort", "NaN sorts last (first descending)",
        OP_INPUTS(m.values({1, NAN, -1, 2, NAN, 0}, {6})),
        OP_FN(return cat({std::get<1>(sort(x[0])), std::get<1>(sort(x[0], 0, true))});))
      .not_differentiable();
  t.add("argsort", "descending, (37, 300)", OP_INPUTS(m.perm(37 * 300, {37, 300})),
        OP_FN(return argsort(x[0], -1, true);))
      .not_differentiable()
      .only({kFloat32, kFloat64, kInt32, kInt64});
  t.add("sort", "rows of 2049 (padded to 4096 on CUDA)", OP_INPUTS(m.rnd({3, 2049})),
        OP_FN(return std::get<0>(sort(x[0]));))
      .no_gradcheck();
  OpCase& tk = t.add("topk", "largest, dim 1", OP_INPUTS(m.perm(15, {3, 5})),
                     OP_FN(return std::get<0>(topk(x[0], 2, 1));));
  tk.bench("topk", "64x32768[k=2]", OP_INPUTS(m.rnd({64, 32768})), 64.0 * 32768 * 4, false,
           Tol{0, 0});
  t.add("topk", "smallest, dim 0, 0-dim too", OP_INPUTS(m.perm(12, {4, 3}), m.rnd({})),
        OP_FN(return add(std::get<0>(topk(x[0], 3, 0, false)).sum(), std::get<0>(topk(x[1], 1)));));
  t.add("topk", "indices with ties", OP_INPUTS(m.rnd_int({3, 7}, 0, 2)),
        OP_FN(return std::get<1>(topk(x[0], 4));))
      .not_differentiable()
      .only({kFloat32, kInt32, kInt64});

  // ---- multinomial (same generator seed on every device: same draws) ----
  t.add("multinomial", "with replacement, unnormalised rows with zeros",
        OP_INPUTS(m.values({0, 2, 1, 0, 1, 5, 0, 0, 1, 1, 1, 1}, {3, 4})), OP_FN({
          Generator g(1234);
          return multinomial(x[0], 6, true, &g);
        }))
      .not_differentiable();
  t.add("multinomial", "without replacement", OP_INPUTS(m.rnd_pos({2, 6})), OP_FN({
          Generator g(99);
          return multinomial(x[0], 4, false, &g);
        }))
      .not_differentiable();
}

}  // namespace accel::optable::detail
