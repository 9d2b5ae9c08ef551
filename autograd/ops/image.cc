// Image-model ops (issue 24), torch.nn.functional's definitions, arguments and defaults:
//   group_norm (fused kernel: kernels/<backend>/nn_group_norm.*) and instance_norm (group_norm
//   with C groups, or the running statistics);
//   composed from other ops, so they run and differentiate on every device: adaptive pools,
//   pixel_shuffle / pixel_unshuffle, pad, interpolate, leaky_relu, elu.
// conv_transpose2d and the 1-D convolutions are in conv.cc.
//
// Note [index-map ops]: reflect / replicate / circular padding, nearest and linear interpolation
// and adaptive max pooling are gathers along one dim at a time through index_select with an index
// vector computed here (index_select's backward is index_add, so a source element read several
// times gets the sum of its gradients). Each costs one pass over its output per padded /
// resized dim, with no kernel of its own.
#include <algorithm>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "kernels/stubs/nn.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(group_norm, "group_norm");
ACCEL_DIFFERENTIABLE_OP(instance_norm, "instance_norm");
ACCEL_DIFFERENTIABLE_OP(adaptive_avg_pool2d, "adaptive_avg_pool2d");
ACCEL_DIFFERENTIABLE_OP(adaptive_max_pool2d, "adaptive_max_pool2d");
ACCEL_DIFFERENTIABLE_OP(pixel_shuffle, "pixel_shuffle");
ACCEL_DIFFERENTIABLE_OP(pixel_unshuffle, "pixel_unshuffle");
ACCEL_DIFFERENTIABLE_OP(pad, "pad");
ACCEL_DIFFERENTIABLE_OP(interpolate, "interpolate");
ACCEL_DIFFERENTIABLE_OP(leaky_relu, "leaky_relu");
ACCEL_DIFFERENTIABLE_OP(elu, "elu");

namespace {

Tensor contiguous_data(const Tensor& t) { return t.is_contiguous() ? t : t.detach().contiguous(); }
Tensor maybe_contiguous(const Tensor& t) { return t.defined() ? contiguous_data(t) : t; }

// An int64 index vector on `dev`.
Tensor index_vector(const std::vector<int64_t>& v, Device dev) {
  Tensor t = tensor(v, Shape{int64_t(v.size())}, TensorOptions(kInt64));
  return dev.is_cpu() ? t : t.to(dev);
}

// A vector of weights of dtype dt on dev, shaped to broadcast along `dim` of a `rank`-D tensor.
Tensor weight_along(const std::vector<double>& v, int64_t dim, int64_t rank, DType dt, Device dev) {
  Shape s(size_t(rank), 1);
  s[size_t(dim)] = int64_t(v.size());
  Tensor t = tensor(v, s, TensorOptions(kFloat64));
  if (dt != kFloat64) t = t.to(dt);
  return dev.is_cpu() ? t : t.to(dev);
}

void check_image(const char* op, const Tensor& x) {
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  ACCEL_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op,
              "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got ", x.sizes());
}

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

