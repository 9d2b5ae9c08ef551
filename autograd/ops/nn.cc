// Softmax, normalisation and the classification losses: forward, checks and backward together
// (dropout is in activation.cc).
//   softmax / log_softmax:   x: (...) -> (...) over dim
//   layer_norm / rms_norm:   x: (..., *normalized_shape), weight/bias: normalized_shape
//   group_norm:              x: (N, C, *), weight/bias: (C), fused kernel
//                            (kernels/<backend>/nn_group_norm.*); instance_norm is group_norm
//                            with C groups, or the running statistics
//   cross_entropy, nll_loss: logits: (C) | (N, C) | (N, C, d...), target: () | (N) | (N, d...)
// The fused ops call their own backward kernels (kernels/stubs/nn.h); mse_loss,
// binary_cross_entropy_with_logits and the other elementwise losses are in losses.cc.
#include <array>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "kernels/stubs/nn.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(softmax, "softmax");
ACCEL_DIFFERENTIABLE_OP(log_softmax, "log_softmax");
ACCEL_DIFFERENTIABLE_OP(layer_norm, "layer_norm");
ACCEL_DIFFERENTIABLE_OP(rms_norm, "rms_norm");
ACCEL_DIFFERENTIABLE_OP(group_norm, "group_norm");
ACCEL_DIFFERENTIABLE_OP(instance_norm, "instance_norm");
ACCEL_DIFFERENTIABLE_OP(cross_entropy, "cross_entropy");
ACCEL_DIFFERENTIABLE_OP(nll_loss, "nll_loss");

namespace {

Tensor contiguous_data(const Tensor& t) { return t.is_contiguous() ? t : t.detach().contiguous(); }

// The incoming gradient as a contiguous tensor of dtype dt.
Tensor grad_input(const Tensor& g, DType dt) { return ops::as_dtype(g, dt).contiguous(); }

// ---------------- softmax ----------------

// The backward kernel's formula from differentiable ops, for create_graph (Note [double
// backward] in autograd/engine.h): softmax dx = y (g - sum(g y)), log_softmax dx = g - exp(y)
// sum(g), sums over dim d. A 0-dim input's row has one element: the gradient is 0.
Tensor softmax_grad(const Tensor& g, const Tensor& y, int64_t d, bool log) {
  if (y.dim() == 0) return mul(g, 0.0);
  if (log) return sub(g, mul(exp(y), sum(g, {d}, true)));
  return mul(y, sub(g, sum(mul(g, y), {d}, true)));
}

Tensor softmax_impl(const char* op, const Tensor& x, int64_t dim, bool log) {
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  // A 0-dim tensor has one "row" of length 1, addressed as dim 0 or -1 (as in PyTorch).
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op);
  Tensor y = ops::empty_on(x.sizes(), x.dtype(), x.device());
  softmax_stub(x.device(), contiguous_data(x), d, log, y);
  if (autograd::needs_grad(x)) {
    autograd::record(
        op, {&x}, {&y}, [ys = autograd::save_output(y), d, log](const autograd::Grads& g) {
          const Tensor yd = ys.unpack();
          if (autograd::creating_graph()) return autograd::Grads{softmax_grad(g[0], yd, d, log)};
          Tensor dx = ops::empty_on(yd.sizes(), yd.dtype(), yd.device());
          softmax_backward_stub(yd.device(), grad_input(g[0], yd.dtype()), yd, d, log, dx);
          return autograd::Grads{dx};
        });
  }
  return y;
}

// ---------------- normalisation ----------------

// normalized_shape must be the trailing dims of x; returns the row length.
int64_t check_norm_input(const char* op, const Tensor& x, const Shape& normalized_shape) {
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  ACCEL_CHECK(!normalized_shape.empty(), ShapeError, op,
              "normalized_shape must name at least one dim (input shape ", x.sizes(), ")");
  const size_t k = normalized_shape.size(), nd = size_t(x.dim());
  bool ok = nd >= k;
  for (size_t i = 0; ok && i < k; ++i) ok = x.sizes()[nd - k + i] == normalized_shape[i];
  ACCEL_CHECK(ok, ShapeError, op, "input of shape ", x.sizes(),
              " does not end with normalized_shape ", normalized_shape);
  return shape_numel(normalized_shape);
}

