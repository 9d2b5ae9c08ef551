// conv2d, max_pool2d, avg_pool2d (NCHW): forward, checks and backward together.
//   conv2d:     x (N, C, H, W), w (O, C / groups, kh, kw), b (O) -> (N, O, Ho, Wo),
//               Ho = (H + 2 pad - dil (kh - 1) - 1) / stride + 1
//   max/avg:    x (N, C, H, W) -> (N, C, Ho, Wo), Ho = (H + 2 pad - k) / stride + 1,
//               stride defaults to the kernel; max_pool2d's ceil_mode rounds up (Note [max pool
//               ceil_mode]).
// A 3-D input (C, H, W) is treated as a batch of one. The backward of each op is its own kernel
// (oneDNN backward_data / backward_weights / pooling backward on CPU; max pooling keeps the
// forward's argmax in an opaque workspace tensor captured by the backward closure). Under
// create_graph the gradients are built from the differentiable ops instead (Notes [convolution
// gradients as convolutions], [pooling gradients under create_graph]).
#include <algorithm>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "kernels/stubs/conv.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(conv2d, "conv2d");
ACCEL_DIFFERENTIABLE_OP(max_pool2d, "max_pool2d");
ACCEL_DIFFERENTIABLE_OP(avg_pool2d, "avg_pool2d");
ACCEL_DIFFERENTIABLE_OP(conv_transpose2d, "conv_transpose2d");
ACCEL_DIFFERENTIABLE_OP(conv1d, "conv1d");
ACCEL_DIFFERENTIABLE_OP(conv_transpose1d, "conv_transpose1d");

namespace {

// A 1- or 2-element size argument as (h, w); every entry must be >= min_value.
void pair_param(const char* op, const char* what, const Shape& s, int64_t min_value,
                int64_t out[2]) {
  ACCEL_CHECK(s.size() == 1 || s.size() == 2, ValueError, op, what,
              " must have 1 or 2 elements, got ", s);
  out[0] = s[0];
  out[1] = s.size() == 2 ? s[1] : s[0];
  ACCEL_CHECK(out[0] >= min_value && out[1] >= min_value, ValueError, op, what,
              " must be >= ", min_value, ", got ", s);
}

// Contiguous data of t for a kernel (which ignores autograd metadata): t itself or a copy.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = ops::empty_on(t.sizes(), t.dtype(), t.device());
  copy_stub(t.device(), c, t);
  return c;
}

void check_input(const char* op, const Tensor& x) {
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  ACCEL_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op,
              "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got ", x.sizes());
}

// Shape{a, b} for messages.
Shape pair_shape(const int64_t v[2]) { return Shape{v[0], v[1]}; }

// Note [convolution gradients as convolutions]
// Under create_graph (Note [double backward] in autograd/engine.h) conv2d's and
// conv_transpose2d's gradients are computed with the differentiable ops instead of
// conv2d_backward_stub, so they record a graph:
//   - conv2d's input gradient is its adjoint, conv_transpose2d of the output gradient (N, O, Ho,
//     Wo) with the same weight and parameters, output_padding chosen to give back (H, W);
//   - conv2d's weight gradient dw[o, c, i, j] = sum_{n, y, x} g[n, o, y, x]
//     xpad[n, c, y s + i d, x s + j d] is itself a convolution: the input with batch and channels
//     swapped (Cg, G N, H, W) convolved with the output gradient as the kernel (G Og, N, Ho, Wo),
//     stride and dilation exchanged, groups G; the result (Cg, G Og, kh', kw') has kh' >= kh
//     (the rows past the last output position are dropped) and transposes to (O, Cg, kh, kw);
//   - conv_transpose2d(x, w) is conv2d's input gradient for output gradient x, so its input
//     gradient is conv2d(g, w) and its weight gradient conv2d's weight gradient with input g and
//     output gradient x.
// conv2d's input gradient: x_shape (N, C, H, W), go (N, O, Ho, Wo), w (O, C / G, kh, kw).
Tensor conv2d_input_grad(const Tensor& go, const Tensor& w, const Shape& x_shape,
                         const Conv2dParams& p) {
  int64_t out_pad[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t reach = (go.size(2 + i) - 1) * p.stride[i] - 2 * p.padding[i] +
                          p.dilation[i] * (w.size(2 + i) - 1) + 1;
    out_pad[i] = x_shape[size_t(2 + i)] - reach;  // in [0, stride): the rows conv2d's floor drops
  }
  return conv_transpose2d(go, w, Tensor(), pair_shape(p.stride), pair_shape(p.padding),
                          pair_shape(out_pad), p.groups, pair_shape(p.dilation));
}

