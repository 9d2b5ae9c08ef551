// Softmax, normalisation and the classification losses: forward, checks and backward together
// (dropout is in activation.cc).
//   softmax / log_softmax:   x: (...) -> (...) over dim
//   layer_norm / rms_norm:   x: (..., *normalized_shape), weight/bias: normalized_shape
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
ACCEL_DIFFERENTIABLE_OP(cross_entropy, "cross_entropy");
ACCEL_DIFFERENTIABLE_OP(nll_loss, "nll_loss");

namespace {

Tensor contiguous_data(const Tensor& t) { return t.is_contiguous() ? t : t.detach().contiguous(); }

// The incoming gradient as a contiguous tensor of dtype dt.
Tensor grad_input(const Tensor& g, DType dt) { return ops::as_dtype(g, dt).contiguous(); }

// ---------------- softmax ----------------

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
          const Tensor& yd = ys.unpack();
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
    autograd::record(op, {&x, &weight, &bias}, {&y},
                     // mu and rs are the op's own statistics: nobody else can write them.
                     [xs = autograd::save_input(xc, 0), ws = autograd::save_input(wc, 1), mu, rs, n,
                      ns = normalized_shape, gx, gw, gb, wdt = param_dtype(weight, x),
                      bdt = param_dtype(bias, x)](const autograd::Grads& g) {
                       const Tensor& xd = xs.unpack();
                       const Tensor& wd = ws.unpack();
                       const DType dt = xd.dtype();
                       const Device dev = xd.device();
                       Tensor dx = gx ? ops::empty_on(xd.sizes(), dt, dev) : Tensor();
                       Tensor dw = gw ? ops::empty_on(ns, wdt, dev) : Tensor();
                       Tensor db = gb ? ops::empty_on(ns, bdt, dev) : Tensor();
                       layer_norm_backward_stub(dev, grad_input(g[0], dt), xd, mu, rs, wd, n, dx,
                                                dw, db);
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
        [xs = autograd::save_input(xc, 0), ws = autograd::save_input(wc, 1), rs, n,
         ns = normalized_shape, gx, gw, wdt = param_dtype(weight, x)](const autograd::Grads& g) {
          const Tensor& xd = xs.unpack();
          const Tensor& wd = ws.unpack();
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

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     Reduction reduction, double label_smoothing) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(logits)))
    return cross_entropy(autocast_upcast(logits), target, ignore_index, reduction, label_smoothing);
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
  Tensor loss = ops::empty_on({rows}, dt, dev);
  Tensor lse = ops::empty_on({rows}, acc_dtype(dt), dev);
  Tensor valid = ops::empty_on({}, dt, dev);
  cross_entropy_stub(dev, cr.x2, cr.t1, ignore_index, label_smoothing, op, loss, lse, valid);
  Tensor out = reduce_rows(loss, valid, reduction, cr.none_shape);
  if (autograd::needs_grad(cr.x2)) {
    autograd::record(op, {&cr.x2}, {&out},
                     // lse and valid are the op's own; logits rows and targets are the caller's.
                     [xs = autograd::save_input(cr.x2, 0), ts = autograd::save_input(cr.t1, 1), lse,
                      valid, reduction, ignore_index, label_smoothing](const autograd::Grads& g) {
                       const Tensor& xd = xs.unpack();
                       const Tensor& t1 = ts.unpack();
                       Tensor dx = ops::empty_on(xd.sizes(), xd.dtype(), xd.device());
                       cross_entropy_backward_stub(xd.device(),
                                                   row_grad(g[0], valid, reduction, xd.dtype()), xd,
                                                   t1, lse, ignore_index, label_smoothing, dx);
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
    autograd::record(op, {&cr.x2}, {&out},
                     // The weight may be the caller's own tensor (already in the input's
                     // dtype): saved, so changing it in place before backward is a version error.
                     [shape = cr.x2.sizes(), dt, dev, ts = autograd::save_input(cr.t1, 1),
                      ws = autograd::save_input(w, 2), valid, reduction,
                      ignore_index](const autograd::Grads& g) {
                       Tensor dx = ops::empty_on(shape, dt, dev);
                       nll_loss_backward_stub(dev, row_grad(g[0], valid, reduction, dt),
                                              ts.unpack(), ws.unpack(), ignore_index, dx);
                       return autograd::Grads{dx};
                     });
  }
  return out;
}

// ---------------- fused scaled dot-product attention ----------------
// Note [fused attention] (kernels/cpu/nn_attention.cc) has the math. The fused kernel runs for
// f32/f64 on devices that register sdpa_stub, and for bf16 on the CPU (Note [bf16 fused
// attention]), under autocast too (Note [autocast attention]), without dropout and without a mask
// that needs a gradient; anything else (f16 tensors, bf16 off the CPU, dropout_p > 0, a float
// attn_mask that requires grad) runs the composed ops, which are also the reference the tests
// compare against.

ACCEL_DIFFERENTIABLE_OP(scaled_dot_product_attention, "scaled_dot_product_attention");
ACCEL_DIFFERENTIABLE_OP(scaled_dot_product_attention_packed, "scaled_dot_product_attention_packed");

namespace {

// Note [attention probabilities kept for short rows] (kernels/cpu/nn_attention.cc): up to this
// many keys the forward keeps P for the backward; beyond it only lse is kept (flash style).
constexpr int64_t kKeepProbsMaxS = 256;

// bf16 only on the CPU: the CUDA kernel would run it, but through materialised bf16 scores.
bool sdpa_fused(const Tensor& t) {
  const DType dt = t.dtype();
  return sdpa_stub.has(t.device().type) &&
         (dt == kFloat32 || dt == kFloat64 || (dt == kBFloat16 && t.device().is_cpu()));
}

// The dtype of lse and of the additive mask: float32 for bf16 operands (kernels/stubs/nn.h).
DType sdpa_stat_dtype(DType dt) { return dt == kBFloat16 ? kFloat32 : dt; }

// Detached (B, H, n, d) data the kernel reads in place: unit last stride and a row stride
// dnnl_sgemm accepts (>= d); anything else is copied once.
Tensor sdpa_operand(const Tensor& t) {
  const bool ok = t.stride(3) == 1 && t.stride(2) >= std::max<int64_t>(t.size(3), 1);
  return ok ? t.detach() : t.detach().contiguous();
}

// A (B, H, n, d) tensor whose memory is laid out (B, n, H, d): the head merge
// transpose(1, 2).reshape(B, n, H * d) of it is a free view.
Tensor empty_heads_last(const Shape& bhnd, DType dt, Device dev) {
  const int64_t B = bhnd[0], H = bhnd[1], n = bhnd[2], d = bhnd[3];
  Tensor m = ops::empty_on({B, n, H, d}, dt, dev);
  return ops::make_view(m, {B, H, n, d}, {n * H * d, d, H * d, 1}, 0);
}

// (T, S) bool, true where a query may not look (j > i: torch's top-left tril(ones(T, S))).
Tensor future_mask(int64_t T, int64_t S, Device dev) {
  Tensor m = empty({T, S}, kBool);
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < S; ++j) p[i * S + j] = j > i;
  }
  return dev.is_cpu() ? m : m.to(dev);
}

// attn_mask as scores to add, in dtype dt: bool true (takes part) -> 0, false -> -inf; a float
// mask as given (converted). No gradient: the fused path only takes masks that need none.
Tensor additive_mask(const Tensor& mask, DType dt) {
  NoGradGuard ng;
  if (mask.dtype() == kBool) {
    return masked_fill(zeros(mask.sizes(), TensorOptions(dt, mask.device())), logical_not(mask),
                       -INFINITY);
  }
  return ops::as_dtype(mask, dt).detach();
}

// softmax(scale q k^T + mask, future masked) with dropout, v: the textbook ops.
Tensor sdpa_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                     bool causal, double scale, double dropout_p, Generator* gen) {
  // Scaling q (B, H, T, D) is cheaper than scaling the scores (B, H, T, S) when D < S.
  Tensor att = matmul(mul(q, scale), k.transpose(-2, -1));  // (B, H, T, S)
  if (causal) att = masked_fill(att, future_mask(q.size(-2), k.size(-2), q.device()), -INFINITY);
  if (mask.defined()) {
    att = mask.dtype() == kBool ? masked_fill(att, logical_not(mask), -INFINITY)
                                : add(att, ops::as_dtype(mask, att.dtype()));
  }
  Tensor p = softmax(att, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p, true, gen);
  return matmul(p, v);
}

