// The composed losses, each with torch.nn.functional's definition, arguments and defaults:
//   mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div: the target broadcasts with the input,
//     with torch's warning when their shapes differ (Note [loss broadcasting]);
//     binary_cross_entropy, binary_cross_entropy_with_logits: input and target of one shape
//     (torch refuses others too);
//   the target is converted to the input's dtype; None keeps the (broadcast) shape, Mean/Sum
//   give a 0-dim tensor.
//   cosine_similarity: x1, x2 broadcast together -> the broadcast shape without dim.
//   cosine_embedding_loss: x1, x2 (N, D) and target (N), or (D) and ().
// All are composed from differentiable ops (so every device that runs the parts runs them, and
// no kernel of their own exists); binary_cross_entropy records its own backward over a composed
// forward, for torch's gradient at the clamped ends (Note [binary_cross_entropy gradient]), and
// binary_cross_entropy_with_logits its own (sigmoid(x) - t) over the stable form.
#include <cmath>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "core/warning.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(binary_cross_entropy, "binary_cross_entropy");
// Composite: checked through their parts, and by their own op-table cases.
ACCEL_DIFFERENTIABLE_OP(mse_loss, "mse_loss");
ACCEL_DIFFERENTIABLE_OP(bce_with_logits, "binary_cross_entropy_with_logits");
ACCEL_DIFFERENTIABLE_OP(l1_loss, "l1_loss");
ACCEL_DIFFERENTIABLE_OP(smooth_l1_loss, "smooth_l1_loss");
ACCEL_DIFFERENTIABLE_OP(huber_loss, "huber_loss");
ACCEL_DIFFERENTIABLE_OP(kl_div, "kl_div");
ACCEL_DIFFERENTIABLE_OP(cosine_similarity, "cosine_similarity");
ACCEL_DIFFERENTIABLE_OP(cosine_embedding_loss, "cosine_embedding_loss");

namespace {

// Note [loss broadcasting]
// torch's mse_loss, l1_loss, smooth_l1_loss and huber_loss broadcast input and target together
// when their shapes differ, after a UserWarning ("Using a target size ... that is different to
// the input size ..."), and kl_div broadcasts them silently; an (N, 1) prediction against an
// (N) target then gives an (N, N) loss, nearly always a bug, which is why torch warns. accel
// does the same and warns for all five (kl_div included: no silent trap), once per distinct
// message (Note [warnings] in core/warning.h). Shapes that do not broadcast are a ShapeError
// naming both. binary_cross_entropy (and _with_logits) refuse a different shape, as torch.

enum class Shapes : bool { Same, Broadcast };

// Both defined and floating, one device; one shape, or shapes that broadcast (with the warning)
// when `shapes` allows it. Returns the target in the input's dtype.
Tensor check_pair(const char* op, const Tensor& input, const Tensor& target,
                  Shapes shapes = Shapes::Same) {
  ops::check_defined(input, op, "input");
  ops::check_defined(target, op, "target");
  ops::check_floating(input, op, "input");
  ops::check_floating(target, op, "target");
  ops::check_same_device(input, target, op);
  if (ACCEL_UNLIKELY(input.sizes() != target.sizes())) {
    ACCEL_CHECK(shapes == Shapes::Broadcast, ShapeError, op, "input of shape ", input.sizes(), " (",
                input.dtype(), ") and target of shape ", target.sizes(), " (", target.dtype(),
                ") differ");
    const Shape out = broadcast_shapes(input.sizes(), target.sizes(), op);
    ACCEL_WARN_ONCE(op, "using a target size ", target.sizes(),
                    " that is different to the input size ", input.sizes(), ": both broadcast to ",
                    out,
                    ". This will likely lead to incorrect results due to broadcasting. Please "
                    "ensure they have the same size.");
  }
  return ops::as_dtype(target, input.dtype());
}

Tensor reduce(const char* op, const Tensor& l, Reduction r) {
  switch (r) {
    case Reduction::None: return l;
    case Reduction::Sum: return sum(l);
    case Reduction::Mean: return mean(l);
    case Reduction::BatchMean: ops::check_not_batchmean(r, op);
  }
  return l;
}

bool broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != 1 && f != t) return false;
  }
  return true;
}

}  // namespace

