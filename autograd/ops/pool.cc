// 2-D pooling (NCHW): max_pool2d, avg_pool2d and the adaptive pools, forward, checks and
// backward together.
//   max/avg:    x (N, C, H, W) -> (N, C, Ho, Wo), Ho = (H + 2 pad - k) / stride + 1,
//               stride defaults to the kernel (max_pool2d's ceil_mode rounds up: Note [max pool
//               ceil_mode]); their backward is the pooling backward kernel (max
//               pooling keeps the forward's argmax in an opaque workspace tensor captured by the
//               backward closure), or under create_graph the differentiable ops (Note [pooling
//               gradients under create_graph]).
//   adaptive:   x (N, C, H, W) -> (N, C, oh, ow), window i of o over n spanning
//               [floor(i n / o), ceil((i + 1) n / o)): equal windows run the pooling kernel, others
//               are composed from ops (adaptive max pooling gathers, Note [index-map ops] in
//               resample.cc).
// A 3-D input (C, H, W) is treated as a batch of one.
#include <algorithm>
#include <limits>

#include "autograd/ops/common.h"
#include "kernels/stubs/conv.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(max_pool2d, "max_pool2d");
ACCEL_DIFFERENTIABLE_OP(avg_pool2d, "avg_pool2d");
ACCEL_DIFFERENTIABLE_OP(adaptive_avg_pool2d, "adaptive_avg_pool2d");
ACCEL_DIFFERENTIABLE_OP(adaptive_max_pool2d, "adaptive_max_pool2d");

