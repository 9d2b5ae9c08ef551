// Reductions: forward, shape rules and backward together.
//   x: (d0, ..., dn), dims -> out: x's shape without dims (or with 1s when keepdim)
#include <algorithm>
#include <cmath>

#include "autograd/ops/common.h"
#include "kernels/stubs/reduce.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(sum, "sum");
ACCEL_DIFFERENTIABLE_OP(mean, "mean");
ACCEL_DIFFERENTIABLE_OP(amax, "amax");
ACCEL_DIFFERENTIABLE_OP(amin, "amin");
ACCEL_DIFFERENTIABLE_OP(max_dim, "max_dim");
ACCEL_DIFFERENTIABLE_OP(min_dim, "min_dim");
ACCEL_DIFFERENTIABLE_OP(var, "var");
ACCEL_DIFFERENTIABLE_OP(std_dev, "std_dev");
ACCEL_DIFFERENTIABLE_OP(prod, "prod");
ACCEL_DIFFERENTIABLE_OP(norm, "norm");

namespace ops {

// Normalised, sorted, unique reduced dims; empty input list means all dims.
Shape reduce_dims(const Tensor& x, const Shape& dims, const char* op) {
  Shape out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, x.dim(), op));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    ACCEL_CHECK(out[i] != out[i - 1], ValueError, op, "dim ", out[i], " appears twice in ", dims);
  return out;
}

Shape keepdim_shape(const Tensor& x, const Shape& rdims) {
  Shape s = x.sizes();
  for (int64_t d : rdims) s[size_t(d)] = 1;
  return s;
}

Shape squeezed_shape(const Tensor& x, const Shape& rdims) {
  Shape s;
  size_t j = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (j < rdims.size() && rdims[j] == d) {
      ++j;
      continue;
    }
    s.push_back(x.sizes()[size_t(d)]);
  }
  return s;
}

// Runs the kernel; returns the keepdim-shaped result reshaped as requested. 0-dim input and
// reductions over nothing become a copy.
Tensor reduce_raw(ReduceOp op, const Tensor& x, const Shape& rdims, bool keepdim, DType out_dtype) {
  const Shape kshape = keepdim_shape(x, rdims);
  Tensor out = empty_on(kshape, out_dtype, x.device());
  if (x.dim() == 0 || rdims.empty()) {
    if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
      out.fill_(0);
    } else {
      copy_stub(x.device(), out, x);
    }
  } else {
    // Every caller checks this with its own message first; this is the stub's precondition
    // (kernels/stubs/reduce.h) for any future caller.
    ACCEL_CHECK(has_identity(op) || out.numel() == 0 || x.numel() > 0, ShapeError, "reduce",
                "cannot take max/min/argmax of an empty dimension; input shape ", x.sizes());
    reduce_stub(x.device(), op, x.detach(), rdims, out);
  }
  if (keepdim) return out;
  Tensor r = out;
  return make_view(r, squeezed_shape(x, rdims), contiguous_strides(squeezed_shape(x, rdims)), 0);
}

}  // namespace ops