// Note [binary_cross_entropy gradient]: the forward is -(t log x + (1 - t) log(1 - x)) with each
// log clamped at -100 (so x = 0 or 1 give a finite loss, as torch). Autograd through the clamp
// would give 0 * inf = NaN at those ends, so the op records torch's gradients instead:
//   x: (x - t) / max(x (1 - x), eps), eps = 1e-12 as a float (torch's EPSILON constant is a
//      float; 1e-12f = 0.99999999600e-12, so x = 0 with t = 1 gives -1.000000004e12 as torch);
//   t: log(1 - x) - log(x) = -logit(x), unclamped (+-inf at x = 0 or 1, as torch).
// The weight multiplies outside, through mul (so a weight that requires grad gets the
// unweighted loss as its gradient; torch does not differentiate weight).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight,
                            Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return binary_cross_entropy(autocast_upcast(input), autocast_upcast(target),
                                weight.defined() ? autocast_upcast(weight) : weight, reduction);
  const char* op = "binary_cross_entropy";
  ops::check_not_batchmean(reduction, op);
  Tensor t = check_pair(op, input, target);
  Tensor w;
  if (weight.defined()) {
    ops::check_floating(weight, op, "weight");
    ops::check_same_device(input, weight, op);
    ACCEL_CHECK(broadcastable_to(weight.sizes(), input.sizes()), ShapeError, op, "weight of shape ",
                weight.sizes(), " does not broadcast to the input's shape ", input.sizes());
    w = ops::as_dtype(weight, input.dtype());
  }
  if (input.numel() > 0) {
    // The input must hold probabilities (torch checks the same on the CPU); NaN fails too.
    NoGradGuard no_grad;
    const double lo = amin(input).item(), hi = amax(input).item();
    ACCEL_CHECK(lo >= 0.0 && hi <= 1.0, ValueError, op,
                "all elements of input should be between 0 and 1 (probabilities; use "
                "binary_cross_entropy_with_logits for logits), got values in [",
                lo, ", ", hi, "] in input of shape ", input.sizes(), " (", input.dtype(), ")");
  }
  Tensor l;
  {
    NoGradGuard no_grad;
    Tensor lx = clamp(log(input), Scalar(-100.0), std::nullopt);
    Tensor l1x = clamp(log1p(neg(input)), Scalar(-100.0), std::nullopt);
    l = neg(add(mul(t, lx), mul(rsub(t, 1.0), l1x)));
  }
  if (autograd::needs_grad(input, t)) {
    autograd::record(op, {&input, &t}, {&l},
                     [xs = autograd::save_input(input, 0), ts = autograd::save_input(t, 1),
                      gt = t.requires_grad()](const autograd::Grads& g) {
                       const Tensor& x = xs.unpack();
                       const Tensor& tt = ts.unpack();
                       constexpr double kEps = static_cast<double>(1e-12f);
                       Tensor dx = div(mul(g[0], sub(x, tt)),
                                       clamp(mul(x, rsub(x, 1.0)), Scalar(kEps), std::nullopt));
                       Tensor dt;
                       if (gt) dt = mul(g[0], sub(log1p(neg(x)), log(x)));
                       return autograd::Grads{dx, dt};
                     });
  }
  if (w.defined()) l = mul(l, w);
  return reduce(op, l, reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return mse_loss(autocast_upcast(input), autocast_upcast(target), reduction);
  const char* op = "mse_loss";
  ops::check_not_batchmean(reduction, op);
  Tensor t = check_pair(op, input, target, Shapes::Broadcast);
  Tensor d = sub(input, t);
  return reduce(op, mul(d, d), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(logits, target)))
    return binary_cross_entropy_with_logits(autocast_upcast(logits), autocast_upcast(target),
                                            reduction);
  const char* op = "binary_cross_entropy_with_logits";
  ops::check_not_batchmean(reduction, op);
  ops::check_defined(logits, op, "input");
  ops::check_defined(target, op, "target");
  ops::check_floating(logits, op, "input");
  ops::check_floating(target, op, "target");
  ops::check_same_device(logits, target, op);
  ACCEL_CHECK(logits.sizes() == target.sizes(), ShapeError, op, "target of shape ", target.sizes(),
              " does not match input of shape ", logits.sizes());
  Tensor t = ops::as_dtype(target, logits.dtype());
  Tensor l;
  {
    // Stable form: max(x, 0) - x t + log(1 + exp(-|x|)); never exponentiates a positive number.
    NoGradGuard ng;
    l = add(sub(relu(logits), mul(logits, t)), log1p(exp(neg(abs(logits)))));
  }
  if (autograd::needs_grad(logits, t)) {
    // d/dx = sigmoid(x) - t (also right at x = 0, where the composite above has kinks);
    // d/dt = -x.
    autograd::record(op, {&logits, &t}, {&l},
                     [xs = autograd::save_input(logits, 0), ts = autograd::save_input(t, 1),
                      gt = t.requires_grad()](const autograd::Grads& g) {
                       const Tensor& xd = xs.unpack();
                       return autograd::Grads{mul(g[0], sub(sigmoid(xd), ts.unpack())),
                                              gt ? neg(mul(g[0], xd)) : Tensor()};
                     });
  }
  return reduce(op, l, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return l1_loss(autocast_upcast(input), autocast_upcast(target), reduction);
  const char* op = "l1_loss";
  ops::check_not_batchmean(reduction, op);
  Tensor t = check_pair(op, input, target, Shapes::Broadcast);
  return reduce(op, abs(sub(input, t)), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return smooth_l1_loss(autocast_upcast(input), autocast_upcast(target), reduction, beta);
  const char* op = "smooth_l1_loss";
  ops::check_not_batchmean(reduction, op);
  ACCEL_CHECK(beta >= 0.0, ValueError, op, "beta must be >= 0, got ", beta, " (input shape ",
              input.defined() ? input.sizes() : Shape{}, ")");
  Tensor t = check_pair(op, input, target, Shapes::Broadcast);
  if (beta == 0.0) return reduce(op, abs(sub(input, t)), reduction);  // torch: l1_loss
  Tensor d = sub(input, t);
  Tensor ad = abs(d);
  // Both branches are finite everywhere, so where's zero gradient for the unpicked one is exact.
  return reduce(op, where(lt(ad, Scalar(beta)), mul(mul(d, d), 0.5 / beta), sub(ad, 0.5 * beta)),
                reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return huber_loss(autocast_upcast(input), autocast_upcast(target), reduction, delta);
  const char* op = "huber_loss";
  ops::check_not_batchmean(reduction, op);
  ACCEL_CHECK(delta > 0.0, ValueError, op, "delta must be > 0, got ", delta, " (input shape ",
              input.defined() ? input.sizes() : Shape{}, ")");
  Tensor t = check_pair(op, input, target, Shapes::Broadcast);
  Tensor d = sub(input, t);
  Tensor ad = abs(d);
  return reduce(op,
                where(lt(ad, Scalar(delta)), mul(mul(d, d), 0.5), mul(sub(ad, 0.5 * delta), delta)),
                reduction);
}

Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction, bool log_target) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(input, target)))
    return kl_div(autocast_upcast(input), autocast_upcast(target), reduction, log_target);
  const char* op = "kl_div";
  Tensor t = check_pair(op, input, target, Shapes::Broadcast);
  Tensor l;
  if (log_target) {
    l = mul(exp(t), sub(t, input));
  } else {
    // xlogy(t, t) - t x with 0 log 0 = 0: log reads 1 where t = 0, so the value there is 0
    // and the target's gradient -x (torch's is NaN there: xlogy's gradient through its second
    // argument is 0 / 0). A negative t still gives NaN, as in torch.
    Tensor safe = where(eq(t, Scalar(0.0)), Scalar(1.0), t);
    l = sub(mul(t, log(safe)), mul(t, input));
  }
  if (reduction == Reduction::BatchMean) {
    // torch: the sum over the batch size, input.size(0) (1 for a 0-dim input).
    return div(sum(l), double(input.dim() == 0 ? 1 : input.size(0)));
  }
  return reduce(op, l, reduction);
}

