// Advanced indexing: index (x[...]), index_put (x[...] = v, +=), masked_select, masked_scatter,
// take_along_dim, nonzero. The index list types are in core/tensor_index.h; the rules (numpy's
// and PyTorch's) in docs/indexing.md.
//
// Note [advanced indexing as offsets]
// An index list is split in two (as PyTorch does): the basic entries (ints, slices, None,
// ellipsis, bools' new axes) become view steps (select / slice / unsqueeze), replayed with the
// differentiable view methods on x (or on a gradient of x's shape); the tensor entries index
// dims of that view V. Bool masks become their nonzero() columns (one index tensor per mask
// dim). The index tensors are checked and wrapped once (int64 in [0, size)), broadcast to B,
// and for any strided tensor T of V's shape folded into one int64 offset per index position:
//   L[b] = sum_k idx_k[b] * T.stride(d_k)
// The result has V's dims with the indexed ones replaced by B: in their place when they were
// adjacent in V, first otherwise. Restrided views then make each kernel a plain strided loop
// over the result's shape (kernels/stubs/index.h):
//   src = T with the indexed dims removed and B's dims inserted at stride 0
//   off = L with the kept dims inserted at stride 0
//   index:     out[i] = src[i] + off[i]        index_put:  dst[i] + off[i] = (or +=) values[i]
// The backward of index is index_put with accumulate into zeros; the backward of index_put is
// index (values) and index_put of zeros at the written places (self, without accumulate).
#include <algorithm>
#include <memory>

#include "autograd/ops/common.h"
#include "core/raw.h"
#include "kernels/stubs/index.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(index, "index");
ACCEL_DIFFERENTIABLE_OP(index_put, "index_put");
ACCEL_DIFFERENTIABLE_OP(masked_select, "masked_select");
ACCEL_DIFFERENTIABLE_OP(masked_scatter, "masked_scatter");
ACCEL_DIFFERENTIABLE_OP(take_along_dim, "take_along_dim");

using indexing::TensorIndex;

