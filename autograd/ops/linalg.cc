// Linear algebra: matmul (torch.matmul semantics), mm, bmm, linear; forward, checks and backward.
//   matmul: (..., M, K) @ (..., K, N) -> (broadcast(...), M, N); 1-D operands are promoted to a
//           row (left) or a column (right) and the added dim is removed from the result.
//   linear: x (..., in), w (out, in), b (out) -> (..., out), one oneDNN call with the bias fused.
// Backward (derivatives.yaml): dA = g @ B^T, dB = A^T @ g, each summed over broadcast batch dims;
// linear: dx = g @ w, dw = g^T @ x, db = sum of g over rows.
#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "kernels/stubs/linalg.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(matmul, "matmul");
ACCEL_DIFFERENTIABLE_OP(mm, "mm");
ACCEL_DIFFERENTIABLE_OP(bmm, "bmm");
ACCEL_DIFFERENTIABLE_OP(linear, "linear");

namespace {

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  ops::check_defined(a, op);
  ops::check_defined(b, op);
  ACCEL_CHECK(a.device() == b.device(), DeviceError, op,
              "expected both inputs on the same device, got ", a.device(), " ", a.sizes(), " and ",
              b.device(), " ", b.sizes());
  ACCEL_CHECK(a.dtype() == b.dtype(), DTypeError, op,
              "expected both inputs to have the same dtype, got ", a.dtype(), " ", a.sizes(),
              " and ", b.dtype(), " ", b.sizes());
  ACCEL_CHECK(a.is_floating_point(), DTypeError, op, "expected floating point inputs, got ",
              a.dtype(), " ", a.sizes(), " and ", b.dtype(), " ", b.sizes());
}

// Can the leading dims of x (..., K) be viewed as one row dim without a copy?
bool rows_foldable(const Tensor& x) {
  int64_t inner_stride = 0, inner_size = 0;  // the next non-1 dim inside
  for (int64_t d = x.dim() - 2; d >= 0; --d) {
    const int64_t s = x.sizes()[size_t(d)];
    if (s == 1) continue;
    const int64_t st = x.strides()[size_t(d)];
    if (inner_size != 0 && st != inner_stride * inner_size) return false;
    inner_stride = st;
    inner_size = s;
  }
  return true;
}

// The product of all but the last dimension (1 for a vector).
int64_t leading_rows(const Tensor& x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.sizes()[size_t(d)];
  return rows;
}

// x (..., K) as a (rows, K) tensor for the kernel: a view when possible, else a copy. Carries no
// autograd history (the op records its own node).
Tensor fold_rows(const Tensor& x) {
  const int64_t k = x.size(-1);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.sizes()[size_t(d)];
  if (x.dim() == 2) return x;
  if (!rows_foldable(x)) {
    Tensor c = ops::empty_on(x.sizes(), x.dtype(), x.device());
    copy_stub(x.device(), c, x);
    return ops::make_view(c, {rows, k}, {k, 1}, 0);
  }
  int64_t row_stride = k;
  for (int64_t d = x.dim() - 2; d >= 0; --d) {
    if (x.sizes()[size_t(d)] != 1) {
      row_stride = x.strides()[size_t(d)];
      break;
    }
  }
  return ops::make_view(x, {rows, k}, {row_stride, x.stride(-1)}, x.offset());
}

// Rank-r view of x (rank >= 2) with leading size-1 dims (x itself when it has rank r: kernels
// ignore autograd metadata).
Tensor pad_rank(const Tensor& x, int64_t r) {
  if (x.dim() == r) return x;
  Shape s(size_t(r - x.dim()), 1), st(size_t(r - x.dim()), 0);
  for (int64_t d = 0; d < x.dim(); ++d) {
    s.push_back(x.sizes()[size_t(d)]);
    st.push_back(x.strides()[size_t(d)]);
  }
  return ops::make_view(x, std::move(s), std::move(st), x.offset());
}

