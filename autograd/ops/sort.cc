// Sorting and sampling: sort, argsort, topk (one kernel: the sorted first k of each row) and
// multinomial.
//   sort:  x (..., n, ...), dim -> values, indices (x's shape)
//   topk:  x (..., n, ...), k   -> values, indices (x's shape with dim of size k)
//   multinomial: probs (n) | (R, n) -> (s) | (R, s) int64
// The kernels see (rows, n) with the sorted dim last and contiguous (kernels/stubs/sort.h).
#include <cmath>

#include "autograd/ops/common.h"
#include "core/raw.h"
#include "kernels/stubs/sort.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(sort, "sort");
ACCEL_DIFFERENTIABLE_OP(topk, "topk");

namespace {

// The first k of each row along dim, in sorted order, for x of rank >= 1: (values, indices),
// values recording the backward (a scatter of the gradient to where each value came from).
std::tuple<Tensor, Tensor> sorted_prefix(const char* op, const Tensor& x, int64_t d, int64_t k,
                                         bool descending) {
  const int64_t nd = x.dim();
  Shape perm, inv(size_t(nd), 0);
  for (int64_t i = 0; i < nd; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  for (int64_t i = 0; i < nd; ++i) inv[size_t(perm[size_t(i)])] = i;
  Tensor xt = raw::contiguous(raw::permute(x.detach(), perm));
  const int64_t n = x.sizes()[size_t(d)];
  const int64_t rows = n == 0 ? shape_numel(xt.sizes()) : xt.numel() / n;
  Shape tshape = xt.sizes();
  tshape.back() = k;
  Tensor vals = ops::empty_on(tshape, x.dtype(), x.device());
  Tensor idx = ops::empty_on(tshape, kInt64, x.device());
  if (rows > 0 && k > 0) {
    Tensor x2 = ops::make_view(xt, {rows, n}, {n, 1}, xt.offset());
    Tensor v2 = ops::make_view(vals, {rows, k}, {k, 1}, 0);
    Tensor i2 = ops::make_view(idx, {rows, k}, {k, 1}, 0);
    sort_stub(x.device(), x2, k, descending, v2, i2);
  }
  // Back to x's dim order; contiguous, as torch's results are.
  Tensor values = raw::contiguous(raw::permute(vals, inv));
  Tensor indices = raw::contiguous(raw::permute(idx, inv));
  if (autograd::needs_grad(x)) {
    // A copy of the indices: the caller gets `indices` and may write it in place.
    autograd::record(
        op, {&x}, {&values},
        [indices = indices.clone(), d, xs = x.sizes()](const autograd::Grads& g) {
          // Each index appears once per row: scatter_add is a scatter here.
          return autograd::Grads{
              scatter_add(zeros(xs, TensorOptions(g[0].dtype(), g[0].device())), d, indices, g[0])};
        });
  }
  return {values, indices};
}

}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  (void)stable;  // the kernels are stable (kernels/stubs/sort.h)
  ops::check_defined(x, "sort");
  if (x.dim() == 0) {
    auto [v, i] = sort(x.reshape({1}), 0, descending, stable);
    return {v.reshape({}), i.reshape({})};
  }
  const int64_t d = wrap_dim(dim, x.dim(), "sort");
  return sorted_prefix("sort", x, d, x.sizes()[size_t(d)], descending);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  NoGradGuard no_grad;
  ops::check_defined(x, "argsort");
  return std::get<1>(sort(x, dim, descending, stable));
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest,
                                bool sorted) {
  (void)sorted;  // always sorted: the first k of the sort order
  ops::check_defined(x, "topk");
  if (x.dim() == 0) {
    auto [v, i] = topk(x.reshape({1}), k, 0, largest, sorted);
    return {v.reshape({}), i.reshape({})};
  }
  const int64_t d = wrap_dim(dim, x.dim(), "topk");
  const int64_t n = x.sizes()[size_t(d)];
  ACCEL_CHECK(k >= 0 && k <= n, ValueError, "topk", "k = ", k, " is out of range for dim ", d,
              " of size ", n, " (shape ", x.sizes(), ")");
  return sorted_prefix("topk", x, d, k, largest);
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator* gen) {
  const char* op = "multinomial";
  ops::check_defined(probs, op, "probs");
  ops::check_floating(probs, op, "probs");
  ACCEL_CHECK(probs.dim() == 1 || probs.dim() == 2, ShapeError, op,
              "probs must be 1-D or 2-D, got shape ", probs.sizes());
  const int64_t n = probs.sizes().back();
  const int64_t rows = probs.dim() == 1 ? 1 : probs.sizes()[0];
  ACCEL_CHECK(n > 0, ShapeError, op, "probs of shape ", probs.sizes(), " has no categories");
  ACCEL_CHECK(num_samples > 0, ValueError, op, "num_samples must be positive, got ", num_samples);
  ACCEL_CHECK(replacement || num_samples <= n, ValueError, op, "cannot draw ", num_samples,
              " samples without replacement from ", n, " categories");
  NoGradGuard no_grad;
  Tensor p = ops::as_dtype(probs.detach(), kFloat64).reshape({rows, n});
  // The distribution checks (one synchronising read on a device), each naming the first bad row.
  auto first_row = [&](const Tensor& bad_rows) {
    return argmax(bad_rows.to(kInt32)).item<int64_t>();
  };
  Tensor bad = logical_or(logical_or(lt(p, 0.0), ne(p, p)), eq(abs(p), INFINITY));
  Tensor bad_rows = gt(sum(bad.to(kInt32), {1}), 0);
  Tensor total = sum(p, {1});
  Tensor zero_rows = le(total, 0.0);
  Tensor positive = sum(gt(p, 0.0).to(kInt32), {1});
  Tensor few_rows = lt(positive, Scalar(replacement ? int64_t(1) : num_samples));
  const Tensor flags =
      stack({sum(bad_rows.to(kInt32)), sum(zero_rows.to(kInt32)), sum(few_rows.to(kInt32))})
          .to(kCPU);
  const std::vector<int64_t> f = flags.to_vector<int64_t>();
  if (f[0] > 0) {
    ACCEL_THROW(ValueError, op, "probability tensor contains inf, nan or an element < 0 (row ",
                first_row(bad_rows), " of shape ", probs.sizes(), ")");
  }
  if (f[1] > 0) {
    ACCEL_THROW(ValueError, op, "invalid distribution: the probabilities of row ",
                first_row(zero_rows), " sum to <= 0 (shape ", probs.sizes(), ")");
  }
  if (f[2] > 0) {
    const int64_t r = first_row(few_rows);
    ACCEL_THROW(ValueError, op, "row ", r, " has ", positive.select(0, r).item<int64_t>(),
                " categories of nonzero probability, fewer than the ", num_samples,
                " samples drawn without replacement (shape ", probs.sizes(), ")");
  }
  Tensor out;
  if (replacement) {
    Tensor u =
        raw::to_device(rand({rows, num_samples}, TensorOptions(kFloat64), gen), probs.device());
    out = ops::empty_on({rows, num_samples}, kInt64, probs.device());
    multinomial_stub(probs.device(), raw::contiguous(probs.detach()).reshape({rows, n}), u, out);
  } else {
    // Note [sampling without replacement]: with E_i ~ Exp(1), the categories in increasing order
    // of E_i / p_i are draws without replacement with probabilities proportional to p (each
    // minimum is category i with probability p_i / sum p). log(1 - u) = -E, so the largest
    // keys log(1 - u) / p are the first draws; zero-probability categories get -inf and are
    // never among them (checked above: enough positive categories).
    Tensor u = raw::to_device(rand({rows, n}, TensorOptions(kFloat64), gen), probs.device());
    Tensor keys = where(gt(p, 0.0), div(log(rsub(u, 1.0)), p), -INFINITY);
    out = std::get<1>(topk(keys, num_samples, 1, true, true));
  }
  return probs.dim() == 1 ? out.reshape({num_samples}) : out;
}

}  // namespace accel