namespace {
// Gradient of a reduction: g has the output shape; bring back the reduced dims as size 1 so it
// broadcasts against the input.
Tensor unsqueeze_reduced(const Tensor& g, const Shape& in_shape, const Shape& rdims, bool keepdim) {
  if (keepdim) return g;
  Shape s = in_shape;
  for (int64_t d : rdims) s[size_t(d)] = 1;
  return g.reshape(s);
}

DType sum_dtype(DType t) { return is_floating(t) ? t : kInt64; }
}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "sum");
  const Shape rdims = ops::reduce_dims(x, dims, "sum");
  Tensor out = ops::reduce_raw(ReduceOp::Sum, x, rdims, keepdim, sum_dtype(x.dtype()));
  if (autograd::needs_grad(x)) {
    autograd::record("sum", {&x}, {&out},
                     [in = x.sizes(), rdims, keepdim](const autograd::Grads& g) {
                       return autograd::Grads{
                           unsqueeze_reduced(g[0], in, rdims, keepdim).expand(in).contiguous()};
                     });
  }
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "mean");
  const Shape rdims = ops::reduce_dims(x, dims, "mean");
  const DType dt = to_floating(x.dtype());
  Tensor xin = ops::as_dtype(x, dt);
  Tensor out = ops::reduce_raw(ReduceOp::Mean, xin, rdims, keepdim, dt);
  if (autograd::needs_grad(xin)) {
    int64_t n = 1;
    for (int64_t d : rdims) n *= x.sizes()[size_t(d)];
    autograd::record("mean", {&xin}, {&out},
                     [in = x.sizes(), rdims, keepdim, n](const autograd::Grads& g) {
                       Tensor gg = unsqueeze_reduced(g[0], in, rdims, keepdim);
                       return autograd::Grads{mul(gg.expand(in), 1.0 / double(n))};
                     });
  }
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  ops::check_defined(x, "sum_to");
  if (x.sizes() == shape) return x;
  ACCEL_CHECK(is_broadcastable_to(shape, x.sizes()), ShapeError, "sum_to", "shape ", shape,
              " is not broadcastable to ", x.sizes());
  const size_t lead = x.sizes().size() - shape.size();
  Shape rdims;
  for (size_t i = 0; i < x.sizes().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && x.sizes()[i] != 1)) rdims.push_back(int64_t(i));
  }
  Tensor s = rdims.empty() ? x : sum(x, rdims, true);
  return s.reshape(shape);
}

namespace {
// amax/amin: gradient shared evenly among the elements equal to the extreme value.
Tensor extreme(const char* name, ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, name);
  ACCEL_CHECK(x.numel() > 0, ShapeError, name, "cannot reduce an empty tensor of shape ",
              x.sizes());
  const Shape rdims = ops::reduce_dims(x, dims, name);
  Tensor out = ops::reduce_raw(op, x, rdims, keepdim, x.dtype());
  if (autograd::needs_grad(x)) {
    autograd::record(name, {&x}, {&out},
                     [xsv = autograd::save_input(x, 0), os = autograd::save_output(out), rdims,
                      keepdim](const autograd::Grads& g) {
                       const Tensor& xs = xsv.unpack();
                       const Tensor& o = os.unpack();
                       const Shape& in = xs.sizes();
                       Tensor ok = unsqueeze_reduced(o, in, rdims, keepdim);
                       Tensor mask = eq(xs, ok).to(g[0].dtype());
                       Tensor cnt = sum(mask, rdims, true);
                       Tensor gg = unsqueeze_reduced(g[0], in, rdims, keepdim);
                       return autograd::Grads{mul(div(gg, cnt), mask)};
                     });
  }
  return out;
}