namespace {

// One basic entry, as a view step on a tensor of x's shape.
struct BasicStep {
  enum Kind : uint8_t { Select, Slice, Unsqueeze } kind;
  int64_t dim = 0, start = 0, stop = 0, step = 1;  // Select: start is the (wrapped) index
};

// The tensor entries, on the view V the basic steps produce.
struct AdvPlan {
  std::vector<int64_t> dims;      // dims of V taken by index tensors, ascending
  std::vector<Tensor> idx;        // int64, in [0, size of that dim), on x's device
  Shape view_shape;               // V's shape
  Shape bshape;                   // the index tensors broadcast together
  Shape out_shape;                // V's kept dims with B inserted
  std::vector<int64_t> kept;      // dims of V not indexed, ascending
  std::vector<int64_t> kept_pos;  // their positions in out_shape
  int64_t b_pos = 0;              // where B's dims start in out_shape
  bool borrowed = false;          // some idx is the caller's own index tensor (not a copy)
};

struct Plan {
  std::vector<BasicStep> steps;
  std::shared_ptr<AdvPlan> adv;  // null when every entry is basic
  Shape view_shape;
  Shape out_shape;  // x[indices]'s shape
};

bool is_mask_dtype(DType t) { return t == kBool || t == kUInt8; }

// numpy's rule: aligned from the right, each pair of sizes equal or one of them 1.
bool broadcastable(const Shape& a, const Shape& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 1; i <= n; ++i) {
    const int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

[[noreturn]] void throw_out_of_range(const char* op, int64_t v, int64_t size, int64_t real_dim,
                                     const Shape& x_shape) {
  ACCEL_THROW(IndexError, op, "index ", v, " is out of bounds for dimension ", real_dim,
              " with size ", size, " (tensor of shape ", x_shape, ")");
}

// Checks int index values against `size` and wraps negative ones (int64 result). On the CPU one
// loop over the values; elsewhere framework ops, with one synchronising read of the bad-element
// count (Note [CUDA index checks] in kernels/cuda/index.cc: a kernel cannot throw).
Tensor checked_index(const char* op, const Tensor& index, int64_t size, int64_t real_dim,
                     const Shape& x_shape) {
  NoGradGuard no_grad;
  Tensor i = ops::as_dtype(index, kInt64);
  if (i.device().is_cpu()) {
    const Tensor c = raw::contiguous(i);
    const int64_t* p = c.data<int64_t>();
    bool negative = false;
    for (int64_t k = 0; k < c.numel(); ++k) {
      if (p[k] < -size || p[k] >= size) throw_out_of_range(op, p[k], size, real_dim, x_shape);
      negative = negative || p[k] < 0;
    }
    if (!negative) return c;  // the usual case: used as it is
    Tensor w = ops::empty_on(c.sizes(), kInt64, kCPU);
    int64_t* wp = w.data<int64_t>();
    for (int64_t k = 0; k < c.numel(); ++k) wp[k] = p[k] < 0 ? p[k] + size : p[k];
    return w;
  }
  Tensor wrapped = where(lt(i, 0), add(i, Scalar(size)), i);
  Tensor bad = logical_or(lt(wrapped, 0), ge(wrapped, Scalar(size)));
  if (i.numel() > 0 && sum(bad).item<int64_t>() > 0) {
    const int64_t pos = argmax(bad.reshape({-1}).to(kInt32)).item<int64_t>();
    throw_out_of_range(op, i.reshape({-1}).select(0, pos).item<int64_t>(), size, real_dim, x_shape);
  }
  return wrapped;
}

// A 1-element (true) or empty (false) int64 index on a new unit axis: the bools' meaning.
Tensor bool_index(bool b, Device dev) { return zeros({b ? 1 : 0}, TensorOptions(kInt64, dev)); }

Plan make_plan(const char* op, const Tensor& x, const std::vector<TensorIndex>& indices) {
  ops::check_defined(x, op);
  // How many of x's dims the list names (masks name as many as they have).
  int64_t specified = 0, ellipses = 0;
  for (const TensorIndex& e : indices) {
    if (e.is_integer() || e.is_slice()) {
      ++specified;
    } else if (e.is_ellipsis()) {
      ++ellipses;
    } else if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      ACCEL_CHECK(t.defined(), ValueError, op, "undefined tensor in the index list ",
                  indexing::index_str(indices));
      specified += is_mask_dtype(t.dtype()) ? t.dim() : 1;
    }
  }
  ACCEL_CHECK(ellipses <= 1, IndexError, op, "an index can only have a single ellipsis ('...'), ",
              "got ", indexing::index_str(indices));
  ACCEL_CHECK(specified <= x.dim(), IndexError, op, "too many indices for tensor of dimension ",
              x.dim(), ": ", indexing::index_str(indices), " on shape ", x.sizes());

  Plan p;
  Shape cur = x.sizes();
  int64_t dim = 0, real_dim = 0;  // position in the view, and in x (for messages)
  std::vector<int64_t> adv_dims;
  std::vector<Tensor> adv_idx;
  bool borrowed = false;
  auto add_adv = [&](int64_t d, Tensor t) {
    adv_dims.push_back(d);
    adv_idx.push_back(std::move(t));
  };
  auto select = [&](int64_t i) {
    const int64_t n = cur[size_t(dim)];
    if (i < -n || i >= n) throw_out_of_range(op, i, n, real_dim, x.sizes());
    p.steps.push_back({BasicStep::Select, dim, i < 0 ? i + n : i});
    cur.erase(size_t(dim));
    ++real_dim;
  };
  auto unsqueeze = [&] {
    p.steps.push_back({BasicStep::Unsqueeze, dim});
    cur.insert(size_t(dim), 1);
  };
  for (const TensorIndex& e : indices) {
    switch (e.type()) {
      case indexing::TensorIndexType::Integer: select(e.integer()); break;
      case indexing::TensorIndexType::Slice: {
        const indexing::Slice& s = e.slice();
        const int64_t n = cur[size_t(dim)];
        const int64_t step = s.step().value_or(1);
        ACCEL_CHECK(step > 0, ValueError, op, "slice step must be greater than zero, got ", step,
                    " in ", indexing::index_str(indices));
        int64_t start = s.start().value_or(0), stop = s.stop().value_or(n);
        if (start < 0) start += n;
        if (stop < 0) stop += n;
        start = std::clamp<int64_t>(start, 0, n);
        stop = std::clamp<int64_t>(stop, start, n);
        if (!(start == 0 && stop == n && step == 1)) {
          p.steps.push_back({BasicStep::Slice, dim, start, stop, step});
          cur[size_t(dim)] = (stop - start + step - 1) / step;
        }
        ++dim;
        ++real_dim;
        break;
      }
      case indexing::TensorIndexType::None:
        unsqueeze();
        ++dim;
        break;
      case indexing::TensorIndexType::Boolean:
        unsqueeze();
        add_adv(dim++, bool_index(e.boolean(), x.device()));
        break;
      case indexing::TensorIndexType::Ellipsis:
        dim += x.dim() - specified;
        real_dim += x.dim() - specified;
        break;
      case indexing::TensorIndexType::Tensor: {
        Tensor t = e.tensor();
        const DType dt = t.dtype();
        ACCEL_CHECK(is_mask_dtype(dt) || dt == kInt64 || dt == kInt32, DTypeError, op,
                    "tensors used as indices must be int64, int32, bool or uint8, got ", dt,
                    " of shape ", t.sizes(), " in ", indexing::index_str(indices));
        if (t.device() != x.device()) {
          ACCEL_CHECK(t.device().is_cpu(), DeviceError, op, "index tensor on ", t.device(),
                      " for a tensor on ", x.device(),
                      ": indices must be on the CPU or the indexed tensor's device");
          t = raw::to_device(t, x.device());
        }
        if (!is_mask_dtype(dt) && t.dim() == 0) {
          select(t.item<int64_t>());  // a 0-dim int tensor is an int, as in PyTorch
        } else if (is_mask_dtype(dt) && t.dim() == 0) {
          unsqueeze();
          add_adv(dim++, bool_index(t.item<double>() != 0, x.device()));
        } else if (is_mask_dtype(dt)) {
          const int64_t k = t.dim();
          bool ok = true;
          for (int64_t j = 0; j < k; ++j) ok = ok && t.sizes()[size_t(j)] == cur[size_t(dim + j)];
          if (!ok) {
            Shape covered(cur.begin() + dim, cur.begin() + dim + k);
            ACCEL_THROW(IndexError, op, "the mask of shape ", t.sizes(),
                        " does not match the indexed tensor's dims ", real_dim, "..",
                        real_dim + k - 1, " of shape ", covered, " (tensor of shape ", x.sizes(),
                        ", index ", indexing::index_str(indices), ")");
          }
          // A mask is its nonzero(): one int64 column per mask dim, in range by construction.
          Tensor nz = nonzero_stub(t.device(), raw::contiguous(t));
          for (int64_t j = 0; j < k; ++j) add_adv(dim + j, nz.select(1, j));
          dim += k;
          real_dim += k;
        } else {
          Tensor c = checked_index(op, t, cur[size_t(dim)], real_dim, x.sizes());
          borrowed = borrowed || c.storage().get() == t.storage().get();
          add_adv(dim, std::move(c));
          ++dim;
          ++real_dim;
        }
        break;
      }
    }
  }
  p.view_shape = cur;
  if (adv_dims.empty()) {
    p.out_shape = cur;
    return p;
  }
  auto a = std::make_shared<AdvPlan>();
  a->dims = std::move(adv_dims);
  a->idx = std::move(adv_idx);
  a->borrowed = borrowed;
  a->view_shape = cur;
  Shape b = a->idx[0].sizes();
  for (size_t k = 1; k < a->idx.size(); ++k) {
    if (!broadcastable(b, a->idx[k].sizes())) {
      std::string shapes;
      for (const Tensor& t : a->idx) shapes += (shapes.empty() ? "" : ", ") + shape_str(t.sizes());
      ACCEL_THROW(IndexError, op, "shape mismatch: indexing tensors could not be broadcast ",
                  "together with shapes ", shapes, " (index ", indexing::index_str(indices), ")");
    }
    b = broadcast_shapes(b, a->idx[k].sizes(), op);
  }
  a->bshape = b;
  bool adjacent = true;
  for (size_t k = 1; k < a->dims.size(); ++k)
    adjacent = adjacent && a->dims[k] == a->dims[k - 1] + 1;
  a->b_pos = adjacent ? a->dims[0] : 0;
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < int64_t(cur.size()); ++d) {
    if (next < a->dims.size() && a->dims[next] == d) {
      ++next;
      continue;
    }
    a->kept.push_back(d);
  }
  for (size_t i = 0; i < a->kept.size(); ++i) {
    const int64_t d = a->kept[i];
    // Kept dims before the indexed ones stay in front when B stays in place.
    const bool before = adjacent && d < a->dims[0];
    a->kept_pos.push_back(before ? int64_t(i) : int64_t(i) + int64_t(b.size()));
  }
  out = Shape(size_t(cur.size() - a->dims.size() + b.size()), 0);
  for (size_t i = 0; i < a->kept.size(); ++i) out[size_t(a->kept_pos[i])] = cur[size_t(a->kept[i])];
  for (size_t j = 0; j < b.size(); ++j) out[size_t(a->b_pos) + j] = b[j];
  a->out_shape = out;
  p.out_shape = out;
  p.adv = std::move(a);
  return p;
}

