// Indexing ops: embedding (and embedding_renorm_), index_select, gather, scatter_add, index_add.
//   embedding:    weight (V, D), indices (...)            -> (..., D)
//   index_select: x (..., n, ...), index (k)              -> x with dim size k
//   gather:       x, index (same rank, index.size(d) <= x.size(d) for d != dim) -> index's shape
//   scatter_add:  x, index, src (index.size(d) <= src.size(d); <= x.size(d) for d != dim) -> x's
//   shape index_add:    x, index (k), src (x with dim size k)   -> x's shape
// Index values are checked by the kernels (IndexError naming the op, the index and the size).
#include "autograd/ops/common.h"
#include "core/raw.h"
#include "kernels/stubs/index.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(embedding, "embedding");
ACCEL_DIFFERENTIABLE_OP(index_select, "index_select");
ACCEL_DIFFERENTIABLE_OP(gather, "gather");
ACCEL_DIFFERENTIABLE_OP(scatter_add, "scatter_add");
ACCEL_DIFFERENTIABLE_OP(index_add, "index_add");

namespace {

Tensor contiguous_data(const Tensor& t) { return t.is_contiguous() ? t : t.detach().contiguous(); }

void check_index_tensor(const char* op, const Tensor& index, const Tensor& x) {
  ops::check_defined(index, op, "index");
  ACCEL_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, DTypeError, op,
              "index must be int64 or int32, got ", index.dtype(), " of shape ", index.sizes());
  ops::check_same_device(x, index, op);
}

// index_select / index_add take a 1-D (or 0-dim) index.
void check_vector_index(const char* op, const Tensor& index) {
  ACCEL_CHECK(index.dim() <= 1, ShapeError, op, "index must be 1-D, got shape ", index.sizes());
}

// dim wrapped against x's rank, with a 0-dim x treated as rank 1 (as PyTorch does).
int64_t index_dim(const char* op, const Tensor& x, int64_t dim) {
  return wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op);
}

Tensor zeros_as(const Shape& s, const Tensor& like) {
  return zeros(s, TensorOptions(like.dtype(), like.device()));
}