std::tuple<Tensor, Tensor> extreme_dim(const char* name, ReduceOp vop, ReduceOp iop,
                                       const Tensor& x, int64_t dim, bool keepdim) {
  ops::check_defined(x, name);
  const Shape rdims = ops::reduce_dims(x, {dim}, name);
  ACCEL_CHECK(x.dim() == 0 || x.sizes()[size_t(rdims[0])] > 0, ShapeError, name,
              "cannot reduce over an empty dimension ", dim, " of shape ", x.sizes());
  Tensor idx = ops::reduce_raw(iop, x, rdims, true, kInt64);
  Tensor vals = ops::reduce_raw(vop, x, rdims, true, x.dtype());
  if (!keepdim && x.dim() > 0) {
    idx = idx.squeeze(rdims[0]);
    vals = vals.detach().squeeze(rdims[0]);
  }
  if (autograd::needs_grad(x)) {
    // The gradient flows to the selected index only.
    const int64_t d = x.dim() == 0 ? 0 : rdims[0];
    // The indices are returned to the caller (output 1): saved, so writing them is an error.
    autograd::record(
        name, {&x}, {&vals},
        [in = x.sizes(), ixs = autograd::save_output(idx, 1), d, keepdim,
         zero_dim = x.dim() == 0](const autograd::Grads& g) {
          if (zero_dim) return autograd::Grads{g[0]};
          const Tensor& ix = ixs.unpack();
          // One-hot of the selected index along d, broadcast against g.
          Shape pos_shape(in.size(), 1);
          pos_shape[size_t(d)] = in[size_t(d)];
          Tensor pos =
              arange(in[size_t(d)], TensorOptions(kInt64, g[0].device())).reshape(pos_shape);
          Tensor gk = keepdim ? g[0] : g[0].unsqueeze(d);
          Tensor ik = keepdim ? ix : ix.unsqueeze(d);
          return autograd::Grads{mul(eq(pos, ik).to(g[0].dtype()), gk)};
        });
  }
  return {vals, idx};
}
}  // namespace

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme("amax", ReduceOp::Max, x, dims, keepdim);
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme("amin", ReduceOp::Min, x, dims, keepdim);
}
Tensor max(const Tensor& x) { return amax(x); }
Tensor min(const Tensor& x) { return amin(x); }
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("max_dim", ReduceOp::Max, ReduceOp::ArgMax, x, dim, keepdim);
}
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("min_dim", ReduceOp::Min, ReduceOp::ArgMin, x, dim, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  ops::check_defined(x, "argmax");
  const Shape rdims = ops::reduce_dims(x, {dim}, "argmax");
  ACCEL_CHECK(x.dim() == 0 || x.sizes()[size_t(rdims[0])] > 0, ShapeError, "argmax",
              "cannot reduce over an empty dimension ", dim, " of shape ", x.sizes());
  return ops::reduce_raw(ReduceOp::ArgMax, x.detach(), rdims, keepdim, kInt64);
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  ops::check_defined(x, "argmin");
  const Shape rdims = ops::reduce_dims(x, {dim}, "argmin");
  ACCEL_CHECK(x.dim() == 0 || x.sizes()[size_t(rdims[0])] > 0, ShapeError, "argmin",
              "cannot reduce over an empty dimension ", dim, " of shape ", x.sizes());
  return ops::reduce_raw(ReduceOp::ArgMin, x.detach(), rdims, keepdim, kInt64);
}
Tensor argmax(const Tensor& x) {
  ops::check_defined(x, "argmax");
  ACCEL_CHECK(x.numel() > 0, ShapeError, "argmax", "empty tensor of shape ", x.sizes());
  return argmax(x.detach().reshape({-1}), 0, false);
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  ops::check_defined(x, "var");
  ops::check_floating(x, "var");
  const Shape rdims = ops::reduce_dims(x, dims, "var");
  int64_t n = 1;
  for (int64_t d : rdims) n *= x.sizes()[size_t(d)];
  // Two passes (mean, then squared deviations): stable, and the backward comes from the ops.
  Tensor m = mean(x, rdims, true);
  Tensor dev = sub(x, m);
  Tensor out = sum(mul(dev, dev), rdims, keepdim);
  return div(out, double(std::max<int64_t>(n - correction, 0)));
}

Tensor std_dev(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

Tensor prod(const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "prod");
  const Shape rdims = ops::reduce_dims(x, dims, "prod");
  Tensor out = ops::reduce_raw(ReduceOp::Prod, x, rdims, keepdim, sum_dtype(x.dtype()));
  if (autograd::needs_grad(x)) {
    // d prod / d x_i = prod / x_i (inputs with zeros get the product of the others).
    autograd::record("prod", {&x}, {&out},
                     [xsv = autograd::save_input(x, 0), rdims, keepdim](const autograd::Grads& g) {
                       const Tensor& xs = xsv.unpack();
                       const Shape& in = xs.sizes();
                       Tensor gg = unsqueeze_reduced(g[0], in, rdims, keepdim);
                       // Product of all other elements, computed without division.
                       Tensor is_zero = eq(xs, 0.0);
                       Tensor safe = where(is_zero, ones_like(xs), xs);
                       // Under create_graph the differentiable prod (Note [double backward]).
                       Tensor p_safe =
                           autograd::creating_graph()
                               ? prod(safe, rdims, true)
                               : ops::reduce_raw(ReduceOp::Prod, safe, rdims, true, xs.dtype());
                       Tensor nz = sum(is_zero.to(xs.dtype()), rdims, true);
                       // no zeros: p/x ; one zero: at the zero, product of the rest; else 0
                       Tensor others = where(is_zero, mul(p_safe, eq(nz, 1.0).to(xs.dtype())),
                                             mul(div(p_safe, safe), eq(nz, 0.0).to(xs.dtype())));
                       return autograd::Grads{mul(gg, others)};
                     });
  }
  return out;
}