void check_norm_param(const char* op, const char* what, const Tensor& p, const Tensor& x,
                      const Shape& normalized_shape) {
  if (!p.defined()) return;
  ACCEL_CHECK(p.sizes() == normalized_shape, ShapeError, op, what, " of shape ", p.sizes(),
              " does not match normalized_shape ", normalized_shape, " (input shape ", x.sizes(),
              ")");
  ops::check_same_device(x, p, op);
  // Note [mixed-dtype norms] in kernels/cpu/nn_norm.cc: a 16-bit input may have float32
  // parameters on the CPU.
  const bool mixed_ok = p.dtype() == kFloat32 && is_low_precision(x) && x.device().is_cpu();
  ACCEL_CHECK(p.dtype() == x.dtype() || mixed_ok, DTypeError, op, what, " has dtype ", p.dtype(),
              " but the input has ", x.dtype(), " on ", x.device(), " (shapes ", p.sizes(), " and ",
              x.sizes(), "); only a bfloat16/float16 input on the CPU takes float32 parameters");
}

// The dtype of a norm's parameter gradient: the parameter's (float32 for a 16-bit x, Note
// [mixed-dtype norms]), x's when absent.
DType param_dtype(const Tensor& p, const Tensor& x) { return p.defined() ? p.dtype() : x.dtype(); }

Tensor maybe_contiguous(const Tensor& t) { return t.defined() ? contiguous_data(t) : t; }

// `copy` when it is the op's own contiguous copy of `t`, else undefined (t itself is saved).
Tensor own_copy(const Tensor& copy, const Tensor& t) {
  return copy.defined() && !copy.is_same(t) ? copy : Tensor();
}

// layer_norm (rms: rms_norm) from differentiable ops, statistics over the trailing dims of
// normalized_shape: the form the create_graph backward differentiates (Note [double backward by
// recompute]).
Tensor layer_norm_composed(const Tensor& x, const Shape& normalized_shape, const Tensor& w,
                           const Tensor& b, double eps, bool rms) {
  Shape dims;
  for (size_t i = 0; i < normalized_shape.size(); ++i)
    dims.push_back(x.dim() - int64_t(normalized_shape.size()) + int64_t(i));
  Tensor y;
  if (rms) {
    y = mul(x, rsqrt(add(mean(mul(x, x), dims, true), eps)));
  } else {
    const Tensor c = sub(x, mean(x, dims, true));
    y = mul(c, rsqrt(add(mean(mul(c, c), dims, true), eps)));
  }
  if (w.defined()) y = mul(y, w);
  if (b.defined()) y = add(y, b);
  return y;
}

// ---------------- losses ----------------

void check_class_target(const char* op, const Tensor& x, const Tensor& t) {
  ops::check_defined(x, op, "input");
  ops::check_defined(t, op, "target");
  ops::check_floating(x, op, "input");
  ACCEL_CHECK(t.dtype() == kInt64 || t.dtype() == kInt32, DTypeError, op,
              "target must hold class indices (int64 or int32), got ", t.dtype(), " of shape ",
              t.sizes());
  ops::check_same_device(x, t, op);
}

// cross_entropy's floating target is class probabilities only with the input's shape; any other
// is a class-index target of the wrong dtype (as in torch), said with both shapes.
void check_not_misshapen_probs(const Tensor& logits, const Tensor& target) {
  ACCEL_CHECK(!target.is_floating_point(), DTypeError, "cross_entropy",
              "target must hold class indices (int64 or int32) or class probabilities of the "
              "input's shape ",
              logits.sizes(), "; got ", target.dtype(), " of shape ", target.sizes());
}

// The class dim moved last and flattened: x2: (R, C) contiguous (through differentiable views,
// so gradients flow back to the caller's layout), t1: (R). none_shape: the per-element loss.
struct ClassRows {
  Tensor x2, t1;
  Shape none_shape;
};

ClassRows class_rows(const char* op, const Tensor& x, const Tensor& t) {
  ACCEL_CHECK(x.dim() >= 1, ShapeError, op,
              "expected input of shape (C), (N, C) or (N, C, d...), got ", x.sizes());
  ClassRows r;
  if (x.dim() == 1) {
    ACCEL_CHECK(t.dim() == 0, ShapeError, op, "unbatched input of shape ", x.sizes(),
                " needs a 0-dim target, got shape ", t.sizes());
    ACCEL_CHECK(x.sizes()[0] > 0, ShapeError, op, "input of shape ", x.sizes(), " has no classes");
    r.x2 = x.unsqueeze(0).contiguous();
    r.t1 = t.reshape({1});
    return r;
  }
  Shape expect;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) expect.push_back(x.sizes()[size_t(d)]);
  ACCEL_CHECK(t.sizes() == expect, ShapeError, op, "expected target of shape ", expect,
              " for input of shape ", x.sizes(), ", got ", t.sizes());
  const int64_t c = x.sizes()[1];
  ACCEL_CHECK(c > 0, ShapeError, op, "input of shape ", x.sizes(), " has no classes");
  if (x.dim() == 2) {
    r.x2 = x.contiguous();
  } else {
    Shape perm{0};
    for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    r.x2 = x.permute(perm).reshape({-1, c}).contiguous();
  }
  r.t1 = t.reshape({-1}).contiguous();
  r.none_shape = expect;
  return r;
}

