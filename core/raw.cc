#include "core/raw.h"

#include <vector>

#include "core/dispatch.h"

namespace accel::raw {

Tensor as_strided(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  return Tensor(make_intrusive<TensorImpl>(base.storage(), std::move(sizes), std::move(strides),
                                           offset, base.dtype()));
}

Tensor permute(const Tensor& t, const Shape& dims) {
  ACCEL_CHECK(t.defined(), ValueError, "permute", "input tensor is undefined");
  ACCEL_CHECK(int64_t(dims.size()) == t.dim(), ShapeError, "permute", "got ", dims.size(), " dims ",
              dims, " for a tensor of shape ", t.sizes());
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> used(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    ACCEL_CHECK(!used[size_t(d)], ValueError, "permute", "repeated dim in ", dims);
    used[size_t(d)] = true;
    sz[i] = t.sizes()[size_t(d)];
    st[i] = t.strides()[size_t(d)];
  }
  return as_strided(t, std::move(sz), std::move(st), t.offset());
}

bool expand_geometry(const Tensor& t, const Shape& shape, Shape& sz, Shape& st) {
  ACCEL_CHECK(shape.size() >= t.sizes().size(), ShapeError, "expand", "cannot expand shape ",
              t.sizes(), " to ", shape, " (fewer dims)");
  const size_t off = shape.size() - t.sizes().size();
  sz = Shape(shape.size());
  st = Shape(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < off) {
      ACCEL_CHECK(shape[i] >= 0, ShapeError, "expand", "cannot infer new leading dim in ", shape);
      sz[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t cur = t.sizes()[i - off];
    const int64_t want = shape[i] == -1 ? cur : shape[i];
    ACCEL_CHECK(cur == want || cur == 1, ShapeError, "expand", "cannot expand shape ", t.sizes(),
                " to ", shape);
    sz[i] = want;
    st[i] = cur == want ? t.strides()[i - off] : 0;
  }
  return sz != t.sizes();
}

Tensor expand(const Tensor& t, const Shape& shape) {
  ACCEL_CHECK(t.defined(), ValueError, "expand", "input tensor is undefined");
  Shape sz, st;
  if (!expand_geometry(t, shape, sz, st)) return t;
  return as_strided(t, std::move(sz), std::move(st), t.offset());
}

Tensor contiguous(const Tensor& t) {
  ACCEL_CHECK(t.defined(), ValueError, "contiguous", "input tensor is undefined");
  if (t.is_contiguous()) return t;
  Tensor out = empty(t.sizes(), TensorOptions(t.dtype(), t.device()));
  copy_stub(t.device(), out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dt) {
  ACCEL_CHECK(t.defined(), ValueError, "to", "input tensor is undefined");
  if (t.dtype() == dt) return t;
  Tensor out = empty(t.sizes(), TensorOptions(dt, t.device()));
  copy_stub(t.device(), out, t);
  return out;
}

Tensor to_device(const Tensor& t, Device d, bool non_blocking) {
  ACCEL_CHECK(t.defined(), ValueError, "to", "input tensor is undefined");
  if (t.device() == d) return t;
  Tensor src = contiguous(t);
  Tensor out = empty(t.sizes(), TensorOptions(t.dtype(), d));
  // The non-CPU side's backend moves the bytes (a CPU<->CUDA copy is registered under CUDA).
  const Device backend = d.is_cpu() ? t.device() : d;
  cross_device_copy_stub(backend, out, src, non_blocking);
  return out;
}

void copy_(Tensor& dst, const Tensor& src, bool bump_version) {
  ACCEL_CHECK(dst.defined(), ValueError, "copy_", "tensor is undefined");
  ACCEL_CHECK(src.defined(), ValueError, "copy_", "source tensor is undefined");
  ACCEL_CHECK(is_broadcastable_to(src.sizes(), dst.sizes()), ShapeError, "copy_", "source shape ",
              src.sizes(), " cannot be broadcast to destination shape ", dst.sizes());
  if (src.device() == dst.device()) {
    copy_stub(dst.device(), dst, src);
  } else {
    // Cross-device: make both sides contiguous with the destination's dtype, then move bytes.
    Tensor s = to_dtype(contiguous(expand(src, dst.sizes())), dst.dtype());
    Tensor d =
        dst.is_contiguous() ? dst : empty(dst.sizes(), TensorOptions(dst.dtype(), dst.device()));
    const Device backend = dst.device().is_cpu() ? src.device() : dst.device();
    cross_device_copy_stub(backend, d, s, false);
    if (!d.is_same(dst)) copy_stub(dst.device(), dst, d);
  }
  if (bump_version) dst.storage()->bump_version();
}

void fill_(Tensor& dst, Scalar v) {
  ACCEL_CHECK(dst.defined(), ValueError, "fill_", "tensor is undefined");
  fill_stub(dst.device(), dst, v);
  dst.storage()->bump_version();
}

}  // namespace accel::raw
