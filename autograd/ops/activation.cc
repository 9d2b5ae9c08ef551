// Activations torch.nn.functional has beside relu (leaky_relu, elu, hardtanh, relu6, selu, celu,
// threshold), the in-place forms torch offers (leaky_relu_, elu_, ...; Note [in-place
// activations]), dropout and its in-place form, and the channel dropouts (dropout1d / dropout2d /
// dropout3d, Note [channel dropout]), each with torch's definition and defaults:
//   leaky_relu(x, slope) = x > 0 ? x : slope * x
//   elu(x, alpha) = x > 0 ? x : alpha * (exp(x) - 1)
//   hardtanh(x, lo, hi) = clamp(x, lo, hi), gradient 1 strictly inside (lo, hi), else 0
//   relu6(x) = hardtanh(x, 0, 6)
//   selu(x) = scale * elu(x, alpha), alpha = 1.6732632423543772, scale = 1.0507009873554805
//   celu(x, alpha) = x > 0 ? x : alpha * (exp(x / alpha) - 1)
//   threshold(x, th, value) = x > th ? x : value
//   hardsigmoid(x) = relu6(x + 3) / 6, hardswish(x) = x relu6(x + 3) / 6 (MobileNetV3's)
// Composed from differentiable ops, so every device and dtype of the parts works.
#include <cmath>
#include <mutex>

#include "autograd/ops/common.h"
#include "core/sharded_random.h"
#include "core/warning.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(leaky_relu, "leaky_relu");
ACCEL_DIFFERENTIABLE_OP(elu, "elu");
ACCEL_DIFFERENTIABLE_OP(hardtanh, "hardtanh");
ACCEL_DIFFERENTIABLE_OP(selu, "selu");
ACCEL_DIFFERENTIABLE_OP(celu, "celu");
ACCEL_DIFFERENTIABLE_OP(threshold, "threshold");
ACCEL_DIFFERENTIABLE_OP(hardsigmoid, "hardsigmoid");
ACCEL_DIFFERENTIABLE_OP(hardswish, "hardswish");
ACCEL_DIFFERENTIABLE_OP(dropout, "dropout");
ACCEL_DIFFERENTIABLE_OP(dropout1d, "dropout1d");
ACCEL_DIFFERENTIABLE_OP(dropout2d, "dropout2d");
ACCEL_DIFFERENTIABLE_OP(dropout3d, "dropout3d");

namespace {

constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;

void check_activation_input(const Tensor& x, const char* op) {
  ops::check_defined(x, op);
  ops::check_floating(x, op);
}

}  // namespace

// ---------------- activations ----------------

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  ops::check_defined(x, "leaky_relu");
  ops::check_floating(x, "leaky_relu");
  return where(gt(x, 0.0), x, mul(x, negative_slope));
}

Tensor elu(const Tensor& x, double alpha) {
  ops::check_defined(x, "elu");
  ops::check_floating(x, "elu");
  // expm1 of min(x, 0): the branch not taken stays finite, so its zero gradient stays zero.
  return where(gt(x, 0.0), x, mul(expm1(clamp(x, std::nullopt, Scalar(0.0))), alpha));
}

Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  const char* op = "hardtanh";
  check_activation_input(x, op);
  ACCEL_CHECK(max_val >= min_val, ValueError, op, "max_val (", max_val,
              ") must be greater than or equal to min_val (", min_val, ")");
  // The clamped values as a constant, x where the gradient passes: torch's hardtanh_backward is
  // 1 on the open interval only (clamp's would pass it at the ends too).
  Tensor inside = logical_and(gt(x, Scalar(min_val)), lt(x, Scalar(max_val)));
  return where(inside, x, clamp(x.detach(), Scalar(min_val), Scalar(max_val)));
}

Tensor relu6(const Tensor& x) { return hardtanh(x, 0.0, 6.0); }

Tensor selu(const Tensor& x) {
  check_activation_input(x, "selu");
  return mul(elu(x, kSeluAlpha), kSeluScale);
}

Tensor celu(const Tensor& x, double alpha) {
  const char* op = "celu";
  check_activation_input(x, op);
  ACCEL_CHECK(alpha != 0.0, ValueError, op, "alpha must not be zero (input shape ", x.sizes(), ")");
  // expm1 of min(x, 0) / alpha: the branch not taken stays finite, so its zero gradient stays zero.
  return where(gt(x, 0.0), x, mul(expm1(div(clamp(x, std::nullopt, Scalar(0.0)), alpha)), alpha));
}