// Per-row losses -> the requested reduction. `valid` is the count of rows not ignored: the mean
// is over those only, as in PyTorch.
Tensor reduce_rows(const Tensor& loss, const Tensor& valid, Reduction r, const Shape& none_shape) {
  switch (r) {
    case Reduction::None:
      return ops::make_view(loss, none_shape, contiguous_strides(none_shape), loss.offset());
    case Reduction::Sum: return sum(loss);
    case Reduction::BatchMean:  // refused at the entry points
    case Reduction::Mean: return div(sum(loss), valid);
  }
  return loss;
}

// Gradient per row for the backward kernels: one element (broadcast) or (R).
Tensor row_grad(const Tensor& g, const Tensor& valid, Reduction r, DType dt) {
  Tensor gg = ops::as_dtype(g, dt);
  if (r == Reduction::Mean) return div(gg, valid);
  if (r == Reduction::None) return gg.reshape({-1}).contiguous();
  return gg;
}

// The backward kernels of cross_entropy and nll_loss from differentiable ops, for create_graph
// (Note [double backward] in autograd/engine.h): rows (R, C) of p (the softmax of the logits for
// cross_entropy, zeros for nll_loss) minus the target distribution q = (1 - ls) onehot(t) + ls / C,
// times the row gradient rg (() or (R)), zero on ignored rows.
Tensor class_rows_grad(const Tensor& p, const Tensor& t1, const Tensor& rg, int64_t ignore_index,
                       double label_smoothing) {
  const int64_t c = p.size(1);
  Tensor onehot, keep;
  {
    NoGradGuard no_grad;
    const Tensor t = t1.to(kInt64);
    const Tensor valid = ne(t, Scalar(ignore_index));
    const Tensor classes = arange(c, TensorOptions(kInt64, p.device())).view({1, c});
    onehot = eq(classes, where(valid, t, Scalar(int64_t(0))).unsqueeze(1)).to(p.dtype());
    keep = valid.to(p.dtype()).unsqueeze(1);
  }
  Tensor q = onehot;
  if (label_smoothing > 0) q = add(mul(onehot, 1.0 - label_smoothing), label_smoothing / double(c));
  return mul(mul(sub(p, q), keep), rg.dim() == 0 ? rg : rg.unsqueeze(1));
}

}  // namespace