// What the backward needs. q, k, v: the caller's tensors (or copies), saved as inputs `in0`,
// `in0 + 1`, `in0 + 2` (all input 0 for the packed op, whose q, k, v view one qkv); out: the
// output (a view of output 0); mask: the additive mask (input 3, or a converted copy); lse and
// p: the kernel's own.
struct SdpaSaved {
  autograd::SavedTensor q, k, v, out, mask;
  Tensor lse, p;
};

// Runs the forward kernel into `out` (a (B, H, T, Dv) view of `result`) and returns what the
// backward needs.
SdpaSaved sdpa_run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                   double scale, bool causal, Tensor& out, const Tensor& result, bool packed) {
  const Tensor qd = sdpa_operand(q), kd = sdpa_operand(k), vd = sdpa_operand(v);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  Tensor lse = ops::empty_on({B, H, T}, sdpa_stat_dtype(q.dtype()), q.device());
  // CUDA materialises P anyway (kernels/cuda/nn_attention.cc): keep it there.
  const bool keep = S <= kKeepProbsMaxS || !q.device().is_cpu();
  Tensor p = keep ? ops::empty_on({B, H, T, S}, q.dtype(), q.device()) : Tensor();
  sdpa_stub(q.device(), qd, kd, vd, mask, scale, causal, out, lse, p);
  return SdpaSaved{autograd::save_input(qd, 0),
                   autograd::save_input(kd, packed ? 0 : 1),
                   autograd::save_input(vd, packed ? 0 : 2),
                   autograd::save_output(result),
                   autograd::save_input(mask, 3),
                   lse,
                   p};
}