// x with dimension `dim` resized to k (x.dim() >= 1).
Shape with_dim_size(const Shape& s, int64_t dim, int64_t k) {
  Shape r = s;
  if (!r.empty()) r[size_t(dim)] = k;
  return r;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  const char* op = "embedding";
  ops::check_defined(weight, op, "weight");
  ACCEL_CHECK(weight.dim() == 2, ShapeError, op, "weight must be (num_embeddings, dim), got shape ",
              weight.sizes());
  check_index_tensor(op, indices, weight);
  const int64_t d = weight.sizes()[1];
  // torch's padding_idx: a negative one counts from the end; its row gets no gradient.
  int64_t pad = -1;
  if (padding_idx) {
    const int64_t v = weight.sizes()[0];
    ACCEL_CHECK(*padding_idx >= -v && *padding_idx < v, ValueError, op, "padding_idx ",
                *padding_idx, " must be within num_embeddings (weight of shape ", weight.sizes(),
                ")");
    pad = *padding_idx < 0 ? *padding_idx + v : *padding_idx;
  }
  Tensor idx = contiguous_data(indices);
  Tensor flat = ops::make_view(idx, {idx.numel()}, {1}, idx.offset());
  Tensor w = contiguous_data(weight);
  Shape out_shape = indices.sizes();
  out_shape.push_back(d);
  Tensor out = ops::empty_on(out_shape, weight.dtype(), weight.device());
  index_select_stub(weight.device(), w, 0, flat, out, op);
  if (autograd::needs_grad(weight)) {
    // dW = zeros (V, D) with each row of g added at its index (repeated indices accumulate).
    autograd::record(
        op, {&weight}, {&out},
        [fs = autograd::save_input(flat, 1), ws = weight.sizes(), d,
         pad](const autograd::Grads& g) {
          const Tensor flat = fs.unpack();
          Tensor gw = zeros_as(ws, g[0]);
          if (autograd::creating_graph()) {  // the differentiable index_add (Note [double
                                             // backward])
            Tensor rows = g[0].reshape({flat.numel(), d});
            // The padding row gets no gradient here either.
            if (pad >= 0) rows = masked_fill(rows, flat.eq(Scalar(pad)).unsqueeze(1), 0.0);
            return autograd::Grads{index_add(gw, 0, flat, rows)};
          }
          Tensor g2 = ops::as_dtype(g[0], gw.dtype()).contiguous();
          Tensor src = ops::make_view(g2, {flat.numel(), d}, {d, 1}, g2.offset());
          index_add_stub(gw.device(), gw, 0, flat, src, "embedding_backward");
          if (pad >= 0) {  // the padding row's gradient is zero (its uses summed, then dropped)
            Tensor row = ops::make_view(gw, {d}, {1}, gw.offset() + pad * d);
            raw::fill_(row, 0);
          }
          return autograd::Grads{gw};
        });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx,
                 std::optional<double> max_norm, double norm_type) {
  if (max_norm) embedding_renorm_(weight, indices, *max_norm, norm_type);
  return embedding(weight, indices, padding_idx);
}

// torch.embedding_renorm_: each row of weight that indices reach, with a norm above max_norm, is
// scaled in place to max_norm / (norm + 1e-7), without recording history (torch runs it under
// no_grad). A row reached several times gets the same value at each write.
Tensor embedding_renorm_(const Tensor& weight, const Tensor& indices, double max_norm,
                         double norm_type) {
  const char* op = "embedding_renorm_";
  ops::check_defined(weight, op, "weight");
  ACCEL_CHECK(weight.dim() == 2, ShapeError, op, "weight must be (num_embeddings, dim), got shape ",
              weight.sizes());
  check_index_tensor(op, indices, weight);
  ACCEL_CHECK(max_norm >= 0, ValueError, op, "max_norm must be >= 0, got ", max_norm);
  ops::check_floating(weight, op, "weight");
  if (indices.numel() == 0) return weight;
  NoGradGuard no_grad;
  Tensor flat = indices.reshape({-1});
  Tensor rows = index_select(weight, 0, flat);  // (K, D)
  Tensor norms = norm(rows, norm_type, {1}, true);
  Tensor scale = where(gt(norms, Scalar(max_norm)), rdiv(add(norms, 1e-7), Scalar(max_norm)), 1.0);
  Tensor w = weight;  // the caller's impl, written in place
  w.index_put_({flat}, mul(rows, scale));
  return weight;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  ops::check_defined(x, op);
  check_index_tensor(op, index, x);
  check_vector_index(op, index);
  const int64_t d = index_dim(op, x, dim);
  Tensor idx = contiguous_data(index);
  const Shape out_shape = x.dim() == 0 ? index.sizes() : with_dim_size(x.sizes(), d, index.numel());
  Tensor out = ops::empty_on(out_shape, x.dtype(), x.device());
  index_select_stub(x.device(), contiguous_data(x), d, idx, out, op);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [is = autograd::save_input(idx, 1), d, xs = x.sizes()](const autograd::Grads& g) {
          return autograd::Grads{index_add(zeros_as(xs, g[0]), d, is.unpack(), g[0])};
        });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_add";
  ops::check_defined(x, op);
  ops::check_defined(src, op, "source");
  check_index_tensor(op, index, x);
  check_vector_index(op, index);
  ops::check_same_device(x, src, op);
  ACCEL_CHECK(src.dtype() == x.dtype(), DTypeError, op, "source dtype ", src.dtype(),
              " differs from input dtype ", x.dtype(), " (shapes ", src.sizes(), " and ", x.sizes(),
              ")");
  const int64_t d = index_dim(op, x, dim);
  const Shape expect = x.dim() == 0 ? index.sizes() : with_dim_size(x.sizes(), d, index.numel());
  ACCEL_CHECK(src.sizes() == expect || (x.dim() == 0 && src.numel() == 1 && index.numel() == 1),
              ShapeError, op, "source of shape ", src.sizes(), " does not match input of shape ",
              x.sizes(), " with dim ", d, " of size ", index.numel(), " (expected ", expect, ")");
  Tensor idx = contiguous_data(index);
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  copy_stub(x.device(), out, x);
  index_add_stub(x.device(), out, d, idx, contiguous_data(src), op);
  if (autograd::needs_grad(x, src)) {
    const bool gs = src.requires_grad();
    autograd::record(op, {&x, &src}, {&out},
                     [is = gs ? autograd::save_input(idx, 1) : autograd::SavedTensor(), d,
                      ss = src.sizes()](const autograd::Grads& g) {
                       Tensor gsrc =
                           is.defined() ? index_select(g[0], d, is.unpack()).reshape(ss) : Tensor();
                       return autograd::Grads{g[0], gsrc};
                     });
  }
  return out;
}