// Under autocast softmax and log_softmax run in float32 (Note [autocast in ops]).
Tensor softmax(const Tensor& x, int64_t dim) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x))) return softmax(autocast_upcast(x), dim);
  return softmax_impl("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x))) return log_softmax(autocast_upcast(x), dim);
  return softmax_impl("log_softmax", x, dim, true);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x, weight, bias))) {
    // Note [autocast norms]: on the CPU a 16-bit x stays 16-bit (float32 statistics and
    // parameters, Note [mixed-dtype norms] in kernels/cpu/nn_norm.cc), as in PyTorch >= 2.0:
    // no upcast of x before and no downcast of y for the next linear after. Elsewhere (and for a
    // float32 x with 16-bit parameters) everything runs in float32.
    if (is_low_precision(x) && x.device().is_cpu()) {
      const Tensor w32 = autocast_upcast(weight), b32 = autocast_upcast(bias);
      AutocastSuspend off;
      return layer_norm(x, normalized_shape, w32, b32, eps);
    }
    return layer_norm(autocast_upcast(x), normalized_shape, autocast_upcast(weight),
                      autocast_upcast(bias), eps);
  }
  const char* op = "layer_norm";
  const int64_t n = check_norm_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape);
  check_norm_param(op, "bias", bias, x, normalized_shape);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor xc = contiguous_data(x), wc = maybe_contiguous(weight), bc = maybe_contiguous(bias);
  Tensor y = ops::empty_on(x.sizes(), x.dtype(), x.device());
  Tensor mu = ops::empty_on({rows}, acc_dtype(x.dtype()), x.device());
  Tensor rs = ops::empty_on({rows}, acc_dtype(x.dtype()), x.device());
  layer_norm_stub(x.device(), xc, wc, bc, n, eps, y, mu, rs);
  if (autograd::needs_grad(x, weight, bias)) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    // x and the parameters are saved as given (their history: Note [double backward by
    // recompute]); xc / wc only when they are the op's own contiguous copies.
    autograd::record(
        op, {&x, &weight, &bias}, {&y},
        // mu and rs are the op's own statistics: nobody else can write them.
        [xs = autograd::save_input(x, 0), ws = autograd::save_input(weight, 1),
         bs = autograd::save_input(bias, 2), xown = own_copy(xc, x), wown = own_copy(wc, weight),
         mu, rs, n, ns = normalized_shape, eps, gx, gw, gb, wdt = param_dtype(weight, x),
         bdt = param_dtype(bias, x)](const autograd::Grads& g) {
          if (autograd::creating_graph()) {
            return autograd::recompute_grads({xs.unpack(), ws.unpack(), bs.unpack()}, g,
                                             [&ns, eps](const std::vector<Tensor>& in) {
                                               return std::vector<Tensor>{layer_norm_composed(
                                                   in[0], ns, in[1], in[2], eps, false)};
                                             });
          }
          const Tensor xd = xown.defined() ? xown : xs.unpack();
          const Tensor wd = wown.defined() ? wown : ws.unpack();
          const DType dt = xd.dtype();
          const Device dev = xd.device();
          Tensor dx = gx ? ops::empty_on(xd.sizes(), dt, dev) : Tensor();
          Tensor dw = gw ? ops::empty_on(ns, wdt, dev) : Tensor();
          Tensor db = gb ? ops::empty_on(ns, bdt, dev) : Tensor();
          layer_norm_backward_stub(dev, grad_input(g[0], dt), xd, mu, rs, wd, n, dx, dw, db);
          return autograd::Grads{dx, dw, db};
        });
  }
  return y;
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x, weight))) {
    if (is_low_precision(x) && x.device().is_cpu()) {  // Note [autocast norms] (layer_norm)
      const Tensor w32 = autocast_upcast(weight);
      AutocastSuspend off;
      return rms_norm(x, normalized_shape, w32, eps);
    }
    return rms_norm(autocast_upcast(x), normalized_shape, autocast_upcast(weight), eps);
  }
  const char* op = "rms_norm";
  const int64_t n = check_norm_input(op, x, normalized_shape);
  check_norm_param(op, "weight", weight, x, normalized_shape);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor xc = contiguous_data(x), wc = maybe_contiguous(weight);
  Tensor y = ops::empty_on(x.sizes(), x.dtype(), x.device());
  Tensor rs = ops::empty_on({rows}, acc_dtype(x.dtype()), x.device());
  rms_norm_stub(x.device(), xc, wc, n, eps, y, rs);
  if (autograd::needs_grad(x, weight)) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad();
    autograd::record(
        op, {&x, &weight}, {&y},
        [xs = autograd::save_input(x, 0), ws = autograd::save_input(weight, 1),
         xown = own_copy(xc, x), wown = own_copy(wc, weight), rs, n, ns = normalized_shape, eps, gx,
         gw, wdt = param_dtype(weight, x)](const autograd::Grads& g) {
          if (autograd::creating_graph()) {  // Note [double backward by recompute]
            return autograd::recompute_grads(
                {xs.unpack(), ws.unpack()}, g, [&ns, eps](const std::vector<Tensor>& in) {
                  return std::vector<Tensor>{
                      layer_norm_composed(in[0], ns, in[1], Tensor(), eps, true)};
                });
          }
          const Tensor xd = xown.defined() ? xown : xs.unpack();
          const Tensor wd = wown.defined() ? wown : ws.unpack();
          const DType dt = xd.dtype();
          const Device dev = xd.device();
          Tensor dx = gx ? ops::empty_on(xd.sizes(), dt, dev) : Tensor();
          Tensor dw = gw ? ops::empty_on(ns, wdt, dev) : Tensor();
          rms_norm_backward_stub(dev, grad_input(g[0], dt), xd, rs, wd, n, dx, dw);
          return autograd::Grads{dx, dw};
        });
  }
  return y;
}

// ---------------- group_norm / instance_norm ----------------