// conv2d's weight gradient (O, C / G, kh, kw) for input x (N, C, H, W) and output gradient go.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& go, const Shape& w_shape,
                          const Conv2dParams& p) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t G = p.groups, Cg = C / G, O = go.size(1), Og = O / G;
  const Tensor xg = x.reshape({N, G, Cg, H, W}).permute({2, 1, 0, 3, 4}).reshape({Cg, G * N, H, W});
  const Tensor gg = go.reshape({N, G, Og, go.size(2), go.size(3)})
                        .permute({1, 2, 0, 3, 4})
                        .reshape({G * Og, N, go.size(2), go.size(3)});
  const Tensor r = conv2d(xg, gg, Tensor(), pair_shape(p.dilation), pair_shape(p.padding),
                          pair_shape(p.stride), G);  // (Cg, G Og, kh', kw')
  return r.narrow(2, 0, w_shape[2]).narrow(3, 0, w_shape[3]).transpose(0, 1);
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w, const Tensor& b, Shape stride, Shape padding,
              Shape dilation, int64_t groups) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    const Tensor xc = autocast_cast(x_in), wc = autocast_cast(w), bc = autocast_cast(b);
    AutocastSuspend off;
    return conv2d(xc, wc, bc, std::move(stride), std::move(padding), std::move(dilation), groups);
  }
  const char* op = "conv2d";
  check_input(op, x_in);
  ops::check_defined(w, op, "weight");
  ops::check_same_device(x_in, w, op);
  ACCEL_CHECK(x_in.dtype() == w.dtype(), DTypeError, op, "input ", x_in.dtype(), " ", x_in.sizes(),
              " and weight ", w.dtype(), " ", w.sizes(), " differ in dtype");
  ACCEL_CHECK(w.dim() == 4, ShapeError, op, "weight must be 4-D (out, in / groups, kh, kw), got ",
              w.sizes());
  ACCEL_CHECK(groups >= 1, ValueError, op, "groups must be positive, got ", groups);
  Conv2dParams p;
  pair_param(op, "stride", stride, 1, p.stride);
  pair_param(op, "padding", padding, 0, p.padding);
  pair_param(op, "dilation", dilation, 1, p.dilation);
  p.groups = groups;
  const Tensor x = x_in.dim() == 3 ? x_in.unsqueeze(0) : x_in;
  const int64_t c = x.size(1), o = w.size(0);
  ACCEL_CHECK(w.size(1) * groups == c, ShapeError, op, "weight ", w.sizes(),
              " with groups=", groups, " expects ", w.size(1) * groups,
              " input channels, but the input ", x_in.sizes(), " has ", c);
  ACCEL_CHECK(o % groups == 0, ShapeError, op, "weight ", w.sizes(), " has ", o,
              " output channels, not divisible by groups=", groups);
  if (b.defined()) {
    ops::check_same_device(x_in, b, op);
    ACCEL_CHECK(b.dtype() == w.dtype(), DTypeError, op, "bias ", b.dtype(), " ", b.sizes(),
                " and weight ", w.dtype(), " ", w.sizes(), " differ in dtype");
    ACCEL_CHECK(b.dim() == 1 && b.size(0) == o, ShapeError, op, "bias must have shape ", Shape{o},
                ", got ", b.sizes(), " for weight ", w.sizes());
  }
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t eff = p.dilation[i] * (w.size(2 + i) - 1) + 1;  // dilated kernel extent
    const int64_t padded = x.size(2 + i) + 2 * p.padding[i];
    ACCEL_CHECK(padded >= eff, ShapeError, op, "input ", x_in.sizes(), " padded by ",
                pair_shape(p.padding), " is smaller than the (dilated) kernel of weight ",
                w.sizes());
    out_hw[i] = (padded - eff) / p.stride[i] + 1;
  }
  const Tensor xd = dense(x), wd = dense(w), bd = b.defined() ? dense(b) : Tensor();
  Tensor out = ops::empty_on({x.size(0), o, out_hw[0], out_hw[1]}, x.dtype(), x.device());
  conv2d_stub(x.device(), xd, wd, bd, out, p);
  if (autograd::needs_grad(x, w, b)) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(),
               gb = b.defined() && b.requires_grad();
    // x and w are saved as given (their history: Note [convolution gradients as convolutions]);
    // xd / wd only when they are the op's own contiguous copies.
    autograd::record(
        op, {&x, &w, &b}, {&out},
        [xs = autograd::save_input(x, 0), ws = autograd::save_input(w, 1),
         xown = xd.is_same(x) ? Tensor() : xd, wown = wd.is_same(w) ? Tensor() : wd, p, gx, gw,
         gb](const autograd::Grads& g) {
          if (autograd::creating_graph()) {
            const Tensor xv = xs.unpack(), wv = ws.unpack();
            return autograd::Grads{gx ? conv2d_input_grad(g[0], wv, xv.sizes(), p) : Tensor(),
                                   gw ? conv2d_weight_grad(xv, g[0], wv.sizes(), p) : Tensor(),
                                   gb ? sum(g[0], {0, 2, 3}) : Tensor()};
          }
          const Tensor xd = xown.defined() ? xown : xs.unpack();
          const Tensor wd = wown.defined() ? wown : ws.unpack();
          const Tensor go = dense(g[0]);
          Tensor dx = gx ? ops::empty_on(xd.sizes(), go.dtype(), go.device()) : Tensor();
          Tensor dw = gw ? ops::empty_on(wd.sizes(), go.dtype(), go.device()) : Tensor();
          Tensor db = gb ? ops::empty_on({wd.size(0)}, go.dtype(), go.device()) : Tensor();
          conv2d_backward_stub(go.device(), xd, wd, go, gx ? &dx : nullptr, gw ? &dw : nullptr,
                               gb ? &db : nullptr, p);
          return autograd::Grads{dx, dw, db};
        });
  }
  return x_in.dim() == 3 ? out.squeeze(0) : out;
}

