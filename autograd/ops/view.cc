// View ops (share storage) and copies/conversions, with their backward.
#include <numeric>

#include "autograd/ops/common.h"
#include "core/raw.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(view, "view");
ACCEL_DIFFERENTIABLE_OP(reshape, "reshape");
ACCEL_DIFFERENTIABLE_OP(transpose, "transpose");
ACCEL_DIFFERENTIABLE_OP(permute, "permute");
ACCEL_DIFFERENTIABLE_OP(slice, "slice");
ACCEL_DIFFERENTIABLE_OP(select, "select");
ACCEL_DIFFERENTIABLE_OP(expand, "expand");
ACCEL_DIFFERENTIABLE_OP(squeeze, "squeeze");
ACCEL_DIFFERENTIABLE_OP(unsqueeze, "unsqueeze");
ACCEL_DIFFERENTIABLE_OP(contiguous, "contiguous");
ACCEL_DIFFERENTIABLE_OP(clone, "clone");
ACCEL_DIFFERENTIABLE_OP(to_dtype, "to_dtype");

namespace {

// Records the backward of a view whose gradient is `g` mapped by `fn`.
template <typename F>
void record_view(const char* name, const Tensor& in, Tensor& out, F&& fn) {
  if (autograd::needs_grad(in)) {
    autograd::record(name, {&in}, {&out}, [fn = std::forward<F>(fn)](const autograd::Grads& g) {
      return autograd::Grads{fn(g[0])};
    });
  }
}

// Note [views and in-place autograd] (autograd/function.h): `out` views `in`'s storage; it
// remembers the base (the first non-view) so that an in-place write through either reaches the
// other's history. Called after the view's own node, if any, was recorded.
void track_view(const Tensor& in, Tensor& out) {
  TensorImpl* i = in.impl();
  TensorImpl* o = out.impl();
  o->view_base_ = i->view_base_ ? i->view_base_ : IntrusivePtr<TensorImpl>(i);
  o->view_no_grad_ = i->view_no_grad_ || !grad_enabled();
  if (o->autograd_) o->autograd_->attr_version = out.version();
}

// A view op's result: its backward (when `in` needs grad) and its base.
template <typename F>
void record_as_view(const char* name, const Tensor& in, Tensor& out, F&& fn) {
  record_view(name, in, out, std::forward<F>(fn));
  track_view(in, out);
}

// Infers a -1 entry and checks the element count.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  bool overflow = false, has_zero = false;  // Note [checked tensor sizes] in core/shape.h
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      ACCEL_CHECK(infer < 0, ShapeError, op, "only one dimension can be inferred in shape ", shape);
      infer = int(i);
    } else {
      ACCEL_CHECK(s[i] >= 0, ShapeError, op, "invalid shape ", shape);
      overflow |= __builtin_mul_overflow(known, s[i], &known);
      has_zero |= s[i] == 0;
    }
  }
  ACCEL_CHECK(!overflow || has_zero, ShapeError, op, "shape ", shape,
              " has more elements than an int64 can count");
  if (infer >= 0) {
    ACCEL_CHECK(known != 0 && numel % known == 0, ShapeError, op, "shape ", shape,
                " is invalid for input of shape ", from, " (", numel, " elements)");
    s[size_t(infer)] = numel / known;
  } else {
    ACCEL_CHECK(known == numel, ShapeError, op, "shape ", shape, " is invalid for input of shape ",
                from, " (", numel, " elements)");
  }
  return s;
}