namespace {
// group_norm from differentiable ops: the form its create_graph backward differentiates (Note
// [double backward by recompute] in autograd/function.h). x (N, C, *), w / b (C) or undefined.
Tensor group_norm_composed(const Tensor& x, int64_t groups, const Tensor& w, const Tensor& b,
                           double eps) {
  const Tensor xr = x.reshape({x.size(0), groups, -1});
  const Tensor c = sub(xr, mean(xr, {2}, true));
  Tensor y = mul(c, rsqrt(add(mean(mul(c, c), {2}, true), eps))).reshape(x.sizes());
  Shape ps(size_t(x.dim()), 1);
  ps[1] = x.size(1);
  if (w.defined()) y = mul(y, w.reshape(ps));
  if (b.defined()) y = add(y, b.reshape(ps));
  return y;
}
}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x, weight, bias)))
    return group_norm(autocast_upcast(x), num_groups, autocast_upcast(weight),
                      autocast_upcast(bias), eps);
  const char* op = "group_norm";
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  ACCEL_CHECK(x.dim() >= 2, ShapeError, op, "expected an input (N, C, *), got ", x.sizes());
  const int64_t c = x.size(1);
  ACCEL_CHECK(num_groups >= 1 && c % num_groups == 0, ValueError, op, "num_groups (", num_groups,
              ") must be positive and divide the ", c, " channels of the input ", x.sizes());
  ACCEL_CHECK(eps >= 0, ValueError, op, "eps must be non-negative, got ", eps);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    ops::check_same_device(x, *p, op);
    ACCEL_CHECK(p->dtype() == x.dtype(), DTypeError, op, what, " ", p->dtype(), " and input ",
                x.dtype(), " differ in dtype");
    ACCEL_CHECK(p->dim() == 1 && p->size(0) == c, ShapeError, op, what, " must have shape ",
                Shape{c}, " for input ", x.sizes(), ", got ", p->sizes());
  }
  const Tensor xc = contiguous_data(x), wc = maybe_contiguous(weight), bc = maybe_contiguous(bias);
  const int64_t n = x.size(0);
  Tensor y = ops::empty_on(x.sizes(), x.dtype(), x.device());
  Tensor mu = ops::empty_on({n, num_groups}, acc_dtype(x.dtype()), x.device());
  Tensor rs = ops::empty_on({n, num_groups}, acc_dtype(x.dtype()), x.device());
  group_norm_stub(x.device(), xc, wc, bc, num_groups, eps, y, mu, rs);
  if (autograd::needs_grad(x, weight, bias)) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    autograd::record(op, {&x, &weight, &bias}, {&y},
                     // mu and rs are the op's own statistics: nobody else can write them.
                     // x and the parameters as given, for the create_graph backward (Note
                     // [double backward by recompute]); xc / wc when they are the op's copies.
                     [xs = autograd::save_input(x, 0), ws = autograd::save_input(weight, 1),
                      bs = autograd::save_input(bias, 2), xown = xc.is_same(x) ? Tensor() : xc,
                      wown = !wc.defined() || wc.is_same(weight) ? Tensor() : wc, mu, rs,
                      num_groups, eps, gx, gw, gb](const autograd::Grads& g) {
                       if (autograd::creating_graph()) {
                         return autograd::recompute_grads(
                             {xs.unpack(), ws.unpack(), bs.unpack()}, g,
                             [num_groups, eps](const std::vector<Tensor>& in) {
                               return std::vector<Tensor>{
                                   group_norm_composed(in[0], num_groups, in[1], in[2], eps)};
                             });
                       }
                       const Tensor xd = xown.defined() ? xown : xs.unpack();
                       const Tensor wd = wown.defined() ? wown : ws.unpack();
                       const DType dt = xd.dtype();
                       const Device dev = xd.device();
                       const Shape cs{xd.size(1)};
                       Tensor dx = gx ? ops::empty_on(xd.sizes(), dt, dev) : Tensor();
                       Tensor dw = gw ? ops::empty_on(cs, dt, dev) : Tensor();
                       Tensor db = gb ? ops::empty_on(cs, dt, dev) : Tensor();
                       const Tensor go = ops::as_dtype(g[0], dt).contiguous();
                       group_norm_backward_stub(dev, go, xd, mu, rs, wd, num_groups, dx, dw, db);
                       return autograd::Grads{dx, dw, db};
                     });
  }
  return y;
}