// Broadcast batch shape of a (..., M, K) and b (..., K, N), both rank >= 2.
Shape batch_shape(const char* op, const Tensor& a, const Tensor& b, const Shape& a_shown,
                  const Shape& b_shown) {
  const int64_t na = a.dim() - 2, nb = b.dim() - 2, n = std::max(na, nb);
  ACCEL_CHECK(n <= common::MatmulGeometry::kMaxBatch, ShapeError, op, "at most ",
              common::MatmulGeometry::kMaxBatch, " batch dimensions are supported, got ", n, ": ",
              a_shown, " @ ", b_shown);
  Shape out(size_t(n), 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t da = i - (n - na), db = i - (n - nb);
    const int64_t sa = da >= 0 ? a.sizes()[size_t(da)] : 1;
    const int64_t sb = db >= 0 ? b.sizes()[size_t(db)] : 1;
    ACCEL_CHECK(sa == sb || sa == 1 || sb == 1, ShapeError, op,
                "batch dimensions do not broadcast: ", a_shown, " @ ", b_shown);
    out[size_t(i)] = sa == 1 ? sb : sa;
  }
  return out;
}

// a (..., M, K) @ b (..., K, N), rank >= 2 each, already checked; no autograd.
Tensor matmul_raw(const Tensor& a, const Tensor& b, const Shape& batch) {
  const int64_t m = a.size(-2), n = b.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  if (b.dim() == 2 && a.dim() > 2 && rows_foldable(a)) {
    // (B..., M, K) @ (K, N): one (B*M, K) @ (K, N) GEMM.
    Tensor out = ops::empty_on({shape_numel(batch) * m, n}, a.dtype(), a.device());
    matmul_stub(a.device(), fold_rows(a), b, Tensor(), out);
    return ops::make_view(out, out_shape, contiguous_strides(out_shape), 0);
  }
  const int64_t r = int64_t(batch.size()) + 2;
  Tensor out = ops::empty_on(out_shape, a.dtype(), a.device());
  matmul_stub(a.device(), pad_rank(a, r), pad_rank(b, r), Tensor(), out);
  return out;
}

// Records the matmul backward for a (..., M, K) @ b (..., K, N), rank >= 2 each.
Tensor matmul_nd(const char* op, const Tensor& a, const Tensor& b, const Shape& batch) {
  Tensor out = matmul_raw(a, b, batch);
  if (autograd::needs_grad(a, b)) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    // a is read for b's gradient, b for a's (each saved only when needed).
    autograd::record(op, {&a, &b}, {&out},
                     [xs = gb ? autograd::save_input(a, 0) : autograd::SavedTensor(),
                      ys = ga ? autograd::save_input(b, 1) : autograd::SavedTensor(),
                      sa = a.sizes(), sb = b.sizes()](const autograd::Grads& g) {
                       const Tensor& go = g[0];
                       Tensor da, db;
                       if (ys.defined()) da = sum_to(matmul(go, ys.unpack().transpose(-1, -2)), sa);
                       if (xs.defined()) {
                         const Tensor& x = xs.unpack();
                         if (sb.size() == 2 && sa.size() > 2) {
                           // Weight shared over the batch: one (K, B*M) @ (B*M, N) GEMM.
                           db = mm(x.reshape({leading_rows(x), x.size(-1)}).t(),
                                   go.reshape({leading_rows(go), go.size(-1)}));
                         } else {
                           db = sum_to(matmul(x.transpose(-1, -2), go), sb);
                         }
                       }
                       return autograd::Grads{da, db};
                     });
  }
  return out;
}

void check_linear_shapes(const Tensor& x, const Tensor& w, const Tensor& b) {
  ACCEL_CHECK(w.dim() == 2, ShapeError, "linear", "weight must be 2-D (out, in), got ", w.sizes());
  ACCEL_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), ShapeError, "linear",
              "input features differ from weight: input ", x.sizes(), ", weight ", w.sizes());
  if (b.defined()) {
    ACCEL_CHECK(b.dim() == 1 && b.size(0) == w.size(0), ShapeError, "linear",
                "bias must have shape ", Shape{w.size(0)}, ", got ", b.sizes(), " for weight ",
                w.sizes());
  }
}

// x (..., in) as (rows, in) for the kernel.
Tensor linear_rows(const Tensor& x) {
  const int64_t in = x.size(-1);
  return x.dim() == 1 ? ops::make_view(x, {1, in}, {in, x.stride(0)}, x.offset()) : fold_rows(x);
}

