// Differentiable collectives of tensor and sequence parallelism, and the vocabulary-parallel
// cross-entropy (parallel/tensor_parallel.h).
//
// Note [tp regions]
// Megatron-LM's conjugate pairs. A tensor-parallel region starts where a replicated activation
// meets sharded weights (copy_to: identity forward; each rank's backward holds only its shard's
// contribution to the input's gradient, so the backward all-reduces) and ends where the partial
// results are summed (reduce_from: all-reduce forward, and since every rank then holds the same
// output, the gradient of the sum is the incoming gradient on every rank: identity backward).
// gather / scatter are the same pair along a dimension. Under sequence parallelism the
// replicated activations between the regions are split along the sequence instead, so the entry
// becomes an all-gather along the sequence (whose backward sums every rank's gradient of the full
// sequence and keeps this rank's chunk: a reduce-scatter) and the exit a reduce-scatter (backward:
// all-gather). Each backward is written with the conjugate op, so a second derivative works too.
//
// Every rank of the group must run the same collectives in the same order, forward and backward.
// A backward that gets no gradient for an output (undefined) still enters its collective, with
// zeros, so that a rank whose graph did not reach the op cannot leave the others waiting.
#include <cmath>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "parallel/placement.h"
#include "parallel/tensor_parallel.h"

namespace accel::dist {

namespace {

bool trivial(const ProcessGroupPtr& g) { return !g || g->size() == 1; }

int64_t wrap_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.dim();
  ACCEL_CHECK(dim >= -n && dim < n, IndexError, op, "dim ", dim, " out of range for shape ",
              x.sizes());
  return dim < 0 ? dim + n : dim;
}

void check_input(const Tensor& x, const char* op) {
  ACCEL_CHECK(x.defined(), ValueError, op, "input is undefined");
}

// The gradient, or zeros of the output's shape when the output got none (see the Note).
Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DType dt, Device dev) {
  return g.defined() ? g : zeros(shape, TensorOptions(dt, dev));
}

// A contiguous copy the collectives may write in place.
Tensor fresh(const Tensor& x) {
  Tensor c = x.detach().contiguous();
  return c.data_ptr() == x.data_ptr() ? c.clone() : c;
}

// All-gather along `dim`: every rank's x (same shape) concatenated in rank order.
Tensor all_gather_dim(const Tensor& x, int64_t dim, ProcessGroup& g) {
  const int64_t p = g.size();
  const Tensor in = x.detach().contiguous();
  Shape buf_shape{p};
  for (int64_t s : in.sizes()) buf_shape.push_back(s);
  Tensor buf = empty(buf_shape, TensorOptions(in.dtype(), in.device()));
  g.all_gather(buf, in);
  if (dim == 0) {
    Shape out = in.sizes();
    out[0] *= p;
    return buf.reshape(out);
  }
  // (p, d0, ..., d_dim, ...) -> (d0, ..., p, d_dim, ...) -> (d0, ..., p * d_dim, ...)
  Shape perm;
  for (int64_t i = 1; i <= dim; ++i) perm.push_back(i);
  perm.push_back(0);
  for (int64_t i = dim + 1; i <= in.dim(); ++i) perm.push_back(i);
  Shape out = in.sizes();
  out[dim] *= p;
  return buf.permute(perm).contiguous().reshape(out);
}

void check_divisible(const Tensor& x, int64_t dim, int64_t p, const char* op) {
  ACCEL_CHECK(x.size(dim) % p == 0, ShapeError, op, "size ", x.size(dim), " of dim ", dim,
              " of shape ", x.sizes(), " is not divisible by the group size ", p,
              ": sequence parallelism needs the sequence length divisible by tp (uneven "
              "sequence chunks are not supported; parameters and features may be uneven)");
}

// Rank r's torch.chunk piece of `size` elements in whole units (Note [uneven tp shards]).
Chunk unit_chunk(int64_t size, int64_t unit, int64_t p, int64_t r, const char* op) {
  ACCEL_CHECK(unit >= 1 && size % unit == 0, ShapeError, op, "size ", size,
              " is not a whole number of units of ", unit);
  const Chunk c = shard_chunk(size / unit, p, r);
  return {c.begin * unit, c.length * unit};
}