// The basic steps replayed with differentiable views: V for a tensor of x's shape.
Tensor apply_basic(const Tensor& t, const std::vector<BasicStep>& steps) {
  Tensor v = t;
  for (const BasicStep& s : steps) {
    switch (s.kind) {
      case BasicStep::Select: v = v.select(s.dim, s.start); break;
      case BasicStep::Slice: v = v.slice(s.dim, s.start, s.stop, s.step); break;
      case BasicStep::Unsqueeze: v = v.unsqueeze(s.dim); break;
    }
  }
  return v;
}

// L (shape B) for a tensor of V's shape with strides `st`.
Tensor linear_offsets(const AdvPlan& a, const Shape& st) {
  NoGradGuard no_grad;
  Tensor l;
  for (size_t k = 0; k < a.dims.size(); ++k) {
    const int64_t s = st[size_t(a.dims[k])];
    Tensor term = s == 1 ? a.idx[k] : mul(a.idx[k], Scalar(s));
    l = l.defined() ? add(l, term) : term;
  }
  return l.sizes() == a.bshape ? l : raw::expand(l, a.bshape);
}

// `t` (V's shape) seen with out_shape: kept dims at their strides, B's dims at stride 0.
Tensor restride_indexed(const Tensor& t, const AdvPlan& a) {
  Shape st(a.out_shape.size(), 0);
  for (size_t i = 0; i < a.kept.size(); ++i)
    st[size_t(a.kept_pos[i])] = t.strides()[size_t(a.kept[i])];
  return raw::as_strided(t, a.out_shape, st, t.offset());
}