// ---------------- group_norm / instance_norm ----------------

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
                     [xs = autograd::save_input(xc, 0), ws = autograd::save_input(wc, 1), mu, rs,
                      num_groups, gx, gw, gb](const autograd::Grads& g) {
                       const Tensor& xd = xs.unpack();
                       const Tensor& wd = ws.unpack();
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

// ---------------- adaptive pooling ----------------

Tensor adaptive_avg_pool2d(const Tensor& x, Shape output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_image(op, x);
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
  check_image(op, x);
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
  const Tensor g = index_select(index_select(x, nd - 2, index_vector(rows, x.device())), nd - 1,
                                index_vector(cols, x.device()));
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
  check_image(op, x);
  int64_t o[2];
  out_pair(op, output_size, o);
  const int64_t h = x.size(-2), w = x.size(-1);
  // Equal windows: the pooling kernel.
  if (h >= 1 && w >= 1 && h % o[0] == 0 && w % o[1] == 0)
    return max_pool2d(x, {h / o[0], w / o[1]});
  return std::get<0>(adaptive_max_pool2d_with_indices(x, std::move(output_size)));
}

// ---------------- pixel shuffle ----------------

Tensor pixel_shuffle(const Tensor& x, int64_t r) {
  const char* op = "pixel_shuffle";
  ops::check_defined(x, op);
  ACCEL_CHECK(r >= 1, ValueError, op, "upscale_factor must be positive, got ", r);
  ACCEL_CHECK(x.dim() >= 3 && x.size(-3) % (r * r) == 0, ShapeError, op,
              "expected an input (*, C r^2, H, W) with r = ", r, ", got ", x.sizes());
  Shape lead(x.sizes().begin(), x.sizes().end() - 3);
  const int64_t c = x.size(-3) / (r * r), h = x.size(-2), w = x.size(-1);
  const int64_t b = int64_t(lead.size());
  Shape s = lead, perm, out = lead;
  for (int64_t v : {c, r, r, h, w}) s.push_back(v);
  for (int64_t d = 0; d < b; ++d) perm.push_back(d);
  for (int64_t d : {b, b + 3, b + 1, b + 4, b + 2}) perm.push_back(d);  // (C, H, r, W, r)
  for (int64_t v : {c, h * r, w * r}) out.push_back(v);
  return x.reshape(s).permute(perm).reshape(out);
}

Tensor pixel_unshuffle(const Tensor& x, int64_t r) {
  const char* op = "pixel_unshuffle";
  ops::check_defined(x, op);
  ACCEL_CHECK(r >= 1, ValueError, op, "downscale_factor must be positive, got ", r);
  ACCEL_CHECK(x.dim() >= 3 && x.size(-2) % r == 0 && x.size(-1) % r == 0, ShapeError, op,
              "expected an input (*, C, H r, W r) with r = ", r, ", got ", x.sizes());
  Shape lead(x.sizes().begin(), x.sizes().end() - 3);
  const int64_t c = x.size(-3), h = x.size(-2) / r, w = x.size(-1) / r;
  const int64_t b = int64_t(lead.size());
  Shape s = lead, perm, out = lead;
  for (int64_t v : {c, h, r, w, r}) s.push_back(v);
  for (int64_t d = 0; d < b; ++d) perm.push_back(d);
  for (int64_t d : {b, b + 2, b + 4, b + 1, b + 3}) perm.push_back(d);  // (C, r, r, H, W)
  for (int64_t v : {c * r * r, h, w}) out.push_back(v);
  return x.reshape(s).permute(perm).reshape(out);
}

// ---------------- pad ----------------

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode, double value) {
  const char* op = "pad";
  ops::check_defined(x, op);
  const int64_t npad = int64_t(pads.size()) / 2;
  ACCEL_CHECK(pads.size() % 2 == 0 && npad <= x.dim(), ValueError, op,
              "pads must hold (left, right) pairs for at most ", x.dim(), " dims of input ",
              x.sizes(), ", got ", pads.size(), " values");
  const bool constant = mode == "constant";
  ACCEL_CHECK(constant || mode == "reflect" || mode == "replicate" || mode == "circular",
              ValueError, op, "mode must be \"constant\", \"reflect\", \"replicate\" or ",
              "\"circular\", got \"", std::string(mode), "\"");
  ACCEL_CHECK(constant || value == 0.0, ValueError, op, "a fill value (", value,
              ") applies only to mode \"constant\", not \"", std::string(mode), "\"");
  ACCEL_CHECK(constant || npad <= 3, ValueError, op, "mode \"", std::string(mode),
              "\" pads at most the last 3 dims, got ", npad);
  Tensor y = x;
  for (int64_t k = 0; k < npad; ++k) {
    const int64_t d = x.dim() - 1 - k, l = pads[size_t(2 * k)], r = pads[size_t(2 * k + 1)];
    const int64_t n = y.size(d);
    if (l == 0 && r == 0) continue;
    ACCEL_CHECK(n + l + r >= 0, ShapeError, op, "pads (", l, ", ", r, ") of dim ", d,
                " leave a negative size for input ", x.sizes());
    if (constant) {
      // Negative pads crop; positive ones concatenate blocks of `value`.
      const int64_t lc = std::max<int64_t>(-l, 0), rc = std::max<int64_t>(-r, 0);
      if (lc + rc > 0) y = y.narrow(d, std::min(lc, n), std::max<int64_t>(n - lc - rc, 0));
      std::vector<Tensor> parts;
      auto block = [&](int64_t len) {
        Shape s = y.sizes();
        s[size_t(d)] = len;
        return full(s, value, TensorOptions(y.dtype(), y.device()));
      };
      if (l > 0) parts.push_back(block(l));
      parts.push_back(y);
      if (r > 0) parts.push_back(block(r));
      if (parts.size() > 1) y = cat(parts, d);
      continue;
    }
    ACCEL_CHECK(l >= 0 && r >= 0, ValueError, op, "mode \"", std::string(mode),
                "\" needs non-negative pads, got (", l, ", ", r, ") for dim ", d);
    if (mode == "reflect") {
      ACCEL_CHECK(l < n && r < n, ValueError, op, "reflect pads (", l, ", ", r,
                  ") must be smaller than the size ", n, " of dim ", d, " of input ", x.sizes());
    } else if (mode == "circular") {
      ACCEL_CHECK(l <= n && r <= n, ValueError, op, "circular pads (", l, ", ", r,
                  ") must be at most the size ", n, " of dim ", d, " of input ", x.sizes());
    } else {
      ACCEL_CHECK(n > 0, ValueError, op, "replicate cannot pad the empty dim ", d, " of input ",
                  x.sizes());
    }
    std::vector<int64_t> idx(size_t(n + l + r));
    for (int64_t i = -l; i < n + r; ++i) {
      int64_t j = i;
      if (mode == "reflect") {
        j = i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
      } else if (mode == "replicate") {
        j = std::clamp<int64_t>(i, 0, n - 1);
      } else {
        j = ((i % n) + n) % n;
      }
      idx[size_t(i + l)] = j;
    }
    y = index_select(y, d, index_vector(idx, x.device()));
  }
  return y;
}

// ---------------- interpolate ----------------