// Strides for viewing (sizes, strides) as new_shape without copying, if possible.
bool compute_view_strides(const Shape& sizes, const Shape& strides, const Shape& new_shape,
                          Shape* out) {
  // Walk chunks of old dims that are mutually contiguous, matching them to new dims.
  out->assign(new_shape.size(), 0);
  const int64_t numel = shape_numel(sizes);
  if (numel == 0 || sizes.empty()) {
    *out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[size_t(d)];
    if (d == 0 ||
        (sizes[size_t(d - 1)] != 1 && strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[size_t(view_d)] == 1)) {
        (*out)[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  ops::check_defined(*this, "view");
  Shape s = infer_shape(shape, numel(), "view", sizes());
  Shape st;
  ACCEL_CHECK(compute_view_strides(sizes(), strides(), s, &st), ShapeError, "view", "view size ", s,
              " is not compatible with input of shape ", sizes(), " and strides ", strides(),
              "; use reshape()");
  Tensor out = ops::make_view(*this, s, std::move(st), offset());
  record_as_view("view", *this, out, [in = sizes()](const Tensor& g) { return g.reshape(in); });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  ops::check_defined(*this, "reshape");
  Shape s = infer_shape(shape, numel(), "reshape", sizes());
  Shape st;
  if (compute_view_strides(sizes(), strides(), s, &st)) return view(s);
  return contiguous().view(s);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  ops::check_defined(*this, "flatten");
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start, dim(), "flatten"), e = wrap_dim(end, dim(), "flatten");
  ACCEL_CHECK(s <= e, ValueError, "flatten", "start dim ", start, " is after end dim ", end);
  Shape ns;
  for (int64_t i = 0; i < s; ++i) ns.push_back(sizes()[size_t(i)]);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= sizes()[size_t(i)];
  ns.push_back(m);
  for (int64_t i = e + 1; i < dim(); ++i) ns.push_back(sizes()[size_t(i)]);
  return reshape(ns);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  ops::check_defined(*this, "transpose");
  const int64_t a = wrap_dim(d0, dim(), "transpose"), b = wrap_dim(d1, dim(), "transpose");
  if (dim() == 0) return *this;
  Shape sz = sizes(), st = strides();
  std::swap(sz[size_t(a)], sz[size_t(b)]);
  std::swap(st[size_t(a)], st[size_t(b)]);
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("transpose", *this, out, [a, b](const Tensor& g) { return g.transpose(a, b); });
  return out;
}

Tensor Tensor::t() const {
  ops::check_defined(*this, "t");
  ACCEL_CHECK(dim() <= 2, ShapeError, "t", "expects a tensor with <= 2 dims, got shape ", sizes());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  ops::check_defined(*this, "permute");
  ACCEL_CHECK(int64_t(dims.size()) == dim(), ShapeError, "permute", "got ", dims.size(), " dims ",
              dims, " for a tensor of shape ", sizes());
  Shape sz(dims.size()), st(dims.size()), inv(dims.size());
  std::vector<bool> used(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    ACCEL_CHECK(!used[size_t(d)], ValueError, "permute", "repeated dim in ", dims);
    used[size_t(d)] = true;
    sz[i] = sizes()[size_t(d)];
    st[i] = strides()[size_t(d)];
    inv[size_t(d)] = int64_t(i);
  }
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("permute", *this, out, [inv](const Tensor& g) { return g.permute(inv); });
  return out;
}

Tensor Tensor::slice(int64_t dim_, int64_t start, int64_t end, int64_t step) const {
  ops::check_defined(*this, "slice");
  ACCEL_CHECK(dim() > 0, ShapeError, "slice", "cannot slice a 0-dim tensor");
  const int64_t d = wrap_dim(dim_, dim(), "slice");
  ACCEL_CHECK(step > 0, ValueError, "slice", "step must be positive, got ", step);
  const int64_t n = sizes()[size_t(d)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sz = sizes(), st = strides();
  sz[size_t(d)] = (end - start + step - 1) / step;
  st[size_t(d)] *= step;
  Tensor out =
      ops::make_view(*this, std::move(sz), std::move(st), offset() + start * strides()[size_t(d)]);
  if (autograd::needs_grad(*this)) {
    record_view("slice", *this, out, [in = sizes(), d, start, end, step](const Tensor& g) {
      Tensor gi = zeros(in, TensorOptions(g.dtype(), g.device()));
      gi.slice(d, start, end, step).copy_(g);
      return gi;
    });
  }
  track_view(*this, out);
  return out;
}

Tensor Tensor::narrow(int64_t dim_, int64_t start, int64_t length) const {
  ops::check_defined(*this, "narrow");
  ACCEL_CHECK(dim() > 0, ShapeError, "narrow", "cannot narrow a 0-dim tensor");
  const int64_t d = wrap_dim(dim_, dim(), "narrow");
  const int64_t n = sizes()[size_t(d)];
  if (start < 0) start += n;
  ACCEL_CHECK(start >= 0 && length >= 0 && start + length <= n, IndexError, "narrow", "start ",
              start, " + length ", length, " exceeds dimension ", d, " of size ", n, " (shape ",
              sizes(), ")");
  return slice(d, start, start + length, 1);
}

Tensor Tensor::select(int64_t dim_, int64_t index) const {
  ops::check_defined(*this, "select");
  ACCEL_CHECK(dim() > 0, ShapeError, "select", "cannot select from a 0-dim tensor");
  const int64_t d = wrap_dim(dim_, dim(), "select");
  const int64_t n = sizes()[size_t(d)];
  ACCEL_CHECK(index >= -n && index < n, IndexError, "select", "index ", index,
              " is out of bounds for dimension ", d, " with size ", n, " (shape ", sizes(), ")");
  if (index < 0) index += n;
  Shape sz = sizes(), st = strides();
  sz.erase(size_t(d));
  st.erase(size_t(d));
  Tensor out =
      ops::make_view(*this, std::move(sz), std::move(st), offset() + index * strides()[size_t(d)]);
  if (autograd::needs_grad(*this)) {
    record_view("select", *this, out, [in = sizes(), d, index](const Tensor& g) {
      Tensor gi = zeros(in, TensorOptions(g.dtype(), g.device()));
      gi.select(d, index).copy_(g);
      return gi;
    });
  }
  track_view(*this, out);
  return out;
}

Tensor Tensor::expand(const Shape& shape) const {
  ops::check_defined(*this, "expand");
  Shape sz, st;
  if (!raw::expand_geometry(*this, shape, sz, st)) return *this;
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("expand", *this, out, [in = sizes()](const Tensor& g) { return sum_to(g, in); });
  return out;
}

Tensor Tensor::squeeze() const {
  ops::check_defined(*this, "squeeze");
  Shape sz, st;
  for (int64_t i = 0; i < dim(); ++i) {
    if (sizes()[size_t(i)] != 1) {
      sz.push_back(sizes()[size_t(i)]);
      st.push_back(strides()[size_t(i)]);
    }
  }
  if (sz.size() == sizes().size()) return *this;
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("squeeze", *this, out, [in = sizes()](const Tensor& g) { return g.reshape(in); });
  return out;
}

Tensor Tensor::squeeze(int64_t dim_) const {
  ops::check_defined(*this, "squeeze");
  if (dim() == 0) return *this;
  const int64_t d = wrap_dim(dim_, dim(), "squeeze");
  if (sizes()[size_t(d)] != 1) return *this;
  Shape sz = sizes(), st = strides();
  sz.erase(size_t(d));
  st.erase(size_t(d));
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("squeeze", *this, out, [in = sizes()](const Tensor& g) { return g.reshape(in); });
  return out;
}

Tensor Tensor::unsqueeze(int64_t dim_) const {
  ops::check_defined(*this, "unsqueeze");
  const int64_t d = wrap_dim(dim_, dim() + 1, "unsqueeze");
  Shape sz = sizes(), st = strides();
  const int64_t new_stride = size_t(d) < sz.size() ? sz[size_t(d)] * st[size_t(d)] : 1;
  sz.insert(size_t(d), 1);
  st.insert(size_t(d), new_stride);
  Tensor out = ops::make_view(*this, std::move(sz), std::move(st), offset());
  record_as_view("unsqueeze", *this, out,
                 [in = sizes()](const Tensor& g) { return g.reshape(in); });
  return out;
}

Tensor Tensor::contiguous() const {
  ops::check_defined(*this, "contiguous");
  if (is_contiguous()) return *this;
  Tensor out = ops::empty_on(sizes(), dtype(), device());
  copy_stub(device(), out, *this);
  record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  ops::check_defined(*this, "clone");
  Tensor out = ops::empty_on(sizes(), dtype(), device());
  copy_stub(device(), out, *this);
  record_view("clone", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::to(DType t) const {
  ops::check_defined(*this, "to");
  if (t == dtype()) return *this;
  Tensor out = ops::empty_on(sizes(), t, device());
  copy_stub(device(), out, *this);
  if (is_floating(t)) {
    record_view("to_dtype", *this, out, [src = dtype()](const Tensor& g) { return g.to(src); });
  }
  return out;
}

Tensor Tensor::to(Device d, bool non_blocking) const {
  ops::check_defined(*this, "to");
  if (d == device()) return *this;
  Tensor src = contiguous();
  Tensor out = ops::empty_on(sizes(), dtype(), d);
  const Device backend = d.is_cpu() ? device() : d;
  cross_device_copy_stub(backend, out, src.detach(), non_blocking);
  record_view("to_device", src, out, [from = device()](const Tensor& g) { return g.to(from); });
  return out;
}

}  // namespace accel