Tensor threshold(const Tensor& x, double threshold, double value) {
  check_activation_input(x, "threshold");
  return where(gt(x, Scalar(threshold)), x, Scalar(value));
}

Tensor hardsigmoid(const Tensor& x) {
  check_activation_input(x, "hardsigmoid");
  // hardtanh's gradient is 1 strictly inside (0, 6): torch's hardsigmoid_backward, 1/6 on (-3, 3).
  return div(hardtanh(add(x, 3.0), 0.0, 6.0), 6.0);
}

Tensor hardswish(const Tensor& x) {
  check_activation_input(x, "hardswish");
  // Three pieces joined by where, so each piece's gradient is torch's hardswish_backward: 0 below
  // -3, (2x + 3) / 6 = x / 3 + 1/2 on [-3, 3) (-1/2 at -3, where x relu6(x + 3) / 6 composed
  // would give 0), 1 from 3 on. That is torch 1.13's vectorised kernel, which runs on all but
  // the last few elements of a tensor; its scalar tail takes the middle piece at 3 as well (3/2).
  // The middle is computed as torch's kernel does, x (x + 3) / 6.
  Tensor middle = div(mul(x, add(x, 3.0)), 6.0);
  return where(lt(x, Scalar(-3.0)), Scalar(0.0), where(lt(x, Scalar(3.0)), middle, x));
}

// Note [in-place activations]
// torch's inplace=True (nn.ReLU(inplace=True), F.leaky_relu_, ...) writes the activation into its
// input. relu_ is a kernel of its own (Tensor::relu_); the others are the out-of-place op stored
// into x by autograd::inplace_method (Note [in-place methods] in autograd/function.h), so the
// leaf / view / version rules and the gradient are those of every in-place op. reads_self is
// set where the op's backward reads x (a clamp, an exp, silu's sigmoid): x is then copied before
// it is overwritten; leaky_relu, hardtanh and threshold only keep a mask and need no copy.

Tensor& relu_(Tensor& x) { return x.relu_(); }

Tensor& leaky_relu_(Tensor& x, double negative_slope) {
  return autograd::inplace_method(x, "leaky_relu_", {},
                                  [negative_slope](const Tensor& s, const std::vector<Tensor>&) {
                                    return leaky_relu(s, negative_slope);
                                  });
}

Tensor& elu_(Tensor& x, double alpha) {
  return autograd::inplace_method(
      x, "elu_", {}, [alpha](const Tensor& s, const std::vector<Tensor>&) { return elu(s, alpha); },
      /*reads_self=*/true);
}

Tensor& hardtanh_(Tensor& x, double min_val, double max_val) {
  return autograd::inplace_method(x, "hardtanh_", {},
                                  [min_val, max_val](const Tensor& s, const std::vector<Tensor>&) {
                                    return hardtanh(s, min_val, max_val);
                                  });
}

Tensor& relu6_(Tensor& x) { return hardtanh_(x, 0.0, 6.0); }

Tensor& selu_(Tensor& x) {
  return autograd::inplace_method(
      x, "selu_", {}, [](const Tensor& s, const std::vector<Tensor>&) { return selu(s); },
      /*reads_self=*/true);
}

Tensor& celu_(Tensor& x, double alpha) {
  return autograd::inplace_method(
      x, "celu_", {},
      [alpha](const Tensor& s, const std::vector<Tensor>&) { return celu(s, alpha); },
      /*reads_self=*/true);
}

Tensor& threshold_(Tensor& x, double threshold_value, double value) {
  return autograd::inplace_method(
      x, "threshold_", {}, [threshold_value, value](const Tensor& s, const std::vector<Tensor>&) {
        return threshold(s, threshold_value, value);
      });
}

Tensor& silu_(Tensor& x) {
  return autograd::inplace_method(
      x, "silu_", {}, [](const Tensor& s, const std::vector<Tensor>&) { return silu(s); },
      /*reads_self=*/true);
}

Tensor& hardsigmoid_(Tensor& x) {
  // The backward keeps hardtanh's mask only.
  return autograd::inplace_method(
      x, "hardsigmoid_", {},
      [](const Tensor& s, const std::vector<Tensor>&) { return hardsigmoid(s); });
}

Tensor& hardswish_(Tensor& x) {
  return autograd::inplace_method(
      x, "hardswish_", {}, [](const Tensor& s, const std::vector<Tensor>&) { return hardswish(s); },
      /*reads_self=*/true);
}