// out2 (rows, out) viewed as x's leading dims + (out).
Tensor linear_unfold(const Tensor& out2, const Tensor& x) {
  if (x.dim() == 2) return out2;
  Shape out_shape = x.sizes();
  out_shape.back() = out2.size(1);
  return ops::make_view(out2, out_shape, contiguous_strides(out_shape), 0);
}

// Whether the one-node autocast GEMMs below take (x, w, b): every operand float32 or `low`, not
// all of them `low` already, and a 2-D weight whose shape fits (linear's shape errors are thrown
// here, by name; matmul's are left to the op's own checks, which name the shapes).
bool autocast_gemm_applies(const Tensor& x, const Tensor& w, const Tensor& b, bool w_nk,
                           DType low) {
  auto fits = [low](const Tensor& t) {
    return !t.defined() || t.dtype() == kFloat32 || t.dtype() == low;
  };
  auto is_low = [low](const Tensor& t) { return !t.defined() || t.dtype() == low; };
  if (!fits(x) || !fits(w) || !fits(b) || (is_low(x) && is_low(w) && is_low(b))) return false;
  if (w_nk) {
    check_linear_shapes(x, w, b);
    return true;
  }
  return w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(0);
}

// Linear (and matmul / mm by a 2-D weight) under autocast on a device that computes the autocast
// dtype in float32 (Note [autocast linear in float32] in kernels/stubs/linalg.h): the same values
// as casting x, w and b to the autocast dtype and running the op on the copies, in one node. The
// float32 operands are rounded inside the kernel (w through its cached float32 image), and float32
// inputs get their gradients rounded to the autocast dtype by the kernel, where the cast's
// backward would have converted a 16-bit gradient. `w_nk`: w is (N, K) and the product is
// x @ w^T (linear), else w is (K, N) and it is x @ w (matmul). Undefined when it does not apply:
// the caller casts as usual.
Tensor autocast_gemm_f32(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                         bool w_nk) {
  if (!x.defined() || !w.defined()) return Tensor();
  const DType low = autocast_dtype();
  const Device dev = x.device();
  if (w.device() != dev || (b.defined() && b.device() != dev)) return Tensor();
  if (!matmul_lowp_preferred_stub.has(dev.type) || !matmul_lowp_preferred_stub(dev, low))
    return Tensor();
  if (!autocast_gemm_applies(x, w, b, w_nk, low)) return Tensor();
  const int64_t k = x.size(-1), n = w_nk ? w.size(0) : w.size(1);
  const Tensor x2 = linear_rows(x);
  bool w_exact = false;
  const Tensor wi = w.dtype() == kFloat32 ? autocast_weight_image(w, low, &w_exact) : w.detach();
  auto transposed = [](const Tensor& t) {
    return ops::make_view(t, {t.size(1), t.size(0)}, {t.stride(1), t.stride(0)}, t.offset());
  };
  const Tensor wkn = w_nk ? transposed(wi) : wi;  // (K, N)
  // The bias through the cache too (one conversion per parameter per region); the kernel's
  // rounding of it is then the identity.
  bool b_exact = false;
  const Tensor bi = !b.defined()            ? Tensor()
                    : b.dtype() == kFloat32 ? autocast_weight_image(b, low, &b_exact)
                                            : b.detach();
  Tensor out2 = ops::empty_on({x2.size(0), n}, low, dev);
  matmul_lowp_stub(dev, x2, wkn, bi, out2, low, w_exact);
  Tensor out = linear_unfold(out2, x);
  if (autograd::needs_grad(x, w, b)) {
    const bool gx = x.requires_grad(), gw = w.requires_grad();
    const bool gb = b.defined() && b.requires_grad();
    autograd::record(
        op, {&x, &w, &b}, {&out},
        // x2 views x (or is a copy); the weight image is the cached conversion or w itself.
        [op, xsv = gw ? autograd::save_input(x2, 0) : autograd::SavedTensor(),
         wsv = gx ? autograd::save_input(transposed(wkn), 1) : autograd::SavedTensor(), w_exact,
         w_nk, low, dev, k, sx = x.sizes(), xdt = x.dtype(), wdt = w.dtype(),
         bdt = b.defined() ? b.dtype() : low, gx, gw, gb, transposed](const autograd::Grads& g) {
          if (autograd::creating_graph())
            autograd::throw_no_double_backward(
                op,
                "the one-node autocast GEMM calls its kernels directly; run the forward "
                "outside autocast");
          AutocastSuspend off;
          const Tensor& xs = xsv.unpack();
          const Tensor& wnk = wsv.unpack();
          const Tensor g2 = ops::as_dtype(g[0], low).reshape({-1, g[0].size(-1)});  // (rows, N)
          Tensor dx, dw, db;
          if (gx) {  // g @ (w as (K, N))^T
            Tensor dx2 = ops::empty_on({g2.size(0), k}, xdt, dev);
            matmul_lowp_stub(dev, g2, wnk, Tensor(), dx2, low, w_exact);
            dx = dx2.reshape(sx);
          }
          if (gw && w_nk) {  // g^T @ x: (N, K)
            dw = ops::empty_on({g2.size(1), k}, wdt, dev);
            matmul_lowp_stub(dev, g2.t(), xs, Tensor(), dw, low, false);
          } else if (gw) {  // x^T @ g: (K, N)
            dw = ops::empty_on({k, g2.size(1)}, wdt, dev);
            matmul_lowp_stub(dev, transposed(xs), g2, Tensor(), dw, low, false);
          }
          if (gb) db = ops::as_dtype(sum(g2, {0}), bdt);
          return autograd::Grads{dx, dw, db};
        });
  }
  return out;
}