Tensor instance_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool use_input_stats,
                     double momentum, double eps) {
  const char* op = "instance_norm";
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  ACCEL_CHECK(x.dim() >= 3, ShapeError, op,
              "expected an input (N, C, *) with at least one "
              "spatial dim, got ",
              x.sizes());
  const int64_t c = x.size(1);
  ACCEL_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
              "running_mean and running_var must both be given or both be undefined");
  for (const Tensor* p : {&running_mean, &running_var}) {
    if (!p->defined()) continue;
    ops::check_same_device(x, *p, op);
    ACCEL_CHECK(p->dim() == 1 && p->size(0) == c, ShapeError, op, "running statistics must have ",
                "shape ", Shape{c}, " for input ", x.sizes(), ", got ", p->sizes());
  }
  Shape bshape(size_t(x.dim()), 1);  // (1, C, 1...) to broadcast per channel
  bshape[1] = c;
  if (!use_input_stats) {
    ACCEL_CHECK(running_mean.defined(), ValueError, op,
                "use_input_stats=false needs running_mean and running_var");
    const Tensor mu = running_mean.detach().to(x.dtype()).view(bshape);
    const Tensor inv = rsqrt(add(running_var.detach().to(x.dtype()), eps)).view(bshape);
    Tensor y = mul(sub(x, mu), inv);
    if (weight.defined()) y = mul(y, weight.view(bshape));
    if (bias.defined()) y = add(y, bias.view(bshape));
    return y;
  }
  const Tensor y = group_norm(x, c, weight, bias, eps);
  if (running_mean.defined()) {
    // torch runs batch_norm on (1, N C, *) with the running statistics repeated N times, then
    // averages them over N: running = (1 - m) running + m mean_n(batch statistic of (n, c)), with
    // the unbiased variance.
    NoGradGuard ng;
    Shape dims;
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    const int64_t s = x.numel() / std::max<int64_t>(x.size(0) * c, 1);
    ACCEL_CHECK(s > 1, ValueError, op,
                "expected more than 1 spatial element per channel to "
                "update the running variance, got input ",
                x.sizes());
    const Tensor xd = x.detach();
    const Tensor m_nc = mean(xd, dims), v_nc = var(xd, dims, 1);  // (N, C)
    Tensor rm = running_mean, rv = running_var;
    rm.mul_(1.0 - momentum).add_(mean(m_nc, {0}).to(rm.dtype()), momentum);
    rv.mul_(1.0 - momentum).add_(mean(v_nc, {0}).to(rv.dtype()), momentum);
  }
  return y;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     Reduction reduction, double label_smoothing) {
  // Note [autocast cross-entropy]: under autocast cross-entropy is a float32 op (as torch's). On
  // the CPU the kernel reads 16-bit logits of class-index targets as they are, in float32, and
  // keeps float32 losses and row gradients: the same values as on an upcast copy, without the
  // copy (B T V elements, the largest activation of a language model) and without casting the
  // float32 gradient of that copy back (gpt bf16 forward + backward 1.9 ms per step on the Intel
  // AMX kind, 3.4 on the AMD kind before: docs/performance.md).
  bool keep16 = false;
  if (ACCEL_UNLIKELY(autocast_wants_upcast(logits))) {
    keep16 = logits.device().is_cpu() && is_low_precision(logits) && target.defined() &&
             !target.is_floating_point();
    if (!keep16)
      return cross_entropy(autocast_upcast(logits), target, ignore_index, reduction,
                           label_smoothing);
  }
  const char* op = "cross_entropy";
  ops::check_not_batchmean(reduction, op);
  // Class probabilities: a floating target of the input's shape (else class indices, as torch).
  if (target.defined() && logits.defined() && target.is_floating_point() &&
      target.sizes() == logits.sizes())
    return cross_entropy(logits, target, Tensor(), ignore_index, reduction, label_smoothing);
  if (target.defined() && logits.defined()) check_not_misshapen_probs(logits, target);
  check_class_target(op, logits, target);
  ACCEL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, op,
              "label_smoothing must be in [0, 1], got ", label_smoothing);
  ClassRows cr = class_rows(op, logits, target);
  const int64_t rows = cr.x2.sizes()[0];
  const DType dt = logits.dtype();
  const Device dev = logits.device();
  const DType out_dt = keep16 ? acc_dtype(dt) : dt;  // the losses' and the row gradients' dtype
  Tensor loss = ops::empty_on({rows}, out_dt, dev);
  Tensor lse = ops::empty_on({rows}, acc_dtype(dt), dev);
  Tensor valid = ops::empty_on({}, out_dt, dev);
  cross_entropy_stub(dev, cr.x2, cr.t1, ignore_index, label_smoothing, op, loss, lse, valid);
  Tensor out = reduce_rows(loss, valid, reduction, cr.none_shape);
  if (autograd::needs_grad(cr.x2)) {
    autograd::record(
        op, {&cr.x2}, {&out},
        // lse and valid are the op's own; logits rows and targets are the caller's.
        [xs = autograd::save_input(cr.x2, 0), ts = autograd::save_input(cr.t1, 1), lse, valid,
         reduction, ignore_index, label_smoothing, out_dt](const autograd::Grads& g) {
          const Tensor xd = xs.unpack();
          const Tensor t1 = ts.unpack();
          if (autograd::creating_graph()) {
            return autograd::Grads{
                ops::as_dtype(class_rows_grad(softmax(ops::as_dtype(xd, out_dt), 1), t1,
                                              row_grad(g[0], valid, reduction, out_dt),
                                              ignore_index, label_smoothing),
                              xd.dtype())};
          }
          Tensor dx = ops::empty_on(xd.sizes(), xd.dtype(), xd.device());
          cross_entropy_backward_stub(xd.device(), row_grad(g[0], valid, reduction, out_dt), xd, t1,
                                      lse, ignore_index, label_smoothing, dx);
          return autograd::Grads{dx};
        });
  }
  return out;
}