namespace {
// gather/scatter index: same rank as x (0-dim x and index are treated as rank 1).
void check_gather_shapes(const char* op, const Tensor& x, const Tensor& index, int64_t d,
                         const Tensor* src) {
  ACCEL_CHECK(index.dim() == x.dim(), ShapeError, op, "index of shape ", index.sizes(),
              " must have the same number of dims as the input of shape ", x.sizes());
  for (int64_t i = 0; i < x.dim(); ++i) {
    const int64_t k = index.sizes()[size_t(i)];
    ACCEL_CHECK(i == d || k <= x.sizes()[size_t(i)], ShapeError, op, "index of shape ",
                index.sizes(), " is larger than the input of shape ", x.sizes(), " in dim ", i,
                " (only dim ", d, " may differ)");
    if (src) {
      ACCEL_CHECK(k <= src->sizes()[size_t(i)], ShapeError, op, "index of shape ", index.sizes(),
                  " is larger than the source of shape ", src->sizes(), " in dim ", i);
    }
  }
}

// 0-dim operands become (1) for the kernels, whose index walk needs a rank >= 1.
Tensor at_least_1d(const Tensor& t) {
  return t.dim() == 0 ? ops::make_view(t, {1}, {1}, t.offset()) : t;
}
}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  ops::check_defined(x, op);
  check_index_tensor(op, index, x);
  const int64_t d = index_dim(op, x, dim);
  check_gather_shapes(op, x, index, d, nullptr);
  Tensor idx = contiguous_data(index);
  Tensor out = ops::empty_on(index.sizes(), x.dtype(), x.device());
  Tensor out1 = at_least_1d(out);
  gather_stub(x.device(), at_least_1d(x), d, at_least_1d(idx), out1, op);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [is = autograd::save_input(idx, 1), d, xs = x.sizes()](const autograd::Grads& g) {
          return autograd::Grads{scatter_add(zeros_as(xs, g[0]), d, is.unpack(), g[0])};
        });
  }
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  ops::check_defined(x, op);
  ops::check_defined(src, op, "source");
  check_index_tensor(op, index, x);
  ops::check_same_device(x, src, op);
  ACCEL_CHECK(src.dtype() == x.dtype(), DTypeError, op, "source dtype ", src.dtype(),
              " differs from input dtype ", x.dtype(), " (shapes ", src.sizes(), " and ", x.sizes(),
              ")");
  ACCEL_CHECK(src.dim() == x.dim(), ShapeError, op, "source of shape ", src.sizes(),
              " must have the same number of dims as the input of shape ", x.sizes());
  const int64_t d = index_dim(op, x, dim);
  check_gather_shapes(op, x, index, d, &src);
  Tensor idx = contiguous_data(index);
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  copy_stub(x.device(), out, x);
  Tensor out1 = at_least_1d(out);
  scatter_add_stub(x.device(), out1, d, at_least_1d(idx), at_least_1d(src.detach()), op);
  if (autograd::needs_grad(x, src)) {
    const bool gs = src.requires_grad();
    autograd::record(op, {&x, &src}, {&out},
                     [is = gs ? autograd::save_input(idx, 1) : autograd::SavedTensor(), d, gs,
                      ss = src.sizes()](const autograd::Grads& g) {
                       Tensor gsrc;
                       if (gs) {
                         const Tensor& idx = is.unpack();
                         // Elements of src outside index's extent were never read: zero grad.
                         Tensor got = gather(g[0], d, idx);
                         if (got.sizes() == ss) {
                           gsrc = got;
                         } else {
                           gsrc = zeros_as(ss, g[0]);
                           Tensor view = gsrc;
                           for (int64_t i = 0; i < idx.dim(); ++i)
                             view = view.narrow(i, 0, idx.sizes()[size_t(i)]);
                           view.copy_(got);
                         }
                       }
                       return autograd::Grads{g[0], gsrc};
                     });
  }
  return out;
}

}  // namespace accel