// L (shape B) seen with out_shape: B's dims at L's strides, kept dims at stride 0.
Tensor restride_offsets(const Tensor& l, const AdvPlan& a) {
  Shape st(a.out_shape.size(), 0);
  for (size_t j = 0; j < a.bshape.size(); ++j) st[size_t(a.b_pos) + j] = l.strides()[j];
  return raw::as_strided(l, a.out_shape, st, l.offset());
}

Tensor put_adv(const Tensor& base, const std::shared_ptr<AdvPlan>& a, const Tensor& values,
               bool accumulate);

// The plan a backward keeps: its index tensors must be the op's own, since the caller may write
// its index tensors in place after the forward (the gradient must still use the values the
// forward used). Copies the borrowed ones, only when a node is recorded.
std::shared_ptr<AdvPlan> kept_plan(const std::shared_ptr<AdvPlan>& a) {
  if (!a->borrowed) return a;
  auto k = std::make_shared<AdvPlan>(*a);
  for (Tensor& t : k->idx) t = t.clone();
  k->borrowed = false;
  return k;
}

// v[tensor indices] for v of the plan's view shape (op "index").
Tensor gather_adv(const Tensor& v, const std::shared_ptr<AdvPlan>& a) {
  Tensor out = ops::empty_on(a->out_shape, v.dtype(), v.device());
  if (out.numel() > 0) {
    const Tensor l = linear_offsets(*a, v.strides());
    index_stub(v.device(), restride_indexed(v, *a), restride_offsets(l, *a), out);
  }
  if (autograd::needs_grad(v)) {
    autograd::record("index", {&v}, {&out}, [a = kept_plan(a)](const autograd::Grads& g) {
      Tensor z = zeros(a->view_shape, TensorOptions(g[0].dtype(), g[0].device()));
      return autograd::Grads{put_adv(z, a, g[0], true)};
    });
  }
  return out;
}

