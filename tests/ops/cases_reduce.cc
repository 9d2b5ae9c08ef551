// Op cases: reductions (sum, mean, amax/amin, max/min with indices, var, std, prod, norm, argmax).
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

void add_reduce_cases(Table& t) {
  t.add("sum", "all", OP_INPUTS(m.rnd({2, 3})), OP_FN(return sum(x[0]);));
  t.add("sum", "dims keepdim", OP_INPUTS(m.rnd({2, 3, 4})), OP_FN(return sum(x[0], {0, 2}, true);));
  t.add("mean", "dim", OP_INPUTS(m.rnd({2, 3, 4})), OP_FN(return mean(x[0], {1});));
  t.add("amax", "dim, unique max", OP_INPUTS(m.rnd({3, 4})), OP_FN(return amax(x[0], {1});));
  t.add("amax", "ties share the gradient", OP_INPUTS(m.rnd({3})),
        OP_FN(return amax(x[0].expand({2, 3}), {0});));
  t.add("amin", "all", OP_INPUTS(m.rnd({3, 4})), OP_FN(return amin(x[0]);));
  t.add("max_dim", "values", OP_INPUTS(m.rnd({3, 4})), OP_FN(return std::get<0>(max(x[0], 1));));
  t.add("max_dim", "keepdim", OP_INPUTS(m.rnd({3, 4})),
        OP_FN(return std::get<0>(max(x[0], 0, true));));
  t.add("min_dim", "values", OP_INPUTS(m.rnd({3, 4})), OP_FN(return std::get<0>(min(x[0], -1));));
  t.add("var", "unbiased dim", OP_INPUTS(m.rnd({3, 4})), OP_FN(return var(x[0], {1});));
  t.add("var", "population all", OP_INPUTS(m.rnd({5})), OP_FN(return var(x[0], {}, 0);));
  t.add("std_dev", "", OP_INPUTS(m.rnd({3, 4})), OP_FN(return std_dev(x[0], {0});));
  t.add("prod", "dim", OP_INPUTS(m.rnd({3, 4})), OP_FN(return prod(x[0], {1});));
  t.add("prod", "with a zero", OP_INPUTS(m.rnd({4}), m.values({1.0, 0.0, 1.0, 1.0}, {4})),
        OP_FN(return prod(mul(x[0], x[1]));));
  t.add("norm", "l2", OP_INPUTS(m.rnd({3, 4})), OP_FN(return norm(x[0]);));
  t.add("norm", "l3", OP_INPUTS(m.rnd({5})), OP_FN(return norm(x[0], 3.0);));
  // norm over dims (every p of torch.linalg.vector_norm); distinct |x| for the max/min norms.
  t.add("norm", "p=2 dim 1 keepdim", OP_INPUTS(m.rnd({3, 4})),
        OP_FN(return norm(x[0], 2.0, {1}, true);));
  t.add("norm", "p=1 dims (0, 2)",
        OP_INPUTS(m.rnd({2, 3, 2}, 0.1, 1.0),
                  m.values({1, -1, -1, 1, 1, 1, -1, -1, 1, -1, 1, 1}, {2, 3, 2})),
        OP_FN(return norm(mul(x[0], x[1]), 1.0, {0, 2});));
  t.add("norm", "p=inf and -inf", OP_INPUTS(m.perm(12, {3, 4})), OP_FN({
          Tensor y = add(x[0], 1.0);
          return add(norm(y, INFINITY, {1}), norm(neg(y), -INFINITY, {1}));
        }));
  t.add("norm", "p=0.5, p=1.5, p=3 dim 0", OP_INPUTS(m.rnd({3, 4}, 0.2, 1.0)), OP_FN({
          return add(add(norm(x[0], 0.5, {0}), norm(neg(x[0]), 1.5, {0})), norm(x[0], 3.0, {0}));
        }));
  t.add("norm", "p=0 counts nonzeros (zero gradient)", OP_INPUTS(m.rnd({3, 4}, 0.5, 1.0)),
        OP_FN(return norm(x[0], 0.0, {1});));
  t.add("norm", "\"fro\" over all, keepdim", OP_INPUTS(m.rnd({2, 3})),
        OP_FN(return norm(x[0], "fro", {}, true);));
  // A zero row: torch's subgradient 0 (p=2 would give 0/0 through sqrt's chain rule).
  t.add("norm", "zero norm: p=2 and p=1 give gradient 0",
        OP_INPUTS(m.values({0, 0, 0, 0.5, -1, 2}, {2, 3}, true)),
        OP_FN(return add(norm(x[0], 2.0, {1}), norm(x[0], 1.0, {1}));));
  t.add("norm", "(37, 513) rows, p=3", OP_INPUTS(m.rnd({37, 513})),
        OP_FN(return norm(x[0], 3.0, {1});))
      .no_gradcheck()
      .tol_scale(8);

  // Larger shapes for the cross-device runner: rows, columns, split rows, permuted dims. Sums
  // differ by accumulation order, so the bound grows with the number of terms.
  struct Big {
    const char* label;
    Shape shape, dims;
  };
  const Big bigs[] = {{"rows (37, 513)", {37, 513}, {1}},
                      {"columns (37, 513)", {37, 513}, {0}},
                      {"all (37, 513)", {37, 513}, {0, 1}},
                      {"inner dim (3, 40, 5)", {3, 40, 5}, {1}},
                      {"outer dims (3, 40, 5)", {3, 40, 5}, {0, 2}},
                      {"split rows (2, 100000)", {2, 100000}, {1}},
                      {"tall columns (50000, 3)", {50000, 3}, {0}}};
  for (const Big& b : bigs) {
    int64_t n = 1;
    for (int64_t d : b.dims) n *= b.shape[size_t(d)];
    const Shape shape = b.shape, dims = b.dims;
    OpCase& s = t.add(
                     "sum", b.label, [shape](Maker& m) { return In{m.rnd(shape)}; },
                     [dims](const In& x) { return sum(x[0], dims, true); })
                    .no_gradcheck()
                    .tol_scale(std::sqrt(double(n)) * 4);
    // Bench rows sum_dim0/sum_dim1 of a (4096, 1024) matrix (reads 4n bytes).
    if (shape.size() == 2 && dims.size() == 1 && shape[0] == 37) {
      s.bench("sum_dim" + std::to_string(dims[0]), "4096x1024", OP_INPUTS(m.rnd({4096, 1024})),
              4096.0 * 1024 * 4, false, Tol{1e-4, 1e-3});
    }
    t.add(
         "mean", b.label, [shape](Maker& m) { return In{m.rnd(shape)}; },
         [dims](const In& x) { return mean(x[0], dims); })
        .no_gradcheck()
        .tol_scale(4);
    t.add(
         "amax", b.label, [shape](Maker& m) { return In{m.rnd(shape)}; },
         [dims](const In& x) { return amax(x[0], dims); })
        .no_gradcheck();
    t.add(
         "amin", b.label, [shape](Maker& m) { return In{m.rnd(shape)}; },
         [dims](const In& x) { return amin(x[0], dims); })
        .no_gradcheck();
  }
  t.add("prod", "factors near 1, (37, 513) rows", OP_INPUTS(m.rnd({37, 513}, 0.999, 1.001)),
        OP_FN(return prod(x[0], {1});))
      .no_gradcheck()
      .tol_scale(16);

  // Not differentiable: indices of extremes (distinct values, exact in every dtype: no ties).
  t.add("argmax", "dim 1", OP_INPUTS(m.perm(180, {12, 15})), OP_FN(return argmax(x[0], 1);))
      .not_differentiable();
  t.add("argmin", "dim 0, keepdim", OP_INPUTS(m.perm(180, {12, 15})),
        OP_FN(return argmin(x[0], 0, true);))
      .not_differentiable();
  t.add("max_dim", "indices", OP_INPUTS(m.perm(180, {15, 12})),
        OP_FN(return std::get<1>(max(x[0], 1));))
      .not_differentiable();
  t.add("int reductions", "int32 sum (to int64) and mean (to float32)",
        OP_INPUTS(m.rnd_int({30, 1000}, -100, 100)),
        OP_FN(return add(sum(x[0], {1}).to(kFloat32), mean(x[0], {1}));))
      .not_differentiable()
      .only({kInt32, kInt64});
  t.add(
       "amax", "NaN propagates",
       [](Maker& m) {
         std::vector<int> nan_at(200, 0);
         nan_at[2 * 50 + 7] = 1;
         return In{m.rnd({4, 50}), m.mask(nan_at, {4, 50})};
       },
       OP_FN(return amax(masked_fill(x[0], x[1], NAN), {1});))
      .not_differentiable();
}

}  // namespace accel::optable::detail