// (B, H, T, Dv) view of the saved output `result`: itself for the plain op, the heads of (B, T, C)
// for the packed one.
void sdpa_grads(const SdpaSaved& s, const Tensor& dout, const Tensor& out, double scale,
                bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Tensor &sq = s.q.unpack(), &sk = s.k.unpack(), &sv = s.v.unpack();
  const Tensor& mask = s.mask.unpack();
  sdpa_backward_stub(sq.device(), dout, sq, sk, sv, mask, out, s.lse, s.p, scale, causal, dq, dk,
                     dv);
}

void check_sdpa(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& mask, bool causal, double dropout_p) {
  ops::check_defined(q, op, "query");
  ops::check_defined(k, op, "key");
  ops::check_defined(v, op, "value");
  ops::check_floating(q, op, "query");
  ACCEL_CHECK(q.dim() >= 3 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError, op,
              "expected q (..., T, D), k (..., S, D), v (..., S, Dv) with the same batch dims "
              "(at least one), got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  ACCEL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), DTypeError, op,
              "q, k and v must share a dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype(),
              " (shapes ", q.sizes(), ", ", k.sizes(), ", ", v.sizes(), ")");
  ops::check_same_device(q, k, op);
  ops::check_same_device(q, v, op);
  const int64_t n = q.dim();
  bool ok = k.size(n - 1) == q.size(n - 1) && v.size(n - 2) == k.size(n - 2);
  for (int64_t d = 0; d < n - 2; ++d) ok = ok && k.size(d) == q.size(d) && v.size(d) == q.size(d);
  ACCEL_CHECK(ok, ShapeError, op, "expected q (..., T, D), k (..., S, D), v (..., S, Dv), got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  ACCEL_CHECK(q.size(n - 1) > 0, ShapeError, op, "head dim must be positive, got q ", q.sizes());
  ACCEL_CHECK(dropout_p >= 0 && dropout_p <= 1, ValueError, op, "dropout_p must be in [0, 1], got ",
              dropout_p);
  if (!mask.defined()) return;
  ACCEL_CHECK(!causal, ValueError, op,
              "an explicit attn_mask must not be given with is_causal = true (as in torch), got "
              "attn_mask ",
              mask.sizes());
  ACCEL_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()), DTypeError, op,
              "attn_mask must be bool (true = takes part) or floating (added to the scores), got ",
              mask.dtype(), " of shape ", mask.sizes());
  ops::check_same_device(q, mask, op);
  Shape full = q.sizes();
  full[size_t(n - 1)] = k.size(n - 2);  // (..., T, S)
  bool bc = mask.dim() <= n;
  for (int64_t d = 0; bc && d < mask.dim(); ++d) {
    const int64_t md = mask.size(mask.dim() - 1 - d), fd = full[size_t(n - 1 - d)];
    bc = md == 1 || md == fd;
  }
  ACCEL_CHECK(bc, ShapeError, op, "attn_mask ", mask.sizes(), " does not broadcast to (..., T, S) ",
              full, " of q ", q.sizes(), " and k ", k.sizes());
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  const char* op = "scaled_dot_product_attention";
  if (ACCEL_UNLIKELY(autocast_enabled()) && sdpa_stub.has(q.device().type)) {
    // Note [autocast attention]: where the fused kernel exists, attention never runs the
    // composed ops in 16 bits (they materialise the (T, S) scores and cost 2x the whole GPT
    // step, docs/performance.md). On the CPU under bf16 autocast it is a matmul-class op: q, k,
    // v are cast to bf16 (the output of a bf16 linear already is: no copy) and the fused bf16
    // kernel (Note [bf16 fused attention]) returns bf16, as torch.autocast does; its softmax and
    // statistics stay float32 inside the kernel. Until 2026-12 it upcast q, k, v and ran the
    // float32 kernel (float32 out): four tensor copies per layer and step each way, and no
    // speedup. Under f16 autocast, and on CUDA (no fused bf16 route there), it is a float32 op
    // like softmax: inputs upcast, float32 out. Without a fused kernel the composed ops run their
    // matmuls in the autocast dtype.
    if (q.device().is_cpu() && autocast_dtype() == kBFloat16) {
      const Tensor qc = autocast_cast(q), kc = autocast_cast(k), vc = autocast_cast(v);
      AutocastSuspend off;
      return scaled_dot_product_attention(qc, kc, vc, attn_mask, dropout_p, is_causal, scale, gen);
    }
    const Tensor q32 = autocast_upcast(q), k32 = autocast_upcast(k), v32 = autocast_upcast(v);
    const Tensor m32 = attn_mask.defined() && is_floating(attn_mask.dtype())
                           ? autocast_upcast(attn_mask)
                           : attn_mask;
    AutocastSuspend off;
    return scaled_dot_product_attention(q32, k32, v32, m32, dropout_p, is_causal, scale, gen);
  }
  check_sdpa(op, q, k, v, attn_mask, is_causal, dropout_p);
  const int64_t n = q.dim();
  const int64_t T = q.size(n - 2), S = k.size(n - 2), D = q.size(n - 1), Dv = v.size(n - 1);
  if (n != 4) {
    // (..., T, D) -> (N, 1, T, D): the batch dims become one, the mask broadcasts over them first.
    const Shape qs = q.sizes();
    const Shape batch(qs.begin(), qs.end() - 2);
    int64_t N = 1;
    for (int64_t b : batch) N *= b;
    auto four = [N](const Tensor& t) { return t.reshape({N, 1, t.size(-2), t.size(-1)}); };
    Tensor m4;
    if (attn_mask.defined()) {
      Shape full = batch;  // (..., T, S)
      full.push_back(T);
      full.push_back(S);
      m4 = attn_mask.expand(full).reshape({N, 1, T, S});
    }
    Shape out_shape = batch;
    out_shape.push_back(T);
    out_shape.push_back(Dv);
    return scaled_dot_product_attention(four(q), four(k), four(v), m4, dropout_p, is_causal, scale,
                                        gen)
        .reshape(out_shape);
  }
  const double sc = scale.value_or(1.0 / std::sqrt(double(D)));
  const bool mask_grad = attn_mask.defined() && autograd::needs_grad(attn_mask);
  if (!sdpa_fused(q) || S == 0 || dropout_p > 0 || mask_grad) {
    return sdpa_composed(q, k, v, attn_mask, is_causal, sc, dropout_p, gen);
  }
  const int64_t B = q.size(0), H = q.size(1);
  Tensor mask;
  if (attn_mask.defined()) {
    mask = additive_mask(attn_mask, sdpa_stat_dtype(q.dtype())).expand({B, H, T, S});
  }
  Tensor out = empty_heads_last({B, H, T, Dv}, q.dtype(), q.device());
  SdpaSaved s = sdpa_run(q, k, v, mask, sc, is_causal, out, out, false);
  if (autograd::needs_grad(q, k, v)) {
    autograd::record(op, {&q, &k, &v}, {&out}, [s, sc, is_causal](const autograd::Grads& g) {
      const Tensor &sq = s.q.unpack(), &sk = s.k.unpack(), &sv = s.v.unpack();
      const DType dt = sq.dtype();
      const Device dev = sq.device();
      Tensor dq = empty_heads_last(sq.sizes(), dt, dev);
      Tensor dk = empty_heads_last(sk.sizes(), dt, dev);
      Tensor dv = empty_heads_last(sv.sizes(), dt, dev);
      sdpa_grads(s, sdpa_operand(ops::as_dtype(g[0], dt)), s.out.unpack(), sc, is_causal, dq, dk,
                 dv);
      return autograd::Grads{dq, dk, dv};
    });
  }
  return out;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal) {
  return scaled_dot_product_attention(q, k, v, Tensor(), 0.0, causal);
}