// base (the plan's view shape) with base[tensor indices] = values (+= when accumulating), as a
// new tensor (op "index_put"). values: base's dtype and device, broadcastable to out_shape.
Tensor put_adv(const Tensor& base, const std::shared_ptr<AdvPlan>& a, const Tensor& values,
               bool accumulate) {
  Tensor out = ops::empty_on(base.sizes(), base.dtype(), base.device());
  copy_stub(base.device(), out, base);
  if (shape_numel(a->out_shape) > 0) {
    const Tensor l = linear_offsets(*a, out.strides());
    Tensor dst = restride_indexed(out, *a);
    index_put_stub(out.device(), dst, restride_offsets(l, *a),
                   raw::expand(values.detach(), a->out_shape), accumulate);
  }
  if (autograd::needs_grad(base, values)) {
    const bool gb = base.requires_grad(), gv = values.requires_grad();
    autograd::record(
        "index_put", {&base, &values}, {&out},
        [a = kept_plan(a), accumulate, gb, gv, vs = values.sizes()](const autograd::Grads& g) {
          Tensor gbase, gvals;
          if (gb) {
            gbase = accumulate
                        ? g[0]
                        : put_adv(g[0], a, zeros({}, TensorOptions(g[0].dtype(), g[0].device())),
                                  false);
          }
          if (gv) gvals = sum_to(gather_adv(g[0], a), vs);
          return autograd::Grads{gbase, gvals};
        });
  }
  return out;
}

// x with its basic-steps view replaced by src (src has the view's shape): the "basic" half of
// index_put. Gradients: x gets g with the view zeroed, src gets the view of g.
Tensor put_basic(const Tensor& x, const std::vector<BasicStep>& steps, const Tensor& src) {
  Tensor out = ops::empty_on(x.sizes(), x.dtype(), x.device());
  copy_stub(x.device(), out, x);
  {
    NoGradGuard no_grad;
    Tensor w = apply_basic(out, steps);
    Tensor s = src.detach();
    copy_stub(x.device(), w, s.dtype() == w.dtype() ? s : raw::to_dtype(s, w.dtype()));
  }
  if (autograd::needs_grad(x, src)) {
    const bool gx = x.requires_grad(), gs = src.requires_grad();
    autograd::record("index_put", {&x, &src}, {&out}, [steps, gx, gs](const autograd::Grads& g) {
      Tensor gxv, gsv;
      if (gx) {
        Tensor z = zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
        Shape vs = apply_basic(g[0].detach(), steps).sizes();
        gxv = put_basic(g[0], steps, raw::expand(z, vs));
      }
      if (gs) gsv = apply_basic(g[0], steps);
      return autograd::Grads{gxv, gsv};
    });
  }
  return out;
}

Tensor index_put_plan(const char* op, const Tensor& x, const Plan& p, const Tensor& values,
                      bool accumulate) {
  ops::check_defined(values, op, "values");
  ACCEL_CHECK(values.dtype() == x.dtype(), DTypeError, op, "values of dtype ", values.dtype(),
              " cannot be put into a ", x.dtype(), " tensor (shapes ", values.sizes(), " and ",
              x.sizes(), ")");
  ops::check_same_device(x, values, op);
  ACCEL_CHECK(is_broadcastable_to(values.sizes(), p.out_shape), ShapeError, op,
              "shape mismatch: values of shape ", values.sizes(),
              " cannot be broadcast to the indexing result of shape ", p.out_shape,
              " (tensor of shape ", x.sizes(), ")");
  if (!p.adv) {
    Tensor v = apply_basic(x, p.steps);
    Tensor src = accumulate ? add(v, values) : values;
    if (src.sizes() != p.view_shape) src = src.expand(p.view_shape);
    return put_basic(x, p.steps, src);
  }
  if (p.steps.empty()) return put_adv(x, p.adv, values, accumulate);
  Tensor v = apply_basic(x, p.steps);
  return put_basic(x, p.steps, put_adv(v, p.adv, values, accumulate));
}

}  // namespace

Tensor index(const Tensor& x, const std::vector<TensorIndex>& indices) {
  const Plan p = make_plan("index", x, indices);
  Tensor v = apply_basic(x, p.steps);
  if (!p.adv) return v;
  return gather_adv(v, p.adv);
}