// Note [cross_entropy with weights or probabilities]: composed from log_softmax and reductions
// (autograd from the ops), with torch's formulas. C classes along dim 1 (dim 0 unbatched), w the
// weights viewed along that dim (1 when undefined), ls the label smoothing:
//   probabilities t (logits' shape): t' = t (1 - ls) + ls / C, l = -sum_c w_c t'_c log p_c;
//     mean divides by the number of rows (numel / C), not by the weights.
//   class indices y, ignore_index masked out (m = y != ignore_index):
//     nll = -w_y log p_y m; mean divides by sum w_y m.
//     smooth = -sum_c w_c log p_c m; mean divides by the same sum w_y m.
//     l = (1 - ls) nll + ls / C smooth.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     int64_t ignore_index, Reduction reduction, double label_smoothing) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(logits)))
    return cross_entropy(autocast_upcast(logits), target, autocast_upcast(weight), ignore_index,
                         reduction, label_smoothing);
  const char* op = "cross_entropy";
  ops::check_not_batchmean(reduction, op);
  ops::check_defined(logits, op, "input");
  ops::check_defined(target, op, "target");
  ops::check_floating(logits, op, "input");
  ops::check_same_device(logits, target, op);
  ACCEL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, op,
              "label_smoothing must be in [0, 1], got ", label_smoothing);
  ACCEL_CHECK(logits.dim() >= 1, ShapeError, op,
              "expected input of shape (C), (N, C) or (N, C, d...), got ", logits.sizes());
  const int64_t cdim = logits.dim() == 1 ? 0 : 1;
  const int64_t c = logits.sizes()[size_t(cdim)];
  ACCEL_CHECK(c > 0, ShapeError, op, "input of shape ", logits.sizes(), " has no classes");
  Tensor w;  // weight viewed along the class dim, in the logits' dtype
  if (weight.defined()) {
    ops::check_floating(weight, op, "weight");
    ops::check_same_device(logits, weight, op);
    ACCEL_CHECK(weight.dim() == 1 && weight.sizes()[0] == c, ShapeError, op, "weight of shape ",
                weight.sizes(), " must be (C) = (", c, ") for input of shape ", logits.sizes());
    Shape ws(size_t(logits.dim()), 1);
    ws[size_t(cdim)] = c;
    w = ops::as_dtype(weight, logits.dtype()).reshape(ws);
  }
  Tensor lsm = log_softmax(logits, cdim);
  if (target.is_floating_point() && target.sizes() == logits.sizes()) {
    ACCEL_CHECK(ignore_index == -100, ValueError, op,
                "ignore_index is not supported with probability targets (got ", ignore_index, ")");
    Tensor t = ops::as_dtype(target, logits.dtype());
    if (label_smoothing > 0) t = add(mul(t, 1.0 - label_smoothing), label_smoothing / double(c));
    Tensor prod = mul(lsm, t);
    if (w.defined()) prod = mul(prod, w);
    switch (reduction) {
      case Reduction::None: return neg(sum(prod, {cdim}));
      case Reduction::Sum: return neg(sum(prod));
      case Reduction::BatchMean:  // refused at the entry points
      case Reduction::Mean: return div(neg(sum(prod)), double(logits.numel() / c));
    }
  }
  check_not_misshapen_probs(logits, target);
  if (!weight.defined())
    return cross_entropy(logits, target, ignore_index, reduction, label_smoothing);
  check_class_target(op, logits, target);
  (void)class_rows(op, logits, target);  // the target shape check
  Tensor valid = ne(target, Scalar(ignore_index));
  Tensor safe = where(valid, target, Scalar(int64_t(0)));
  {
    NoGradGuard no_grad;
    Tensor bad = logical_and(valid, logical_or(lt(safe, 0), ge(safe, Scalar(c))));
    if (bad.numel() > 0 && sum(bad).item<int64_t>() > 0) {
      const int64_t pos = argmax(bad.reshape({-1}).to(kInt32)).item<int64_t>();
      ACCEL_THROW(IndexError, op, "target ", target.reshape({-1}).select(0, pos).item<int64_t>(),
                  " at position ", pos, " is out of bounds for ", c, " classes (ignore_index is ",
                  ignore_index, ")");
    }
  }
  Tensor picked = gather(lsm, cdim, safe.unsqueeze(cdim)).squeeze(cdim);
  Tensor validf = valid.to(logits.dtype());
  Tensor wy = mul(index_select(ops::as_dtype(weight, logits.dtype()), 0, safe.reshape({-1}))
                      .reshape(target.sizes()),
                  validf);
  Tensor nll = neg(mul(picked, wy));
  Tensor smooth;
  if (label_smoothing > 0) smooth = mul(neg(sum(mul(lsm, w), {cdim})), validf);
  auto reduce = [&](const Tensor& l) {
    switch (reduction) {
      case Reduction::None: return l;
      case Reduction::Sum: return sum(l);
      case Reduction::BatchMean:  // refused at the entry points
      case Reduction::Mean: return div(sum(l), sum(wy));
    }
    return l;
  };
  Tensor out = reduce(nll);
  if (!smooth.defined()) return out;
  return add(mul(out, 1.0 - label_smoothing), mul(reduce(smooth), label_smoothing / double(c)));
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                Reduction reduction) {
  return nll_loss(log_probs, target, Tensor(), ignore_index, reduction);
}