// ---------------- dropout, in place too; channel dropout ----------------

namespace {
// Note [dropout mask]
// The keep mask is drawn on the CPU, then moved to x's device. Each call draws one 64-bit key from
// the generator (under its lock) and takes element e's bits from the counter-based stream of that
// key at e's index: keep when the top 53 bits, as a double in [0, 1), are >= p. The result
// depends only on the seed and the order of calls, as before, and the generator advances by one
// draw per call whatever the size. Counter-based because an element's bits need not wait for the
// ones before it: under tensor parallelism a rank holding part of an activation draws its elements
// at their index in the full tensor (the layout of core/sharded_random.h), so every rank's mask is
// the slice of the one-process mask (Note [dropout under tensor parallelism] in
// parallel/tp_random.cc). Outside a sharded region the layout is whole and the index is e.

// keep iff double(bits >> 11) * 2^-53 >= p, in integers: (bits >> 11) >= ceil(p * 2^53) (exact:
// p * 2^53 scales by a power of two). p = 1 gives 2^53, above every value: nothing kept.
uint64_t keep_threshold(double p) { return uint64_t(std::ceil(p * 0x1.0p53)); }

uint64_t draw_key(Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  return g.next_u64();
}

// f(local, global) for every element of `shape` in row-major order: its index here and in the
// full tensor of `layout` (ways 1: the same).
template <typename F>
void for_each_global_index(const Shape& shape, const ShardLayout& layout, F&& f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (layout.ways == 1) {
    for (int64_t i = 0; i < n; ++i) f(i, uint64_t(i));
    return;
  }
  const size_t d = size_t(layout.dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t len = shape[d], block = len / layout.chunks, glen = len * layout.ways;
  int64_t local = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < len; ++j) {
      const int64_t gj = ((j / block) * layout.ways + layout.index) * block + j % block;
      const uint64_t base = uint64_t((o * glen + gj) * inner);
      for (int64_t t = 0; t < inner; ++t) f(local++, base + uint64_t(t));
    }
  }
}

Tensor dropout_keep_mask(const char* op, const Tensor& x, double p, Generator* gen) {
  const ShardLayout layout = draw_layout(op, x.sizes());  // before the draw: it may throw
  const uint64_t key = draw_key(gen), threshold = keep_threshold(p);
  Tensor keep = empty(x.sizes(), TensorOptions(kBool, kCPU));
  bool* k = keep.data<bool>();
  for_each_global_index(x.sizes(), layout, [&](int64_t i, uint64_t e) {
    k[i] = (counter_bits(key, e) >> 11) >= threshold;
  });
  if (!x.device().is_cpu()) keep = keep.to(x.device());
  return keep;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const char* op = "dropout";
  ops::check_defined(x, op);
  ACCEL_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, "probability must be in [0, 1], got ", p,
              " (input shape ", x.sizes(), ")");
  if (!training || p == 0.0 || x.numel() == 0) return x;
  ops::check_floating(x, op);
  const Tensor keep = dropout_keep_mask(op, x, p, gen);
  // Inverted dropout: kept elements are scaled by 1 / (1 - p); p = 1 drops everything.
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  Tensor out;
  {
    NoGradGuard ng;
    out = where(keep, mul(x, scale), 0.0);
  }
  if (autograd::needs_grad(x)) {
    autograd::record(op, {&x}, {&out}, [keep, scale](const autograd::Grads& g) {
      return autograd::Grads{where(keep, mul(g[0], scale), 0.0)};
    });
  }
  return out;
}

Tensor& dropout_(Tensor& x, double p, bool training, Generator* gen) {
  const char* op = "dropout_";
  ops::check_defined(x, op);
  ACCEL_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, "probability must be in [0, 1], got ", p,
              " (input shape ", x.sizes(), ")");
  if (!training || p == 0.0 || x.numel() == 0) return x;
  ops::check_floating(x, op);
  // The same keep draws as dropout() (Note [dropout mask]), so both give one result.
  Tensor drop = logical_not(dropout_keep_mask(op, x, p, gen));
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  return x.masked_fill_(drop, 0.0).mul_(scale);
}