// All-gather along `dim` of torch.chunk pieces of a dimension of `full` elements: each piece
// padded to the first (the largest) for the collective, the padding cut after (DTensor's way).
Tensor all_gather_uneven(const Tensor& x, int64_t dim, ProcessGroup& g, int64_t full, int64_t unit,
                         const char* op) {
  const int64_t p = g.size();
  const Chunk mine = unit_chunk(full, unit, p, g.rank(), op);
  ACCEL_CHECK(x.size(dim) == mine.length, ShapeError, op, "rank ", g.rank(), " of ", p, " holds ",
              x.size(dim), " of dim ", dim, " of shape ", x.sizes(), ", but its piece of ", full,
              " (units of ", unit, ") is ", mine.length);
  const int64_t c = unit_chunk(full, unit, p, 0, op).length;
  if (c * p == full) return all_gather_dim(x, dim, g);  // even: no padding
  Tensor in = x.detach();
  if (mine.length < c) {
    Shape pad = in.sizes();
    pad[size_t(dim)] = c - mine.length;
    in = cat({in, zeros(pad, TensorOptions(in.dtype(), in.device()))}, dim);
  }
  const Tensor all = all_gather_dim(in, dim, g);  // (..., p * c, ...)
  std::vector<Tensor> pieces;
  for (int64_t r = 0; r < p; ++r) {
    const int64_t n = unit_chunk(full, unit, p, r, op).length;
    if (n > 0) pieces.push_back(all.narrow(dim, r * c, n));
  }
  return cat(pieces, dim).contiguous();
}

// Reduce-scatter (sum) along `dim`: rank r gets chunk r of the sum over ranks.
Tensor reduce_scatter_dim(const Tensor& x, int64_t dim, ProcessGroup& g, const char* op) {
  const int64_t p = g.size();
  check_divisible(x, dim, p, op);
  const int64_t n = x.size(dim) / p;
  // (d0, ..., p * n, ...) -> (d0, ..., p, n, ...) -> (p, d0, ..., n, ...), contiguous
  Shape split;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i == dim) {
      split.push_back(p);
      split.push_back(n);
    } else {
      split.push_back(x.size(i));
    }
  }
  Shape perm{dim};
  for (int64_t i = 0; i <= x.dim(); ++i)
    if (i != dim) perm.push_back(i);
  const Tensor in = x.detach().reshape(split).permute(perm).contiguous();
  Shape out_shape = x.sizes();
  out_shape[dim] = n;
  Tensor out = empty(out_shape, TensorOptions(x.dtype(), x.device()));
  g.reduce_scatter(out, in);
  return out;
}

// This rank's torch.chunk piece along `dim`, a contiguous copy.
Tensor slice_dim(const Tensor& x, int64_t dim, ProcessGroup& g, int64_t unit, const char* op) {
  const Chunk c = unit_chunk(x.size(dim), unit, g.size(), g.rank(), op);
  return x.detach().narrow(dim, c.begin, c.length).contiguous().clone();
}

}  // namespace

Tensor copy_to_tp_region(const Tensor& x, const ProcessGroupPtr& group) {
  check_input(x, "copy_to_tp_region");
  if (trivial(group)) return x;
  Tensor out = x.detach();
  if (autograd::needs_grad(x)) {
    autograd::record("copy_to_tp_region", {&x}, {&out},
                     [group, s = x.sizes(), dt = x.dtype(),
                      dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
                       return {reduce_from_tp_region(grad_or_zeros(g[0], s, dt, dev), group)};
                     });
  }
  return out;
}

Tensor reduce_from_tp_region(const Tensor& x, const ProcessGroupPtr& group) {
  check_input(x, "reduce_from_tp_region");
  if (trivial(group)) return x;
  Tensor out = fresh(x);
  group->all_reduce(out);
  if (autograd::needs_grad(x)) {
    autograd::record("reduce_from_tp_region", {&x}, {&out},
                     [group, s = x.sizes(), dt = x.dtype(),
                      dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
                       return {copy_to_tp_region(grad_or_zeros(g[0], s, dt, dev), group)};
                     });
  }
  return out;
}

Tensor gather_from_tp_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group,
                             int64_t full_size, int64_t unit) {
  const char* op = "gather_from_tp_region";
  check_input(x, op);
  if (trivial(group)) return x;
  dim = wrap_dim(x, dim, op);
  const int64_t full = full_size < 0 ? x.size(dim) * group->size() : full_size;
  Tensor out = all_gather_uneven(x, dim, *group, full, unit, op);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [group, dim, unit, s = out.sizes(), dt = x.dtype(),
         dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
          return {scatter_to_tp_region(grad_or_zeros(g[0], s, dt, dev), dim, group, unit)};
        });
  }
  return out;
}

Tensor scatter_to_tp_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group,
                            int64_t unit) {
  const char* op = "scatter_to_tp_region";
  check_input(x, op);
  if (trivial(group)) return x;
  dim = wrap_dim(x, dim, op);
  Tensor out = slice_dim(x, dim, *group, unit, op);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [group, dim, unit, full = x.size(dim), s = out.sizes(), dt = x.dtype(),
         dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
          return {gather_from_tp_region(grad_or_zeros(g[0], s, dt, dev), dim, group, full, unit)};
        });
  }
  return out;
}