// Note [transposed convolution through the conv kernels]: conv_transpose2d(x, w) with params p is
// the adjoint of conv2d(., w) with the same p: its forward is conv2d's backward-data (gout = x,
// gx = the output), its input gradient is conv2d's forward on the output gradient, and its weight
// gradient is conv2d's weight gradient with the roles of input and output swapped (input = the
// output gradient, gout = x). So it runs on the same oneDNN / cuDNN primitives as conv2d with no
// kernel of its own (oneDNN's own deconvolution primitive is the same backward-data kernel; the
// bench compares the two). output_padding below the stride only enlarges the output: conv2d's
// floor in Ho = (H' + 2 pad - dil (k - 1) - 1) / stride + 1 maps the larger H' back onto the same
// H (output_padding of the stride or more is zero padding, below).
// The bias (per output channel) is added by a broadcast add: conv2d_backward_stub has none.
Tensor conv_transpose2d(const Tensor& x_in, const Tensor& w, const Tensor& b, Shape stride,
                        Shape padding, Shape output_padding, int64_t groups, Shape dilation) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    const Tensor xc = autocast_cast(x_in), wc = autocast_cast(w), bc = autocast_cast(b);
    AutocastSuspend off;
    return conv_transpose2d(xc, wc, bc, std::move(stride), std::move(padding),
                            std::move(output_padding), groups, std::move(dilation));
  }
  const char* op = "conv_transpose2d";
  check_input(op, x_in);
  ops::check_defined(w, op, "weight");
  ops::check_same_device(x_in, w, op);
  ACCEL_CHECK(x_in.dtype() == w.dtype(), DTypeError, op, "input ", x_in.dtype(), " ", x_in.sizes(),
              " and weight ", w.dtype(), " ", w.sizes(), " differ in dtype");
  ACCEL_CHECK(w.dim() == 4, ShapeError, op, "weight must be 4-D (in, out / groups, kh, kw), got ",
              w.sizes());
  ACCEL_CHECK(groups >= 1, ValueError, op, "groups must be positive, got ", groups);
  Conv2dParams p;
  int64_t out_pad[2];
  pair_param(op, "stride", stride, 1, p.stride);
  pair_param(op, "padding", padding, 0, p.padding);
  pair_param(op, "dilation", dilation, 1, p.dilation);
  pair_param(op, "output_padding", output_padding, 0, out_pad);
  p.groups = groups;
  for (int i = 0; i < 2; ++i) {
    ACCEL_CHECK(out_pad[i] < p.stride[i] || out_pad[i] < p.dilation[i], ValueError, op,
                "output_padding ", pair_shape(out_pad), " must be smaller than either stride ",
                pair_shape(p.stride), " or dilation ", pair_shape(p.dilation));
  }
  // output_padding of a stride or more (allowed below the dilation) adds rows and columns that
  // no input reaches: conv2d's floor cannot map them back (and oneDNN refuses the geometry), so
  // the op runs with the largest output_padding below the stride and zero-pads the rest; the
  // bias covers every position, as in torch.
  if (out_pad[0] >= p.stride[0] || out_pad[1] >= p.stride[1]) {
    const int64_t eff[2] = {std::min(out_pad[0], p.stride[0] - 1),
                            std::min(out_pad[1], p.stride[1] - 1)};
    Tensor y = conv_transpose2d(x_in, w, Tensor(), stride, padding, Shape{eff[0], eff[1]}, groups,
                                dilation);
    y = pad(y, {0, out_pad[1] - eff[1], 0, out_pad[0] - eff[0]});
    if (b.defined()) {
      ops::check_same_device(x_in, b, op);
      ACCEL_CHECK(b.dtype() == w.dtype(), DTypeError, op, "bias ", b.dtype(), " ", b.sizes(),
                  " and weight ", w.dtype(), " ", w.sizes(), " differ in dtype");
      ACCEL_CHECK(b.dim() == 1 && b.size(0) == y.size(-3), ShapeError, op, "bias must have shape ",
                  Shape{y.size(-3)}, ", got ", b.sizes(), " for weight ", w.sizes(),
                  " and groups=", groups);
      y = add(y, b.view({b.size(0), 1, 1}));
    }
    return y;
  }
  const Tensor x = x_in.dim() == 3 ? x_in.unsqueeze(0) : x_in;
  const int64_t c = x.size(1), o = w.size(1) * groups;
  ACCEL_CHECK(w.size(0) == c, ShapeError, op, "weight ", w.sizes(), " expects ", w.size(0),
              " input channels, but the input ", x_in.sizes(), " has ", c);
  ACCEL_CHECK(c % groups == 0, ShapeError, op, "input channels ", c,
              " are not divisible by groups=", groups, " (weight ", w.sizes(), ")");
  if (b.defined()) {
    ops::check_same_device(x_in, b, op);
    ACCEL_CHECK(b.dtype() == w.dtype(), DTypeError, op, "bias ", b.dtype(), " ", b.sizes(),
                " and weight ", w.dtype(), " ", w.sizes(), " differ in dtype");
    ACCEL_CHECK(b.dim() == 1 && b.size(0) == o, ShapeError, op, "bias must have shape ", Shape{o},
                ", got ", b.sizes(), " for weight ", w.sizes(), " and groups=", groups);
  }
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    out_hw[i] = (x.size(2 + i) - 1) * p.stride[i] - 2 * p.padding[i] +
                p.dilation[i] * (w.size(2 + i) - 1) + out_pad[i] + 1;
    ACCEL_CHECK(out_hw[i] > 0, ShapeError, op, "input ", x_in.sizes(), " with weight ", w.sizes(),
                ", stride ", pair_shape(p.stride), ", padding ", pair_shape(p.padding),
                " gives a non-positive output size ", Shape{out_hw[0], out_hw[1]});
  }
  const Tensor xd = dense(x), wd = dense(w);
  Tensor out = ops::empty_on({x.size(0), o, out_hw[0], out_hw[1]}, x.dtype(), x.device());
  // Only the sizes of conv2d's input argument are read when gw and gb are null.
  conv2d_backward_stub(x.device(), out, wd, xd, &out, nullptr, nullptr, p);
  if (b.defined() && out.numel() > 0) {
    NoGradGuard ng;
    out.add_(b.detach().view({1, o, 1, 1}));
  }
  if (autograd::needs_grad(x, w, b)) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(),
               gb = b.defined() && b.requires_grad();
    autograd::record(
        op, {&x, &w, &b}, {&out},
        [xs = autograd::save_input(x, 0), ws = autograd::save_input(w, 1),
         xown = xd.is_same(x) ? Tensor() : xd, wown = wd.is_same(w) ? Tensor() : wd, p, gx, gw,
         gb](const autograd::Grads& g) {
          if (autograd::creating_graph()) {  // Note [convolution gradients as convolutions]
            const Tensor xv = xs.unpack(), wv = ws.unpack();
            const Shape s = pair_shape(p.stride), pd = pair_shape(p.padding),
                        d = pair_shape(p.dilation);
            return autograd::Grads{gx ? conv2d(g[0], wv, Tensor(), s, pd, d, p.groups) : Tensor(),
                                   gw ? conv2d_weight_grad(g[0], xv, wv.sizes(), p) : Tensor(),
                                   gb ? sum(g[0], {0, 2, 3}) : Tensor()};
          }
          const Tensor xd = xown.defined() ? xown : xs.unpack();
          const Tensor wd = wown.defined() ? wown : ws.unpack();
          const Tensor go = dense(g[0]);
          Tensor dx = gx ? ops::empty_on(xd.sizes(), go.dtype(), go.device()) : Tensor();
          Tensor dw = gw ? ops::empty_on(wd.sizes(), go.dtype(), go.device()) : Tensor();
          if (gx) conv2d_stub(go.device(), go, wd, Tensor(), dx, p);
          if (gw) conv2d_backward_stub(go.device(), go, wd, xd, nullptr, &dw, nullptr, p);
          Tensor db = gb ? sum(go, {0, 2, 3}) : Tensor();
          return autograd::Grads{dx, dw, db};
        });
  }
  return x_in.dim() == 3 ? out.squeeze(0) : out;
}