namespace {

using ops::pair_shape;

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
        pool2d_backward_stub(dev, PoolKind::Max, ops::dense(gout), workspace, dx, p);
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
  ops::check_image(op, x_in);
  Pool2dParams p;
  ops::pair_param(op, "kernel", kernel, 1, p.kernel);
  ops::pair_param(op, "stride", stride.empty() ? kernel : stride, 1, p.stride);
  ops::pair_param(op, "padding", padding, 0, p.padding);
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
  const Tensor xd = ops::dense(x);
  Tensor out = ops::empty_on({x.size(0), x.size(1), out_hw[0], out_hw[1]}, x.dtype(), x.device());
  const bool grad = autograd::needs_grad(x);
  Tensor workspace;  // max pool argmax, opaque (backend-specific)
  pool2d_stub(x.device(), kind, xd, out, grad && kind == PoolKind::Max ? &workspace : nullptr, p);
  if (grad) {
    autograd::record(
        op, {&x}, {&out}, [workspace, p, kind, in = x.sizes()](const autograd::Grads& g) {
          if (autograd::creating_graph())  // Note [pooling gradients under create_graph]
            return autograd::Grads{pool2d_grad_differentiable(kind, g[0], workspace, in, p)};
          const Tensor go = ops::dense(g[0]);
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
  ops::pair_param(op, "dilation", dilation, 1, dil);
  ACCEL_CHECK(dil[0] == 1 && dil[1] == 1, ValueError, op, "dilation ", pair_shape(dil),
              " is not supported (dilated max pooling is not offered; use dilation 1)");
  if (!ceil_mode) return pool2d(op, PoolKind::Max, x, kernel, stride, padding, true);
  ops::check_image(op, x);
  int64_t k[2], s[2], p[2];
  ops::pair_param(op, "kernel", kernel, 1, k);
  ops::pair_param(op, "stride", stride.empty() ? kernel : stride, 1, s);
  ops::pair_param(op, "padding", padding, 0, p);
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

// ---------------- adaptive pooling ----------------

namespace {

// A 1- or 2-element output size as (h, w), each >= 1.
void out_pair(const char* op, const Shape& s, int64_t out[2]) {
  ACCEL_CHECK(s.size() == 1 || s.size() == 2, ValueError, op,
              "output_size must have 1 or 2 elements, got ", s);
  out[0] = s[0];
  out[1] = s.size() == 2 ? s[1] : s[0];
  ACCEL_CHECK(out[0] >= 1 && out[1] >= 1, ValueError, op, "output_size must be positive, got ", s);
}

// Adaptive window i of o over n: [floor(i n / o), ceil((i + 1) n / o)).
int64_t win_start(int64_t i, int64_t n, int64_t o) { return (i * n) / o; }
int64_t win_end(int64_t i, int64_t n, int64_t o) { return ((i + 1) * n + o - 1) / o; }

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, Shape output_size) {
  const char* op = "adaptive_avg_pool2d";
  ops::check_image(op, x);
  int64_t o[2];
  out_pair(op, output_size, o);
  const int64_t h = x.size(-2), w = x.size(-1);
  ACCEL_CHECK(h >= 1 && w >= 1, ShapeError, op, "input ", x.sizes(), " has an empty plane");
  // Equal windows: the pooling kernel.
  if (h % o[0] == 0 && w % o[1] == 0) return avg_pool2d(x, {h / o[0], w / o[1]});
  // Windows of two lengths: the mean over each window is separable, y = P_h x P_w^T with
  // P (o, n) holding 1 / len over window i.
  auto pool_matrix = [&](int64_t n, int64_t out) {
    std::vector<double> m(size_t(out * n), 0.0);
    for (int64_t i = 0; i < out; ++i) {
      const int64_t s = win_start(i, n, out), e = win_end(i, n, out);
      for (int64_t k = s; k < e; ++k) m[size_t(i * n + k)] = 1.0 / double(e - s);
    }
    Tensor t = tensor(m, Shape{out, n}, TensorOptions(kFloat64));
    if (x.dtype() != kFloat64) t = t.to(x.dtype());
    return x.device().is_cpu() ? t : t.to(x.device());
  };
  const Tensor ph = pool_matrix(h, o[0]), pw = pool_matrix(w, o[1]);
  return matmul(matmul(ph, x), pw.transpose(0, 1));
}

std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& x, Shape output_size) {
  const char* op = "adaptive_max_pool2d";
  ops::check_image(op, x);
  int64_t o[2];
  out_pair(op, output_size, o);
  const int64_t h = x.size(-2), w = x.size(-1);
  ACCEL_CHECK(h >= 1 && w >= 1, ShapeError, op, "input ", x.sizes(), " has an empty plane");
  // Gather every window, padded to the longest by repeating its last element (a repeat never
  // changes a maximum), into (..., oh, kh, ow, kw), then take the max over (kh, kw)
  // (Note [index-map ops]).
  auto windows = [](int64_t n, int64_t out, int64_t& k) {
    k = 0;
    for (int64_t i = 0; i < out; ++i) k = std::max(k, win_end(i, n, out) - win_start(i, n, out));
    std::vector<int64_t> idx(size_t(out * k));
    for (int64_t i = 0; i < out; ++i) {
      const int64_t s = win_start(i, n, out), len = win_end(i, n, out) - s;
      for (int64_t j = 0; j < k; ++j) idx[size_t(i * k + j)] = s + std::min(j, len - 1);
    }
    return idx;
  };
  int64_t kh, kw;
  const std::vector<int64_t> rows = windows(h, o[0], kh), cols = windows(w, o[1], kw);
  const int64_t nd = x.dim();
  const Tensor g = index_select(index_select(x, nd - 2, ops::index_vector(rows, x.device())),
                                nd - 1, ops::index_vector(cols, x.device()));
  // g: (..., oh kh, ow kw) -> (..., oh, ow, kh kw)
  Shape lead(x.sizes().begin(), x.sizes().end() - 2);
  Shape s6 = lead;
  for (int64_t v : {o[0], kh, o[1], kw}) s6.push_back(v);
  Shape perm;
  for (int64_t d = 0; d < int64_t(lead.size()); ++d) perm.push_back(d);
  const int64_t b = int64_t(lead.size());
  for (int64_t d : {b, b + 2, b + 1, b + 3}) perm.push_back(d);
  Shape s5 = lead;
  for (int64_t v : {o[0], o[1], kh * kw}) s5.push_back(v);
  const Tensor win = g.view(s6).permute(perm).reshape(s5);
  auto [values, arg] = max(win, -1);
  // Window position -> flat input index h * W + w: a table (oh, ow, kh kw) gathered by arg.
  std::vector<int64_t> table(size_t(o[0] * o[1] * kh * kw));
  for (int64_t i = 0; i < o[0]; ++i)
    for (int64_t j = 0; j < o[1]; ++j)
      for (int64_t a = 0; a < kh; ++a)
        for (int64_t c = 0; c < kw; ++c)
          table[size_t(((i * o[1] + j) * kh + a) * kw + c)] =
              rows[size_t(i * kh + a)] * w + cols[size_t(j * kw + c)];
  Tensor t = tensor(table, Shape{o[0], o[1], kh * kw}, TensorOptions(kInt64));
  if (!x.device().is_cpu()) t = t.to(x.device());
  Shape te = lead;
  for (int64_t v : {o[0], o[1], kh * kw}) te.push_back(v);
  Shape tv(lead.size(), 1);
  for (int64_t v : {o[0], o[1], kh * kw}) tv.push_back(v);
  const Tensor indices = gather(t.view(tv).expand(te), -1, arg.unsqueeze(-1)).squeeze(-1);
  return {values, indices};
}

Tensor adaptive_max_pool2d(const Tensor& x, Shape output_size) {
  const char* op = "adaptive_max_pool2d";
  ops::check_image(op, x);
  int64_t o[2];
  out_pair(op, output_size, o);
  const int64_t h = x.size(-2), w = x.size(-1);
  // Equal windows: the pooling kernel.
  if (h >= 1 && w >= 1 && h % o[0] == 0 && w % o[1] == 0)
    return max_pool2d(x, {h / o[0], w / o[1]});
  return std::get<0>(adaptive_max_pool2d_with_indices(x, std::move(output_size)));
}

}  // namespace accel