Tensor norm(const Tensor& x, double p) { return norm(x, p, {}, false); }

Tensor norm(const Tensor& x, std::string_view p, const Shape& dims, bool keepdim) {
  ACCEL_CHECK(p == "fro", ValueError, "norm", "p = \"", p,
              "\" is not supported: p is a number (2, 1, INFINITY, ...) or \"fro\"");
  return norm(x, 2.0, dims, keepdim);
}

// Vector p-norm over dims. Computed without recording, then one node with torch's gradient,
// which is 0 where the norm is 0 (the ops' chain would give 0 * inf there).
Tensor norm(const Tensor& x, double p, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "norm");
  ops::check_floating(x, "norm");
  ACCEL_CHECK(!std::isnan(p), ValueError, "norm", "p must be a number, got nan");
  const Shape rdims = ops::reduce_dims(x, dims, "norm");
  Tensor out;
  {
    NoGradGuard no_grad;
    const Tensor xd = x.detach();
    if (p == 2.0) {
      out = sqrt(sum(mul(xd, xd), rdims, keepdim));
    } else if (p == 1.0) {
      out = sum(abs(xd), rdims, keepdim);
    } else if (std::isinf(p)) {
      out = p > 0 ? amax(abs(xd), rdims, keepdim) : amin(abs(xd), rdims, keepdim);
    } else if (p == 0.0) {
      out = sum(ne(xd, 0.0).to(x.dtype()), rdims, keepdim);
    } else {
      out = pow(sum(pow(abs(xd), p), rdims, keepdim), 1.0 / p);
    }
  }
  if (autograd::needs_grad(x)) {
    autograd::record("norm", {&x}, {&out},
                     [xsv = autograd::save_input(x, 0), nsv = autograd::save_output(out), p, rdims,
                      keepdim](const autograd::Grads& g) {
                       const Tensor& xd = xsv.unpack();
                       const Tensor& nd = nsv.unpack();
                       const Shape& in = xd.sizes();
                       Tensor gk = unsqueeze_reduced(g[0], in, rdims, keepdim);
                       Tensor nk = unsqueeze_reduced(nd, in, rdims, keepdim);
                       Tensor zero = eq(nk, 0.0);
                       if (p == 0.0) {
                         // Zero, but with g's history under create_graph (its derivative is 0).
                         return autograd::Grads{autograd::creating_graph() ? mul(zeros_like(xd), gk)
                                                                           : zeros_like(xd)};
                       }
                       if (p == 1.0) return autograd::Grads{mul(sign(xd), gk)};
                       if (p == 2.0) return autograd::Grads{mul(xd, where(zero, 0.0, div(gk, nk)))};
                       if (std::isinf(p)) {
                         // Shared evenly by the elements at the max (min) |x|, as torch.
                         Tensor at = eq(abs(xd), nk).to(xd.dtype());
                         Tensor share = div(gk, sum(at, rdims, true));
                         return autograd::Grads{mul(mul(sign(xd), share), at)};
                       }
                       if (p < 1.0) {
                         Tensor scaled =
                             where(eq(xd, 0.0), 0.0, mul(sign(xd), pow(abs(xd), p - 1.0)));
                         return autograd::Grads{mul(mul(scaled, gk), pow(nk, 1.0 - p))};
                       }
                       Tensor scaled = p < 2.0 ? mul(sign(xd), pow(abs(xd), p - 1.0))
                                               : mul(xd, pow(abs(xd), p - 2.0));
                       Tensor scale = where(zero, 0.0, div(gk, pow(nk, p - 1.0)));
                       return autograd::Grads{mul(scaled, scale)};
                     });
  }
  return out;
}

Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  return accel::argmax(*this, dim, keepdim);
}

Tensor Tensor::sum() const { return accel::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const {
  return accel::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return accel::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const {
  return accel::mean(*this, dims, keepdim);
}

}  // namespace accel