// torch's weighted nll_loss: row r with class t = target[r] (not ignore_index) loses
// -w[t] log_probs[r, t]; the mean divides the sum by the sum of w[t] over those rows (not by their
// count), so mean and sum differ by that weight total. The kernels do both (nll_loss_stub); the
// weight is a constant, as in torch, whose weight has no derivative.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                int64_t ignore_index, Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(log_probs)))
    return nll_loss(autocast_upcast(log_probs), target, autocast_upcast(weight), ignore_index,
                    reduction);
  const char* op = "nll_loss";
  ops::check_not_batchmean(reduction, op);
  check_class_target(op, log_probs, target);
  ClassRows cr = class_rows(op, log_probs, target);
  const int64_t rows = cr.x2.sizes()[0];
  const DType dt = log_probs.dtype();
  const Device dev = log_probs.device();
  Tensor w;  // (C) contiguous in the input's dtype, or undefined
  if (weight.defined()) {
    const int64_t c = cr.x2.sizes()[1];
    ops::check_floating(weight, op, "weight");
    ops::check_same_device(log_probs, weight, op);
    ACCEL_CHECK(weight.dim() == 1 && weight.sizes()[0] == c, ShapeError, op, "weight of shape ",
                weight.sizes(), " must be (C) = (", c, ") for input of shape ", log_probs.sizes());
    ACCEL_CHECK(!(weight.requires_grad() && grad_enabled()), ValueError, op,
                "the derivative for 'weight' is not implemented (as in torch): pass a weight "
                "that does not require grad, e.g. weight.detach()");
    w = contiguous_data(ops::as_dtype(weight, dt));
  }
  Tensor loss = ops::empty_on({rows}, dt, dev);
  Tensor valid = ops::empty_on({}, dt, dev);
  nll_loss_stub(dev, cr.x2, cr.t1, w, ignore_index, op, loss, valid);
  Tensor out = reduce_rows(loss, valid, reduction, cr.none_shape);
  if (autograd::needs_grad(cr.x2)) {
    autograd::record(
        op, {&cr.x2}, {&out},
        // The weight may be the caller's own tensor (already in the input's
        // dtype): saved, so changing it in place before backward is a version error.
        [shape = cr.x2.sizes(), dt, dev, ts = autograd::save_input(cr.t1, 1),
         ws = autograd::save_input(w, 2), valid, reduction,
         ignore_index](const autograd::Grads& g) {
          if (autograd::creating_graph()) {
            // dx[n, t_n] = -w[t_n] * row gradient (Note [double backward])
            const Tensor t = ts.unpack();
            Tensor rg = row_grad(g[0], valid, reduction, dt);
            const Tensor& wt = ws.unpack();
            if (wt.defined()) {
              Tensor tw;
              {
                NoGradGuard no_grad;
                const Tensor ti = t.to(kInt64);
                tw = index_select(wt, 0,
                                  where(ne(ti, Scalar(ignore_index)), ti, Scalar(int64_t(0))));
              }
              rg = mul(rg, tw);
            }
            return autograd::Grads{
                class_rows_grad(zeros(shape, TensorOptions(dt, dev)), t, rg, ignore_index, 0.0)};
          }
          Tensor dx = ops::empty_on(shape, dt, dev);
          nll_loss_backward_stub(dev, row_grad(g[0], valid, reduction, dt), ts.unpack(),
                                 ws.unpack(), ignore_index, dx);
          return autograd::Grads{dx};
        });
  }
  return out;
}

}  // namespace accel