namespace {

// conv1d / conv_transpose1d run the 2-D ops on (N, C, 1, L) with a (1, k) kernel.
// x: (N, C, L) or (C, L) -> the 4-D (or 3-D) 2-D form; strides and dilations as (1, v).
Tensor as_2d_input(const char* op, const Tensor& x) {
  ops::check_defined(x, op);
  ACCEL_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, op,
              "expected a 2-D (C, L) or 3-D (N, C, L) input, got ", x.sizes());
  return x.unsqueeze(x.dim() - 1);
}
Tensor as_2d_weight(const char* op, const Tensor& w) {
  ops::check_defined(w, op, "weight");
  ACCEL_CHECK(w.dim() == 3, ShapeError, op, "weight must be 3-D, got ", w.sizes());
  return w.unsqueeze(2);
}
// padding / output_padding: 0 along the added H = 1 dim.
Shape as_2d_pad(const char* op, const char* what, int64_t v) {
  ACCEL_CHECK(v >= 0, ValueError, op, what, " must be non-negative, got ", v);
  return Shape{0, v};
}

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  const char* op = "conv1d";
  ACCEL_CHECK(stride >= 1 && dilation >= 1, ValueError, op, "stride (", stride, ") and dilation (",
              dilation, ") must be positive");
  const Tensor y = conv2d(as_2d_input(op, x), as_2d_weight(op, w), b, Shape{1, stride},
                          as_2d_pad(op, "padding", padding), Shape{1, dilation}, groups);
  return y.squeeze(y.dim() - 2);
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride,
                        int64_t padding, int64_t output_padding, int64_t groups, int64_t dilation) {
  const char* op = "conv_transpose1d";
  ACCEL_CHECK(stride >= 1 && dilation >= 1, ValueError, op, "stride (", stride, ") and dilation (",
              dilation, ") must be positive");
  // output_padding of the H = 1 dim is 0 < stride 1.
  const Tensor y =
      conv_transpose2d(as_2d_input(op, x), as_2d_weight(op, w), b, Shape{1, stride},
                       as_2d_pad(op, "padding", padding),
                       as_2d_pad(op, "output_padding", output_padding), groups, Shape{1, dilation});
  return y.squeeze(y.dim() - 2);
}

