// Joining and splitting: cat, stack, split, chunk, tril, triu.
//   cat:   xs[i]: (a, k_i, b) along dim -> (a, sum k_i, b); backward: slices of g
//   stack: xs[i]: s -> s with a new dim of size len(xs) at dim; backward: selects of g
//   split/chunk: narrow views of x (differentiable through the view ops, no node of their own)
//   tril/triu: x (..., R, C) -> same shape, entries outside the band zeroed
//   repeat: x (s0..sk) tiled (r0..rm), m >= k -> (r0, .., r_{m-k} * s0, .., rm * sk)
#include "autograd/ops/common.h"
#include "kernels/stubs/index.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(cat, "cat");
ACCEL_DIFFERENTIABLE_OP(stack, "stack");
ACCEL_DIFFERENTIABLE_OP(tril, "tril");
ACCEL_DIFFERENTIABLE_OP(triu, "triu");
ACCEL_DIFFERENTIABLE_OP(repeat, "repeat");

namespace {

// Every tensor defined, same dtype and device as the first.
void check_join_list(const char* op, const std::vector<Tensor>& xs) {
  ACCEL_CHECK(!xs.empty(), ValueError, op, "expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) {
    ACCEL_CHECK(xs[i].defined(), ValueError, op, "tensor ", i, " of the list is undefined");
    ACCEL_CHECK(xs[i].dtype() == xs[0].dtype(), DTypeError, op, "tensor ", i, " has dtype ",
                xs[i].dtype(), " and shape ", xs[i].sizes(), " but tensor 0 has dtype ",
                xs[0].dtype(), " and shape ", xs[0].sizes());
    ACCEL_CHECK(xs[i].device() == xs[0].device(), DeviceError, op, "tensor ", i, " is on ",
                xs[i].device(), " (shape ", xs[i].sizes(), ") but tensor 0 is on ", xs[0].device(),
                " (shape ", xs[0].sizes(), ")");
  }
}

// The part of `out` that input i fills: out narrowed along d (a view, no autograd).
Tensor narrow_view(const Tensor& out, int64_t d, int64_t start, int64_t len) {
  Shape sz = out.sizes();
  sz[size_t(d)] = len;
  return ops::make_view(out, std::move(sz), out.strides(),
                        out.offset() + start * out.strides()[size_t(d)]);
}

Tensor select_view(const Tensor& out, int64_t d, int64_t i) {
  Shape sz = out.sizes(), st = out.strides();
  sz.erase(size_t(d));
  st.erase(size_t(d));
  return ops::make_view(out, std::move(sz), std::move(st),
                        out.offset() + i * out.strides()[size_t(d)]);
}

Tensor trilu(const char* op, const Tensor& x, int64_t diagonal, bool upper) {
  ops::check_defined(x, op);
  ACCEL_CHECK(x.dim() >= 2, ShapeError, op, "expected a tensor with at least 2 dims, got shape ",
              x.sizes());
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  trilu_stub(x.device(), x.is_contiguous() ? x : x.detach().contiguous(), diagonal, upper, out);
  if (autograd::needs_grad(x)) {
    autograd::record(op, {&x}, {&out}, [diagonal, upper](const autograd::Grads& g) {
      return autograd::Grads{upper ? triu(g[0], diagonal) : tril(g[0], diagonal)};
    });
  }
  return out;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  const char* op = "cat";
  check_join_list(op, xs);
  const Tensor& x0 = xs[0];
  ACCEL_CHECK(x0.dim() > 0, ShapeError, op, "zero-dimensional tensor 0 cannot be concatenated");
  const int64_t d = wrap_dim(dim, x0.dim(), op);
  Shape shape = x0.sizes();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].sizes();
    bool ok = s.size() == shape.size();
    for (size_t k = 0; ok && k < s.size(); ++k) ok = int64_t(k) == d || s[k] == shape[k];
    ACCEL_CHECK(ok, ShapeError, op, "tensor ", i, " of shape ", s,
                " does not match tensor 0 of shape ", x0.sizes(), " outside dim ", d);
    total += s[size_t(d)];
  }
  shape[size_t(d)] = total;
  Tensor out = ops::empty_on(shape, x0.dtype(), x0.device());
  int64_t off = 0;
  for (const Tensor& x : xs) {
    const int64_t k = x.sizes()[size_t(d)];
    if (k > 0 && x.numel() > 0) {
      Tensor part = narrow_view(out, d, off, k);
      copy_stub(x.device(), part, x);
    }
    off += k;
  }
  if (autograd::needs_grad(xs)) {
    std::vector<int64_t> sizes;
    sizes.reserve(xs.size());
    for (const Tensor& x : xs) sizes.push_back(x.sizes()[size_t(d)]);
    autograd::record(op, xs, {&out}, [sizes = std::move(sizes), d](const autograd::Grads& g) {
      autograd::Grads r;
      r.reserve(sizes.size());
      int64_t o = 0;
      for (int64_t k : sizes) {
        r.push_back(g[0].narrow(d, o, k));
        o += k;
      }
      return r;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  const char* op = "stack";
  check_join_list(op, xs);
  const Tensor& x0 = xs[0];
  const int64_t d = wrap_dim(dim, x0.dim() + 1, op);
  for (size_t i = 1; i < xs.size(); ++i) {
    ACCEL_CHECK(xs[i].sizes() == x0.sizes(), ShapeError, op, "tensor ", i, " of shape ",
                xs[i].sizes(), " differs from tensor 0 of shape ", x0.sizes());
  }
  Shape shape = x0.sizes();
  shape.insert(size_t(d), int64_t(xs.size()));
  Tensor out = ops::empty_on(shape, x0.dtype(), x0.device());
  if (out.numel() > 0) {
    for (size_t i = 0; i < xs.size(); ++i) {
      Tensor part = select_view(out, d, int64_t(i));
      copy_stub(x0.device(), part, xs[i]);
    }
  }
  if (autograd::needs_grad(xs)) {
    autograd::record(op, xs, {&out}, [n = xs.size(), d](const autograd::Grads& g) {
      autograd::Grads r;
      r.reserve(n);
      for (size_t i = 0; i < n; ++i) r.push_back(g[0].select(d, int64_t(i)));
      return r;
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const char* op = "split";
  ops::check_defined(x, op);
  ACCEL_CHECK(x.dim() > 0, ShapeError, op, "cannot split a 0-dim tensor");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.sizes()[size_t(d)];
  ACCEL_CHECK(split_size > 0 || (split_size == 0 && n == 0), ValueError, op,
              "split_size must be positive, got ", split_size, " for dim ", d, " of shape ",
              x.sizes());
  std::vector<Tensor> parts;
  if (n == 0) {
    parts.push_back(x.narrow(d, 0, 0));
    return parts;
  }
  parts.reserve(size_t((n + split_size - 1) / split_size));
  for (int64_t s = 0; s < n; s += split_size)
    parts.push_back(x.narrow(d, s, std::min(split_size, n - s)));
  return parts;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const char* op = "split";
  ops::check_defined(x, op);
  ACCEL_CHECK(x.dim() > 0, ShapeError, op, "cannot split a 0-dim tensor");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.sizes()[size_t(d)];
  int64_t total = 0;
  for (int64_t s : sizes) {
    ACCEL_CHECK(s >= 0, ValueError, op, "split sizes must be non-negative, got ", Shape(sizes));
    total += s;
  }
  ACCEL_CHECK(total == n, ShapeError, op, "split sizes ", Shape(sizes), " sum to ", total,
              " but dim ", d, " of shape ", x.sizes(), " has size ", n);
  std::vector<Tensor> parts;
  parts.reserve(sizes.size());
  int64_t off = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.narrow(d, off, s));
    off += s;
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const char* op = "chunk";
  ops::check_defined(x, op);
  ACCEL_CHECK(x.dim() > 0, ShapeError, op, "cannot chunk a 0-dim tensor");
  ACCEL_CHECK(chunks > 0, ValueError, op, "number of chunks must be positive, got ", chunks);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.sizes()[size_t(d)];
  if (n == 0) {
    // As in PyTorch: `chunks` empty pieces.
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < chunks; ++i) parts.push_back(x.narrow(d, 0, 0));
    return parts;
  }
  // Pieces of ceil(n / chunks); there may be fewer than `chunks` of them.
  return split(x, (n + chunks - 1) / chunks, d);
}

// x viewed as (1, s0, 1, s1, ...) (leading 1s for the extra repeats), expanded to
// (r0, s0, r1, s1, ...) and reshaped to (r0 s0, r1 s1, ...): one copy, and the backward (sum over
// the copies) comes from the view and expand ops.
Tensor repeat(const Tensor& x, const Shape& repeats) {
  const char* op = "repeat";
  ops::check_defined(x, op);
  ACCEL_CHECK(int64_t(repeats.size()) >= x.dim(), ShapeError, op, "repeats ", repeats,
              " name fewer dims than the tensor of shape ", x.sizes(), " has");
  Shape inter, expanded, out;
  const size_t lead = repeats.size() - size_t(x.dim());
  for (size_t i = 0; i < repeats.size(); ++i) {
    ACCEL_CHECK(repeats[i] >= 0, ValueError, op, "repeats must be >= 0, got ", repeats);
    const int64_t s = i < lead ? 1 : x.sizes()[i - lead];
    inter.push_back(1);
    inter.push_back(s);
    expanded.push_back(repeats[i]);
    expanded.push_back(s);
    out.push_back(repeats[i] * s);
  }
  Tensor r = x.reshape(inter).expand(expanded).reshape(out);
  // All repeats 1 leave a view: repeat always returns a new tensor, as torch's.
  return r.storage().get() == x.storage().get() ? r.clone() : r;
}

Tensor tril(const Tensor& x, int64_t diagonal) { return trilu("tril", x, diagonal, false); }
Tensor triu(const Tensor& x, int64_t diagonal) { return trilu("triu", x, diagonal, true); }

}  // namespace accel