Tensor gather_from_sequence_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group) {
  const char* op = "gather_from_sequence_region";
  check_input(x, op);
  if (trivial(group)) return x;
  dim = wrap_dim(x, dim, op);
  Tensor out = all_gather_dim(x, dim, *group);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [group, dim, s = out.sizes(), dt = x.dtype(),
         dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
          return {reduce_scatter_to_sequence_region(grad_or_zeros(g[0], s, dt, dev), dim, group)};
        });
  }
  return out;
}

Tensor reduce_scatter_to_sequence_region(const Tensor& x, int64_t dim,
                                         const ProcessGroupPtr& group) {
  const char* op = "reduce_scatter_to_sequence_region";
  check_input(x, op);
  if (trivial(group)) return x;
  dim = wrap_dim(x, dim, op);
  Tensor out = reduce_scatter_dim(x, dim, *group, op);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&out},
        [group, dim, s = out.sizes(), dt = x.dtype(),
         dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
          return {gather_from_sequence_region(grad_or_zeros(g[0], s, dt, dev), dim, group)};
        });
  }
  return out;
}

// ---------------- vocabulary-parallel cross-entropy ----------------

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    const ProcessGroupPtr& group, int64_t ignore_index) {
  const char* op = "vocab_parallel_cross_entropy";
  ACCEL_CHECK(local_logits.defined() && targets.defined(), ValueError, op,
              "logits and targets must be defined");
  ACCEL_CHECK(
      local_logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == local_logits.size(0),
      ShapeError, op, "expected local logits (N, V/tp) and targets (N), got ", local_logits.sizes(),
      " and ", targets.sizes());
  ACCEL_CHECK(is_floating(local_logits.dtype()), DTypeError, op, "logits must be floating, got ",
              local_logits.dtype());
  ACCEL_CHECK(targets.dtype() == kInt64, DTypeError, op, "targets must be int64, got ",
              targets.dtype());
  const int64_t p = trivial(group) ? 1 : group->size();
  const int64_t rank = p == 1 ? 0 : group->rank();
  const int64_t vl = local_logits.size(1);
  int64_t v = vl, start = 0;
  if (p > 1) {  // the ranks' widths: uneven slices (Note [uneven tp shards]) start anywhere
    const TensorOptions o(kFloat64, local_logits.device());
    const Tensor mine = full({1}, double(vl), o);
    Tensor all = empty({p}, o);
    group->all_gather(all, mine);
    all = all.to(kCPU);
    const double* w = all.data<double>();
    v = 0;
    for (int64_t r = 0; r < p; ++r) {
      if (r == rank) start = v;
      v += int64_t(w[r]);
    }
  }
  const Tensor t = targets.detach();
  {
    const Tensor ok = logical_or(logical_and(t.ge(0), t.lt(v)), t.eq(ignore_index));
    ACCEL_CHECK(ok.to(kInt64).sum().item<int64_t>() == ok.numel(), IndexError, op,
                "a target is outside [0, ", v, ") and is not ignore_index (", ignore_index,
                "); vocabulary ", v, " over ", p, " ranks, this rank's ", vl, " columns from ",
                start);
  }
  const DType dt = local_logits.dtype();
  const Device dev = local_logits.device();
  Tensor e, s, onehot, valid_f;
  double count = 0;
  Tensor loss;
  {
    NoGradGuard no_grad;
    const Tensor z = local_logits.detach();
    Tensor m = fresh(amax(z, {1}));  // (N): the row maximum over the whole vocabulary
    if (p > 1) group->all_reduce(m, ReduceOp::Max);
    const Tensor shifted = z - m.unsqueeze(1);
    e = exp(shifted);        // (N, V/tp)
    s = fresh(sum(e, {1}));  // (N): sum of exponentials over the whole vocabulary
    if (p > 1) group->all_reduce(s);
    const Tensor in_range = logical_and(t.ge(start), t.lt(start + vl));
    const Tensor local_t = where(in_range, t - start, Scalar(int64_t(0)));
    onehot =
        logical_and(arange(vl, TensorOptions(kInt64, dev)).unsqueeze(0).eq(local_t.unsqueeze(1)),
                    in_range.unsqueeze(1))
            .to(dt);                                    // (N, V/tp)
    Tensor picked = fresh(sum(shifted * onehot, {1}));  // (N): target logit - max
    if (p > 1) group->all_reduce(picked);
    const Tensor valid = t.ne(ignore_index);
    valid_f = valid.to(dt);
    count = valid_f.sum().item<double>();
    loss = sum((log(s) - picked) * valid_f) / count;  // 0-dim; NaN when every target is ignored
  }
  if (autograd::needs_grad(local_logits)) {
    autograd::record(op, {&local_logits}, {&loss},
                     [e, s, onehot, valid_f, count](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor()};
                       // d loss / d z = (softmax(z) - onehot(target)) / count per valid row
                       const Tensor w = valid_f.unsqueeze(1) * (g[0] / count);
                       return {(e / s.unsqueeze(1) - onehot) * w};
                     });
  }
  return loss;
}

}  // namespace accel::dist