Tensor index_put(const Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& values,
                 bool accumulate) {
  const Plan p = make_plan("index_put", x, indices);
  return index_put_plan("index_put", x, p, values, accumulate);
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  const char* op = "masked_select";
  ops::check_defined(x, op);
  ops::check_defined(mask, op, "mask");
  ACCEL_CHECK(mask.dtype() == kBool, DTypeError, op, "mask must be bool, got ", mask.dtype(),
              " of shape ", mask.sizes());
  ops::check_same_device(x, mask, op);
  const Shape b = broadcast_shapes(x.sizes(), mask.sizes(), op);
  Tensor xb = x.sizes() == b ? x : x.expand(b);
  Tensor mb = mask.sizes() == b ? mask : raw::expand(mask, b);
  // A mask of all of xb's dims: the result is 1-D (a 0-dim mask is a new axis of size 0 or 1).
  return index(xb, {mb});
}

Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& source) {
  const char* op = "masked_scatter";
  ops::check_defined(x, op);
  ops::check_defined(mask, op, "mask");
  ops::check_defined(source, op, "source");
  ACCEL_CHECK(mask.dtype() == kBool, DTypeError, op, "mask must be bool, got ", mask.dtype(),
              " of shape ", mask.sizes());
  ACCEL_CHECK(source.dtype() == x.dtype(), DTypeError, op, "source dtype ", source.dtype(),
              " differs from the input's ", x.dtype(), " (shapes ", source.sizes(), " and ",
              x.sizes(), ")");
  ops::check_same_device(x, mask, op);
  ops::check_same_device(x, source, op);
  ACCEL_CHECK(is_broadcastable_to(mask.sizes(), x.sizes()), ShapeError, op, "mask of shape ",
              mask.sizes(), " cannot be broadcast to the input's shape ", x.sizes());
  Tensor mb = raw::contiguous(mask.sizes() == x.sizes() ? mask : raw::expand(mask, x.sizes()));
  if (x.dim() == 0) mb = mb.reshape({1});
  Tensor xf = x.dim() == 0 ? x.reshape({1}) : x;
  const Plan p = make_plan(op, xf, {mb});
  const int64_t n = shape_numel(p.out_shape);
  ACCEL_CHECK(source.numel() >= n, ShapeError, op, "source has ", source.numel(),
              " elements (shape ", source.sizes(), "), fewer than the mask's ", n,
              " true elements (mask shape ", mask.sizes(), ")");
  Tensor src = source.reshape({-1});
  if (src.numel() != n) src = src.narrow(0, 0, n);
  Tensor out = index_put_plan(op, xf, p, src, false);
  return x.dim() == 0 ? out.reshape({}) : out;
}

Tensor take_along_dim(const Tensor& x, const Tensor& indices, std::optional<int64_t> dim) {
  const char* op = "take_along_dim";
  ops::check_defined(x, op);
  ops::check_defined(indices, op, "indices");
  ACCEL_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, DTypeError, op,
              "indices must be int64 or int32, got ", indices.dtype(), " of shape ",
              indices.sizes());
  if (!dim) return gather(x.reshape({-1}), 0, indices.reshape({-1}));
  ACCEL_CHECK(x.dim() == indices.dim(), ShapeError, op,
              "input and indices must have the same number of dims, got shapes ", x.sizes(),
              " and ", indices.sizes());
  if (x.dim() == 0) return gather(x, 0, indices);
  const int64_t d = wrap_dim(*dim, x.dim(), op);
  Shape xs = x.sizes();
  xs[size_t(d)] = indices.sizes()[size_t(d)];
  Shape bi = broadcast_shapes(xs, indices.sizes(), op);
  Shape bx = bi;
  bx[size_t(d)] = x.sizes()[size_t(d)];
  Tensor xe = x.sizes() == bx ? x : x.expand(bx);
  Tensor ie = indices.sizes() == bi ? indices : raw::expand(indices, bi);
  return gather(xe, d, ie);
}

Tensor nonzero(const Tensor& x) {
  ops::check_defined(x, "nonzero");
  Tensor nz = nonzero_stub(x.device(), raw::contiguous(x));
  if (x.dim() == 0) return ops::empty_on({nz.sizes()[0], 0}, kInt64, x.device());
  return nz;
}

std::vector<Tensor> nonzero_numpy(const Tensor& x) {
  ops::check_defined(x, "nonzero_numpy");
  Tensor nz = nonzero_stub(x.device(), raw::contiguous(x));
  std::vector<Tensor> out;
  for (int64_t j = 0; j < nz.sizes()[1]; ++j) out.push_back(raw::contiguous(nz.select(1, j)));
  return out;
}

}  // namespace accel
