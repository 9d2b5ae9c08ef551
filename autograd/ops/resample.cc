// Resampling ops, torch.nn.functional's definitions, arguments and defaults: pixel_shuffle /
// pixel_unshuffle (reshape and permute), pad (constant, reflect, replicate, circular) and
// interpolate (nearest, linear, bilinear), composed from other ops, so they run and differentiate
// on every device.
//
// Note [index-map ops]: reflect / replicate / circular padding, nearest and linear interpolation
// and adaptive max pooling are gathers along one dim at a time through index_select with an index
// vector computed here (index_select's backward is index_add, so a source element read several
// times gets the sum of its gradients). Each costs one pass over its output per padded /
// resized dim, with no kernel of its own.
#include <algorithm>
#include <cmath>

#include "autograd/ops/common.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(pixel_shuffle, "pixel_shuffle");
ACCEL_DIFFERENTIABLE_OP(pixel_unshuffle, "pixel_unshuffle");
ACCEL_DIFFERENTIABLE_OP(pad, "pad");
ACCEL_DIFFERENTIABLE_OP(interpolate, "interpolate");

namespace {

// A vector of weights of dtype dt on dev, shaped to broadcast along `dim` of a `rank`-D tensor.
Tensor weight_along(const std::vector<double>& v, int64_t dim, int64_t rank, DType dt, Device dev) {
  Shape s(size_t(rank), 1);
  s[size_t(dim)] = int64_t(v.size());
  Tensor t = tensor(v, s, TensorOptions(kFloat64));
  if (dt != kFloat64) t = t.to(dt);
  return dev.is_cpu() ? t : t.to(dev);
}

}  // namespace

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
    y = index_select(y, d, ops::index_vector(idx, x.device()));
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
      y = index_select(y, d, ops::index_vector(idx, x.device()));
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
    y = add(mul(index_select(y, d, ops::index_vector(i0, x.device())), w0),
            mul(index_select(y, d, ops::index_vector(i1, x.device())), w1));
  }
  return y;
}

}  // namespace accel