// Note [autocast linear, native 16-bit]: where the device runs autocast's linear (and matmul / mm
// by a 2-D weight) as a 16-bit GEMM (the CPU with native bf16: Note [bf16 GEMM where it does not
// pay] in kernels/cpu/cpu_isa.h), one node replaces the cast nodes + linear of the general path:
// the forward converts float32 operands (weights through the cache, autocast_cast_detached) and
// runs the same 16-bit GEMM on the same values, so the output has the same bits. In the backward,
// the gradient of a float32 input (the float32 master weight, a float32 activation such as a
// LayerNorm output) is the GEMM's float32 accumulator written directly (Note [16-bit GEMM into
// float32] in kernels/stubs/linalg.h) instead of a 16-bit result that the cast's backward
// converts: one pass over the gradient less and one rounding less, so those gradients are the
// float32 sums of the same exact products (more accurate than the casts, within one bf16 rounding
// of them). The bias gradient is the 16-bit sum converted, as before. Like the float32 route, the
// backward calls the kernels directly: under create_graph it throws (Note [double backward]).
Tensor autocast_gemm_native(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                            bool w_nk) {
  if (!x.defined() || !w.defined()) return Tensor();
  const DType low = autocast_dtype();
  const Device dev = x.device();
  if (dev.type != DeviceType::CPU || w.device() != dev || (b.defined() && b.device() != dev))
    return Tensor();
  if (!autocast_gemm_applies(x, w, b, w_nk, low)) return Tensor();
  const int64_t k = x.size(-1), n = w_nk ? w.size(0) : w.size(1);
  const Tensor xl = autocast_cast_detached(x, low);  // x itself (detached) when it is `low`
  const Tensor x2 = linear_rows(xl);
  const Tensor wl = autocast_cast_detached(w, low);
  const Tensor bl = b.defined() ? autocast_cast_detached(b, low) : Tensor();
  auto transposed = [](const Tensor& t) {
    return ops::make_view(t, {t.size(1), t.size(0)}, {t.stride(1), t.stride(0)}, t.offset());
  };
  const Tensor wkn = w_nk ? transposed(wl) : wl;  // (K, N)
  Tensor out2 = ops::empty_on({x2.size(0), n}, low, dev);
  matmul_stub(dev, x2, wkn, bl, out2);
  Tensor out = linear_unfold(out2, x);
  if (autograd::needs_grad(x, w, b)) {
    const bool gx = x.requires_grad(), gw = w.requires_grad();
    const bool gb = b.defined() && b.requires_grad();
    const bool x_low = x.dtype() == low;
    // x2 views x when x is 16-bit already (saved as the input, so an in-place change of x is
    // caught), else it is the node's own conversion; wl is the cached conversion (or w's data).
    autograd::record(
        op, {&x, &w, &b}, {&out},
        [xsv = gw && x_low ? autograd::save_input(x2, 0) : autograd::SavedTensor(),
         xown = gw && !x_low ? x2 : Tensor(),
         wsv = gx && w.dtype() == low ? autograd::save_input(w, 1) : autograd::SavedTensor(),
         wown = gx && w.dtype() != low ? wl : Tensor(), w_nk, low, dev, k, sx = x.sizes(),
         xdt = x.dtype(), wdt = w.dtype(), bdt = b.defined() ? b.dtype() : low, gx, gw, gb,
         transposed, op](const autograd::Grads& g) {
          if (autograd::creating_graph())
            autograd::throw_no_double_backward(
                op,
                "the one-node autocast GEMM calls its kernels directly; run the forward "
                "outside autocast");
          AutocastSuspend off;
          const Tensor g2 = ops::as_dtype(g[0], low).reshape({-1, g[0].size(-1)});  // (rows, N)
          Tensor dx, dw, db;
          if (gx) {  // g @ (w as (K, N))^T
            const Tensor wv = wown.defined() ? wown : wsv.unpack().detach();
            // Allocated in x's shape: a fresh tensor (not a view) is what a leaf's .grad takes
            // without a copy.
            dx = ops::empty_on(sx, xdt, dev);
            Tensor dx2 = ops::make_view(dx, {g2.size(0), k}, {k, 1}, 0);
            matmul_stub(dev, g2, w_nk ? wv : transposed(wv), Tensor(), dx2);
          }
          if (gw) {
            const Tensor xs = xown.defined() ? xown : xsv.unpack().detach();
            if (w_nk) {  // g^T @ x: (N, K)
              dw = ops::empty_on({g2.size(1), k}, wdt, dev);
              matmul_stub(dev, g2.t(), xs, Tensor(), dw);
            } else {  // x^T @ g: (K, N)
              dw = ops::empty_on({k, g2.size(1)}, wdt, dev);
              matmul_stub(dev, transposed(xs), g2, Tensor(), dw);
            }
          }
          if (gb) db = ops::as_dtype(sum(g2, {0}), bdt);
          return autograd::Grads{dx, dw, db};
        });
  }
  return out;
}