// Note [channel dropout]
// torch's feature dropout: one keep draw per (n, c) (per c unbatched) in row-major order, on the
// CPU and counter-based (Note [dropout mask]), scaled by 1 / (1 - p) and broadcast over
// the spatial dims. dropoutNd takes (N, C, *N spatial dims*) or, unbatched, (C, *spatial*), except
// dropout2d on a 3-D input: torch reads it as (N, C, L) (channel-wise 1-D dropout, with a
// warning that this may change), not as an unbatched (C, H, W); so does accel.
namespace {

// The keep draws of the planes (N, C) (or (C)), counter-based as Note [dropout mask] says. Where
// tensor parallelism shards a plane dim, each plane is drawn at its index among the full tensor's
// planes; where it shards a spatial dim, every rank holds part of the same planes and draws them
// alike.
Tensor channel_mask(const char* op, const Tensor& x, double p, bool batched, Generator* gen) {
  const ShardLayout layout = draw_layout(op, x.sizes());
  const Shape planes = batched ? Shape{x.size(0), x.size(1)} : Shape{x.size(0)};
  const ShardLayout plane_layout =
      layout.ways > 1 && layout.dim < int64_t(planes.size()) ? layout : ShardLayout{};
  std::vector<double> mask(static_cast<size_t>(batched ? x.size(0) * x.size(1) : x.size(0)));
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  const uint64_t key = draw_key(gen), threshold = keep_threshold(p);
  for_each_global_index(planes, plane_layout, [&](int64_t i, uint64_t e) {
    mask[size_t(i)] = (counter_bits(key, e) >> 11) >= threshold ? scale : 0.0;
  });
  Shape ms(size_t(x.dim()), 1);
  ms[0] = x.size(0);
  if (batched) ms[1] = x.size(1);
  Tensor mt = tensor(mask, ms, TensorOptions(kFloat64));
  if (x.dtype() != kFloat64) mt = mt.to(x.dtype());
  if (!x.device().is_cpu()) mt = mt.to(x.device());
  return mt;
}

// spatial: the spatial dims of the op (1, 2, 3). Returns whether x is batched; checks p, shape.
bool check_channel_dropout(const char* op, const Tensor& x, double p, int64_t spatial) {
  ops::check_defined(x, op);
  ACCEL_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, "probability must be in [0, 1], got ", p,
              " (input shape ", x.sizes(), ")");
  const int64_t unbatched = spatial + 1, batched = spatial + 2;
  if (spatial == 2) {
    ACCEL_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op,
                "expected a 3-D (N, C, L) or 4-D (N, C, H, W) input, got ", x.sizes());
    if (x.dim() == 3)
      ACCEL_WARN_ONCE(
          op, "received a 3-D input ", x.sizes(),
          " and, as torch, treats it as (N, C, L): one draw per (n, c), channel-wise 1-D "
          "dropout, not an unbatched (C, H, W). Use dropout1d for (N, C, L), or "
          "unsqueeze(0) a (C, H, W) input");
    return true;
  }
  const char* shapes = spatial == 1 ? "(C, L) or (N, C, L)" : "(C, D, H, W) or (N, C, D, H, W)";
  ACCEL_CHECK(x.dim() == unbatched || x.dim() == batched, ShapeError, op, "expected a ", unbatched,
              "-D or ", batched, "-D input ", shapes, ", got ", x.sizes());
  return x.dim() == batched;
}

Tensor channel_dropout(const char* op, const Tensor& x, double p, bool training, Generator* gen,
                       int64_t spatial) {
  const bool batched = check_channel_dropout(op, x, p, spatial);
  if (!training || p == 0.0 || x.numel() == 0) return x;
  ops::check_floating(x, op);
  return mul(x, channel_mask(op, x, p, batched, gen));
}

Tensor& channel_dropout_(const char* op, Tensor& x, double p, bool training, Generator* gen,
                         int64_t spatial) {
  const bool batched = check_channel_dropout(op, x, p, spatial);
  if (!training || p == 0.0 || x.numel() == 0) return x;
  ops::check_floating(x, op);
  return x.mul_(channel_mask(op, x, p, batched, gen));
}

}  // namespace

Tensor dropout1d(const Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout("dropout1d", x, p, training, gen, 1);
}
Tensor dropout2d(const Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout("dropout2d", x, p, training, gen, 2);
}
Tensor dropout3d(const Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout("dropout3d", x, p, training, gen, 3);
}
Tensor& dropout1d_(Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout_("dropout1d_", x, p, training, gen, 1);
}
Tensor& dropout2d_(Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout_("dropout2d_", x, p, training, gen, 2);
}
Tensor& dropout3d_(Tensor& x, double p, bool training, Generator* gen) {
  return channel_dropout_("dropout3d_", x, p, training, gen, 3);
}

}  // namespace accel