namespace {

// Note [pooling gradients under create_graph]
// The pooling backward kernels record no graph; under create_graph (Note [double backward] in
// autograd/engine.h) the input gradient is built from differentiable ops. Both gradients are
// linear in the output gradient g (N, C, Ho, Wo):
//   - average: the adjoint of averaging, a transposed convolution of g / count with a kernel of
//     ones per channel (groups = C); count is kh kw, or without count_include_pad the window's
//     in-bounds elements (the average pool of ones, times kh kw);
//   - max: g scattered (scatter_add) to where each window's maximum is. Those positions are read
//     back from the forward's workspace (x itself is not kept: that would hold every max pool's
//     input until the backward) through the backward kernel: the outputs of one phase
//     (ho % rh, wo % rw), rh = ceil(kh / sh), have disjoint windows, so the backward of a gradient
//     that is a code for each output of the phase (0 elsewhere) puts every code, unsummed, at its
//     window's maximum. Codes are base-b digits + 1, b the largest integer the pool's dtype holds
//     exactly (256 for bfloat16, 2048 for float16, 2^24 for float32, 2^52 for float64): one
//     backward per phase and digit (one in all for non-overlapping float32 windows).

// (N, C, Ho * Wo) int64: h * W + w of each window's maximum, from Max pooling's workspace.
Tensor max_pool2d_positions(const Tensor& workspace, const Shape& in, int64_t Ho, int64_t Wo,
                            DType dt, Device dev, const Pool2dParams& p) {
  NoGradGuard no_grad;
  const int64_t P = in[0] * in[1], HW = in[2] * in[3], O = Ho * Wo;
  const int64_t base = dt == kBFloat16  ? 256
                       : dt == kFloat16 ? 2048
                       : dt == kFloat32 ? int64_t(1) << 24
                                        : int64_t(1) << 52;
  int64_t digits = 1;
  for (int64_t reach = base; reach < O; reach *= base) ++digits;
  const int64_t rh = (p.kernel[0] + p.stride[0] - 1) / p.stride[0];
  const int64_t rw = (p.kernel[1] + p.stride[1] - 1) / p.stride[1];
  const TensorOptions i64(kInt64, dev);
  Tensor pos = zeros({P * O}, i64);
  int64_t found = 0;
  for (int64_t a = 0; a < rh; ++a) {
    for (int64_t b = 0; b < rw; ++b) {
      Tensor plane, where_in, lin, out_index;  // per maximum found in this phase
      int64_t scale = 1;
      for (int64_t d = 0; d < digits; ++d, scale *= base) {
        std::vector<double> code(size_t(O), 0.0);  // digit + 1 for the phase's outputs, else 0
        for (int64_t ho = a; ho < Ho; ho += rh)
          for (int64_t wo = b; wo < Wo; wo += rw)
            code[size_t(ho * Wo + wo)] = double((ho * Wo + wo) / scale % base + 1);
        const Tensor gout =
            tensor(code, Shape{1, 1, Ho, Wo}).to(dt).to(dev).expand({in[0], in[1], Ho, Wo});
        Tensor dx = ops::empty_on(in, dt, dev);
        pool2d_backward_stub(dev, PoolKind::Max, dense(gout), workspace, dx, p);
        const Tensor flat = dx.reshape({P, HW});
        if (d == 0) {
          const Tensor nz = nonzero(flat);  // (found, 2): plane, input position
          plane = nz.select(1, 0).contiguous();
          where_in = nz.select(1, 1).contiguous();
          lin = add(mul(plane, HW), where_in);
          out_index = zeros({nz.size(0)}, i64);
        }
        const Tensor digit = sub(index_select(flat.reshape({-1}), 0, lin).to(kInt64), 1);
        out_index = add(out_index, mul(digit, scale));
      }
      found += where_in.numel();
      pos = index_put(pos, {add(mul(plane, O), out_index)}, where_in);
    }
  }
  ACCEL_CHECK(found == P * O, ValueError, "max_pool2d",
              "double backward could not locate the window maxima of the input ", in,
              " (NaN in the input?)");
  return pos.reshape({in[0], in[1], O});
}

Tensor pool2d_grad_differentiable(PoolKind kind, const Tensor& g, const Tensor& workspace,
                                  const Shape& in, const Pool2dParams& p) {
  const int64_t N = in[0], C = in[1], H = in[2], W = in[3], Ho = g.size(2), Wo = g.size(3);
  const int64_t kh = p.kernel[0], kw = p.kernel[1];
  if (kind == PoolKind::Avg) {
    Tensor count;
    {
      NoGradGuard no_grad;
      count = p.count_include_pad
                  ? full({}, double(kh * kw), TensorOptions(g.dtype(), g.device()))
                  : mul(avg_pool2d(ones({1, 1, H, W}, TensorOptions(g.dtype(), g.device())),
                                   pair_shape(p.kernel), pair_shape(p.stride),
                                   pair_shape(p.padding), true),
                        double(kh * kw));
    }
    const int64_t out_pad[2] = {H - ((Ho - 1) * p.stride[0] - 2 * p.padding[0] + kh),
                                W - ((Wo - 1) * p.stride[1] - 2 * p.padding[1] + kw)};
    return conv_transpose2d(div(g, count),
                            ones({C, 1, kh, kw}, TensorOptions(g.dtype(), g.device())), Tensor(),
                            pair_shape(p.stride), pair_shape(p.padding), pair_shape(out_pad), C);
  }
  const Tensor where_max = max_pool2d_positions(workspace, in, Ho, Wo, g.dtype(), g.device(), p);
  const Tensor dx = zeros({N, C, H * W}, TensorOptions(g.dtype(), g.device()));
  return scatter_add(dx, 2, where_max, g.reshape({N, C, Ho * Wo})).reshape(in);
}

Tensor pool2d(const char* op, PoolKind kind, const Tensor& x_in, const Shape& kernel,
              const Shape& stride, const Shape& padding, bool count_include_pad) {
  check_input(op, x_in);
  Pool2dParams p;
  pair_param(op, "kernel", kernel, 1, p.kernel);
  pair_param(op, "stride", stride.empty() ? kernel : stride, 1, p.stride);
  pair_param(op, "padding", padding, 0, p.padding);
  p.count_include_pad = count_include_pad;
  ACCEL_CHECK(2 * p.padding[0] <= p.kernel[0] && 2 * p.padding[1] <= p.kernel[1], ValueError, op,
              "padding ", pair_shape(p.padding), " must be at most half the kernel ",
              pair_shape(p.kernel));
  const Tensor x = x_in.dim() == 3 ? x_in.unsqueeze(0) : x_in;
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t padded = x.size(2 + i) + 2 * p.padding[i];
    ACCEL_CHECK(padded >= p.kernel[i], ShapeError, op, "kernel ", pair_shape(p.kernel),
                " is larger than the input ", x_in.sizes(), " padded by ", pair_shape(p.padding));
    out_hw[i] = (padded - p.kernel[i]) / p.stride[i] + 1;
  }
  const Tensor xd = dense(x);
  Tensor out = ops::empty_on({x.size(0), x.size(1), out_hw[0], out_hw[1]}, x.dtype(), x.device());
  const bool grad = autograd::needs_grad(x);
  Tensor workspace;  // max pool argmax, opaque (backend-specific)
  pool2d_stub(x.device(), kind, xd, out, grad && kind == PoolKind::Max ? &workspace : nullptr, p);
  if (grad) {
    autograd::record(
        op, {&x}, {&out}, [workspace, p, kind, in = x.sizes()](const autograd::Grads& g) {
          if (autograd::creating_graph())  // Note [pooling gradients under create_graph]
            return autograd::Grads{pool2d_grad_differentiable(kind, g[0], workspace, in, p)};
          const Tensor go = dense(g[0]);
          Tensor dx = ops::empty_on(in, go.dtype(), go.device());
          pool2d_backward_stub(go.device(), kind, go, workspace, dx, p);
          return autograd::Grads{dx};
        });
  }
  return x_in.dim() == 3 ? out.squeeze(0) : out;
}

}  // namespace