// The one-node autocast routes: float32 compute where the device prefers it, else the native
// 16-bit GEMM on the CPU; undefined where neither applies (the caller casts).
Tensor autocast_gemm(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, bool w_nk) {
  if (Tensor y = autocast_gemm_f32(op, x, w, b, w_nk); y.defined()) return y;
  return autocast_gemm_native(op, x, w, b, w_nk);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    // A product by a 2-D weight (x @ W) takes the fused route where the device wants it.
    if (b.dim() == 2 && (a.dim() <= 2 || rows_foldable(a)))
      if (Tensor y = autocast_gemm("matmul", a, b, Tensor(), false); y.defined()) return y;
    const Tensor ac = autocast_cast(a), bc = autocast_cast(b);
    AutocastSuspend off;
    return matmul(ac, bc);
  }
  check_pair("matmul", a, b);
  ACCEL_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError, "matmul",
              "both arguments need at least 1 dimension, got ", a.sizes(), " @ ", b.sizes());
  const int64_t kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  ACCEL_CHECK(a.size(-1) == kb, ShapeError, "matmul", "inner dimensions differ: ", a.sizes(), " @ ",
              b.sizes());
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const Shape batch = batch_shape("matmul", a2, b2, a.sizes(), b.sizes());
  Tensor out = matmul_nd("matmul", a2, b2, batch);
  if (a.dim() == 1) out = out.squeeze(-2);
  if (b.dim() == 1) out = out.squeeze(-1);
  return out;
}