Tensor scaled_dot_product_attention_packed(const Tensor& qkv, int64_t n_heads, bool causal) {
  const char* op = "scaled_dot_product_attention_packed";
  ops::check_defined(qkv, op);
  ops::check_floating(qkv, op);
  ACCEL_CHECK(qkv.dim() == 3 && n_heads > 0 && qkv.size(2) % (3 * n_heads) == 0 && qkv.size(2) > 0,
              ShapeError, op, "expected qkv (B, T, 3 * C) with C a positive multiple of n_heads (",
              n_heads, "), got ", qkv.sizes());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_heads, D = C / H;
  if (ACCEL_UNLIKELY(autocast_enabled()) && sdpa_stub.has(qkv.device().type)) {
    // Note [autocast attention]
    if (qkv.device().is_cpu() && autocast_dtype() == kBFloat16) {
      const Tensor qkvc = autocast_cast(qkv);
      AutocastSuspend off;
      return scaled_dot_product_attention_packed(qkvc, n_heads, causal);
    }
    const Tensor qkv32 = autocast_upcast(qkv);
    AutocastSuspend off;
    return scaled_dot_product_attention_packed(qkv32, n_heads, causal);
  }
  if (!sdpa_fused(qkv) || T == 0 || ACCEL_UNLIKELY(autocast_enabled())) {
    auto heads = [&](int64_t which) {
      return qkv.narrow(2, which * C, C).reshape({B, T, H, D}).transpose(1, 2);
    };
    return scaled_dot_product_attention(heads(0), heads(1), heads(2), causal)
        .transpose(1, 2)
        .reshape({B, T, C});
  }
  // (B, T, 3C) -> three (B, H, T, D) views into the same buffer, no copies.
  auto split = [B, H, T, D, C](const Tensor& t) {
    std::array<Tensor, 3> r;
    for (int64_t w = 0; w < 3; ++w) {
      r[size_t(w)] =
          ops::make_view(t, {B, H, T, D}, {t.stride(0), D * t.stride(2), t.stride(1), t.stride(2)},
                         t.offset() + w * C * t.stride(2));
    }
    return r;
  };
  const Tensor data = qkv.stride(2) == 1 ? qkv.detach() : qkv.detach().contiguous();
  const auto [q, k, v] = split(data);
  Tensor y = ops::empty_on({B, T, C}, qkv.dtype(), qkv.device());
  auto as_heads = [B, H, T, D, C](const Tensor& t) {  // (B, T, C) contiguous -> (B, H, T, D)
    return ops::make_view(t, {B, H, T, D}, {T * C, D, C, 1}, t.offset());
  };
  Tensor out = as_heads(y);
  const double scale = 1.0 / std::sqrt(double(D));
  SdpaSaved s = sdpa_run(q, k, v, Tensor(), scale, causal, out, y, true);
  if (autograd::needs_grad(qkv)) {
    autograd::record(
        op, {&qkv}, {&y}, [s, scale, causal, B, T, C, split, as_heads](const autograd::Grads& g) {
          const DType dt = s.q.unpack().dtype();
          const Device dev = s.q.unpack().device();
          Tensor dqkv = ops::empty_on({B, T, 3 * C}, dt, dev);
          auto [dq, dk, dv] = split(dqkv);
          const Tensor dy = ops::as_dtype(g[0], dt).contiguous();
          sdpa_grads(s, as_heads(dy), as_heads(s.out.unpack()), scale, causal, dq, dk, dv);
          return autograd::Grads{dqkv};
        });
  }
  return y;
}

}  // namespace accel