// torch >= 2.0's definition (each norm clamped at eps before the product); torch 1.13 clamped
// the product of the norms at eps. They differ only when a norm is below eps.
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim, double eps) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x1, x2)))
    return cosine_similarity(autocast_upcast(x1), autocast_upcast(x2), dim, eps);
  const char* op = "cosine_similarity";
  ops::check_defined(x1, op, "x1");
  ops::check_defined(x2, op, "x2");
  ops::check_floating(x1, op, "x1");
  ops::check_floating(x2, op, "x2");
  ops::check_same_device(x1, x2, op);
  ACCEL_CHECK(x1.dtype() == x2.dtype(), DTypeError, op, "x1 (", x1.dtype(), ", shape ", x1.sizes(),
              ") and x2 (", x2.dtype(), ", shape ", x2.sizes(), ") differ in dtype");
  const Shape shape = broadcast_shapes(x1.sizes(), x2.sizes(), op);
  ACCEL_CHECK(!shape.empty(), ShapeError, op, "needs at least one dim, got shapes ", x1.sizes(),
              " and ", x2.sizes());
  const int64_t d = wrap_dim(dim, int64_t(shape.size()), op);
  // Broadcast first: a size-1 dim of x1 along `dim` repeats its element in the norm, as torch.
  Tensor a = x1.sizes() == shape ? x1 : x1.expand(shape);
  Tensor b = x2.sizes() == shape ? x2 : x2.expand(shape);
  Tensor na = clamp(norm(a, 2.0, {d}, true), Scalar(eps), std::nullopt);
  Tensor nb = clamp(norm(b, 2.0, {d}, true), Scalar(eps), std::nullopt);
  return sum(mul(div(a, na), div(b, nb)), {d});
}

Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             double margin, Reduction reduction) {
  if (ACCEL_UNLIKELY(autocast_wants_upcast(x1, x2)))
    return cosine_embedding_loss(autocast_upcast(x1), autocast_upcast(x2), target, margin,
                                 reduction);
  const char* op = "cosine_embedding_loss";
  ops::check_not_batchmean(reduction, op);
  ops::check_defined(x1, op, "x1");
  ops::check_defined(x2, op, "x2");
  ops::check_defined(target, op, "target");
  ops::check_floating(x1, op, "x1");
  ops::check_floating(x2, op, "x2");
  ops::check_same_device(x1, x2, op);
  ops::check_same_device(x1, target, op);
  ACCEL_CHECK(x1.sizes() == x2.sizes() && x1.dtype() == x2.dtype(), ShapeError, op, "x1 (",
              x1.sizes(), ", ", x1.dtype(), ") and x2 (", x2.sizes(), ", ", x2.dtype(),
              ") must have one shape and dtype");
  ACCEL_CHECK((target.dim() == 1 && x1.dim() == 2 && target.size(0) == x1.size(0)) ||
                  (target.dim() == 0 && x1.dim() == 1),
              ShapeError, op, "expected inputs (N, D) with target (N), or (D) with target (), got ",
              x1.sizes(), " and target ", target.sizes());
  ACCEL_CHECK(target.dtype() != kBool, DTypeError, op,
              "target holds 1 or -1 (a floating or integer dtype), got bool of shape ",
              target.sizes());
  // torch's formula: cos = <x1, x2> / sqrt((|x1|^2 + 1e-12) (|x2|^2 + 1e-12)) over the last dim.
  const int64_t d = x1.dim() - 1;
  Tensor prod = sum(mul(x1, x2), {d});
  Tensor m1 = add(sum(mul(x1, x1), {d}), 1e-12);
  Tensor m2 = add(sum(mul(x2, x2), {d}), 1e-12);
  Tensor cos = div(prod, sqrt(mul(m1, m2)));
  Tensor pos = where(eq(target, Scalar(1)), rsub(cos, 1.0), Scalar(0.0));
  Tensor negl = where(eq(target, Scalar(-1)), clamp(sub(cos, margin), Scalar(0.0), std::nullopt),
                      Scalar(0.0));
  return reduce(op, add(pos, negl), reduction);
}

}  // namespace accel