Tensor mm(const Tensor& a, const Tensor& b) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    if (a.dim() == 2)
      if (Tensor y = autocast_gemm("mm", a, b, Tensor(), false); y.defined()) return y;
    const Tensor ac = autocast_cast(a), bc = autocast_cast(b);
    AutocastSuspend off;
    return mm(ac, bc);
  }
  check_pair("mm", a, b);
  ACCEL_CHECK(a.dim() == 2 && b.dim() == 2, ShapeError, "mm", "expected 2-D tensors, got ",
              a.sizes(), " @ ", b.sizes());
  ACCEL_CHECK(a.size(1) == b.size(0), ShapeError, "mm", "inner dimensions differ: ", a.sizes(),
              " @ ", b.sizes());
  return matmul_nd("mm", a, b, Shape());
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    const Tensor ac = autocast_cast(a), bc = autocast_cast(b);
    AutocastSuspend off;
    return bmm(ac, bc);
  }
  check_pair("bmm", a, b);
  ACCEL_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "bmm", "expected 3-D tensors, got ",
              a.sizes(), " @ ", b.sizes());
  ACCEL_CHECK(a.size(0) == b.size(0), ShapeError, "bmm", "batch sizes differ: ", a.sizes(), " @ ",
              b.sizes());
  ACCEL_CHECK(a.size(2) == b.size(1), ShapeError, "bmm", "inner dimensions differ: ", a.sizes(),
              " @ ", b.sizes());
  return matmul_nd("bmm", a, b, Shape{a.size(0)});
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (ACCEL_UNLIKELY(autocast_enabled())) {  // Note [autocast in ops]
    if (Tensor y = autocast_gemm("linear", x, w, b, true); y.defined()) return y;
    const Tensor xc = autocast_cast(x), wc = autocast_cast(w), bc = autocast_cast(b);
    AutocastSuspend off;
    return linear(xc, wc, bc);
  }
  check_pair("linear", x, w);
  if (b.defined()) check_pair("linear", x, b);
  check_linear_shapes(x, w, b);
  const int64_t in = w.size(1), out_f = w.size(0);
  // x (..., in) -> x2 (rows, in); out2 = x2 @ w^T + b, with w^T a strided view (no copy).
  const Tensor x2 = linear_rows(x);
  Tensor out2 = ops::empty_on({x2.size(0), out_f}, x.dtype(), x.device());
  const Tensor wt = ops::make_view(w, {in, out_f}, {w.stride(1), w.stride(0)}, w.offset());
  matmul_stub(x.device(), x2, wt, b, out2);
  Tensor out = linear_unfold(out2, x);
  if (autograd::needs_grad(x, w, b)) {
    const bool gx = x.requires_grad(), gw = w.requires_grad();
    const bool gb = b.defined() && b.requires_grad();
    // x itself is saved (x2, its (rows, in) form for the kernel, is a plain view or copy with
    // no history); the backward folds it again (a view, or a copy for a layout that needs one).
    autograd::record("linear", {&x, &w, &b}, {&out},
                     [xs = gw ? autograd::save_input(x, 0) : autograd::SavedTensor(),
                      ws = gx ? autograd::save_input(w, 1) : autograd::SavedTensor(),
                      sx = x.sizes(), gx, gw, gb](const autograd::Grads& g) {
                       // (rows, out); rows spelled out: -1 is ambiguous for 0 features (a
                       // tensor-parallel rank holding none of a layer's columns).
                       const Tensor g2 = g[0].reshape({leading_rows(g[0]), g[0].size(-1)});
                       Tensor dx, dw, db;
                       if (gx) dx = mm(g2, ws.unpack()).reshape(sx);
                       if (gw) {
                         const Tensor xv = xs.unpack();
                         // Under create_graph, folded by the differentiable reshape.
                         dw = mm(g2.t(), autograd::creating_graph()
                                             ? xv.reshape({leading_rows(xv), xv.size(-1)})
                                             : linear_rows(xv));
                       }
                       if (gb) db = sum(g2, {0});
                       return autograd::Grads{dx, dw, db};
                     });
  }
  return out;
}

Tensor Tensor::matmul(const Tensor& o) const { return accel::matmul(*this, o); }

}  // namespace accel