Tensor interpolate(const Tensor& x, Shape size, std::vector<double> scale_factor,
                   std::string_view mode, std::optional<bool> align_corners,
                   bool recompute_scale_factor) {
  const char* op = "interpolate";
  ops::check_defined(x, op);
  ops::check_floating(x, op);
  const bool nearest = mode == "nearest";
  const bool lin = mode == "linear" || mode == "bilinear";
  ACCEL_CHECK(nearest || lin, ValueError, op,
              "mode must be \"nearest\", \"linear\" or \"bilinear\", got \"", std::string(mode),
              "\"");
  const int64_t spatial = x.dim() - 2;
  ACCEL_CHECK((spatial == 1 && mode != "bilinear") || (spatial == 2 && mode != "linear"),
              ShapeError, op, "mode \"", std::string(mode), "\" expects a ",
              mode == "linear" ? "3-D (N, C, L)" : (lin ? "4-D (N, C, H, W)" : "3-D or 4-D"),
              " input, got ", x.sizes());
  ACCEL_CHECK(!align_corners || lin, ValueError, op,
              "align_corners applies only to the linear modes, not \"", std::string(mode), "\"");
  ACCEL_CHECK(size.empty() != scale_factor.empty(), ValueError, op,
              "give exactly one of size and scale_factor");
  auto expand = [&](auto& v, const char* what) {
    ACCEL_CHECK(int64_t(v.size()) == 1 || int64_t(v.size()) == spatial, ValueError, op, what,
                " must have 1 or ", spatial, " entries for input ", x.sizes(), ", got ", v.size());
    if (v.size() == 1 && spatial == 2) {
      const auto first = v.front();
      v.assign(2, first);
    }
  };
  std::vector<int64_t> out(static_cast<size_t>(spatial));
  if (!size.empty()) {
    std::vector<int64_t> s(size.begin(), size.end());
    expand(s, "size");
    for (int64_t i = 0; i < spatial; ++i) {
      ACCEL_CHECK(s[size_t(i)] >= 1, ValueError, op, "size must be positive, got ", size);
      out[size_t(i)] = s[size_t(i)];
    }
  } else {
    expand(scale_factor, "scale_factor");
    for (int64_t i = 0; i < spatial; ++i) {
      const double f = scale_factor[size_t(i)];
      ACCEL_CHECK(f > 0 && std::isfinite(f), ValueError, op, "scale_factor must be positive, got ",
                  f);
      out[size_t(i)] = int64_t(std::floor(double(x.size(2 + i)) * f));
      ACCEL_CHECK(out[size_t(i)] >= 1, ValueError, op, "scale_factor ", f, " gives an empty ",
                  "output for input ", x.sizes());
    }
  }
  const bool ac = align_corners.value_or(false);
  Tensor y = x;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t d = 2 + i, in = x.size(d), o = out[size_t(i)];
    ACCEL_CHECK(in >= 1, ShapeError, op, "cannot interpolate the empty dim ", d, " of input ",
                x.sizes());
    // torch's source-index rule: the scale is 1 / scale_factor when one was given (and not
    // recomputed), else in / out.
    const bool given = !scale_factor.empty() && !recompute_scale_factor;
    if (nearest) {
      if (in == o) continue;
      // In float, as torch's nearest_idx, so boundary indices match it exactly.
      const float step = given ? float(1.0 / scale_factor[size_t(i)]) : float(in) / float(o);
      std::vector<int64_t> idx(static_cast<size_t>(o));
      for (int64_t k = 0; k < o; ++k)
        idx[size_t(k)] = std::min(int64_t(std::floor(float(k) * step)), in - 1);
      y = index_select(y, d, index_vector(idx, x.device()));
      continue;
    }
    // Linear: y[k] = l0 x[i0] + l1 x[i1] (Note [index-map ops]).
    double step;
    if (ac) {
      step = o > 1 ? double(in - 1) / double(o - 1) : 0.0;
    } else {
      step = given ? 1.0 / scale_factor[size_t(i)] : double(in) / double(o);
    }
    std::vector<int64_t> i0(static_cast<size_t>(o)), i1(static_cast<size_t>(o));
    std::vector<double> l0(static_cast<size_t>(o)), l1(static_cast<size_t>(o));
    for (int64_t k = 0; k < o; ++k) {
      double src = ac ? step * double(k) : step * (double(k) + 0.5) - 0.5;
      if (src < 0) src = 0;
      const int64_t a = std::min(int64_t(src), in - 1);
      i0[size_t(k)] = a;
      i1[size_t(k)] = a + (a < in - 1 ? 1 : 0);
      l1[size_t(k)] = src - double(a);
      l0[size_t(k)] = 1.0 - l1[size_t(k)];
    }
    const Tensor w0 = weight_along(l0, d, y.dim(), y.dtype(), x.device());
    const Tensor w1 = weight_along(l1, d, y.dim(), y.dtype(), x.device());
    y = add(mul(index_select(y, d, index_vector(i0, x.device())), w0),
            mul(index_select(y, d, index_vector(i1, x.device())), w1));
  }
  return y;
}

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

}  // namespace accel