// Note [max pool ceil_mode]
// ceil_mode adds a last window per dim that hangs over the input's right (bottom) end when the
// floor division drops one: out = ceil((H + 2p - k) / s) + 1, minus one when that window would
// start at or past H + p (it must start on the input or the left padding), torch's
// pooling_output_shape. The kernels take symmetric padding only, so the input is first padded on
// the right by the overhang, e = (out - 1) s + k - (H + 2p), with the lowest value, which no
// maximum picks (every window holds an input element or, at worst, the kernel's own padding);
// pad's backward then drops the overhang's gradient, so both derivatives are pooling's.
Tensor max_pool2d(const Tensor& x, Shape kernel, Shape stride, Shape padding, Shape dilation,
                  bool ceil_mode) {
  const char* op = "max_pool2d";
  int64_t dil[2];
  pair_param(op, "dilation", dilation, 1, dil);
  ACCEL_CHECK(dil[0] == 1 && dil[1] == 1, ValueError, op, "dilation ", pair_shape(dil),
              " is not supported (dilated max pooling is not offered; use dilation 1)");
  if (!ceil_mode) return pool2d(op, PoolKind::Max, x, kernel, stride, padding, true);
  check_input(op, x);
  int64_t k[2], s[2], p[2];
  pair_param(op, "kernel", kernel, 1, k);
  pair_param(op, "stride", stride.empty() ? kernel : stride, 1, s);
  pair_param(op, "padding", padding, 0, p);
  int64_t extra[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x.size(x.dim() - 2 + i), padded = in + 2 * p[i];
    if (padded < k[i]) break;  // pool2d names the error
    int64_t out = (padded - k[i] + s[i] - 1) / s[i] + 1;
    if ((out - 1) * s[i] >= in + p[i]) --out;
    // Negative when the last window ends before the right padding does (nothing to add).
    extra[i] = std::max<int64_t>(0, (out - 1) * s[i] + k[i] - padded);
  }
  if (extra[0] == 0 && extra[1] == 0)
    return pool2d(op, PoolKind::Max, x, kernel, stride, padding, true);
  const double lowest = -std::numeric_limits<double>::infinity();
  const Tensor xp = pad(x, {0, extra[1], 0, extra[0]}, "constant", lowest);
  return pool2d(op, PoolKind::Max, xp, kernel, stride, padding, true);
}

Tensor avg_pool2d(const Tensor& x, Shape kernel, Shape stride, Shape padding,
                  bool count_include_pad) {
  return pool2d("avg_pool2d", PoolKind::Avg, x, kernel, stride, padding, count_include_pad);
}

}  // namespace accel
