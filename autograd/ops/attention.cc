// Fused scaled dot-product attention (moved out of nn.cc): forward, checks and backward.
//   q: (..., T, D), k: (..., S, D), v: (..., S, Dv) -> (..., T, Dv)
#include <array>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/context_attention.h"
#include "autograd/ops/common.h"
#include "core/sharded_random.h"
#include "kernels/stubs/nn.h"

namespace accel {

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
  if (dropout_p > 0) {
    // Heads on dim 1: under tensor parallelism with split heads, this rank's heads draw their
    // one-process masks (Note [dropout under tensor parallelism] in parallel/tp_random.cc).
    DrawSiteGuard site(DrawSite::AttentionWeights);
    p = dropout(p, dropout_p, true, gen);
  }
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
  const Tensor sq = s.q.unpack(), sk = s.k.unpack(), sv = s.v.unpack();
  const Tensor mask = s.mask.unpack();
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
  if (const ContextAttention* ca = context_attention(); ACCEL_UNLIKELY(ca != nullptr)) {
    // Note [context attention] in autograd/context_attention.h
    ACCEL_CHECK(!attn_mask.defined() && dropout_p == 0.0, ValueError, op, "under ", ca->what,
                ": ring attention takes no attn_mask and no dropout_p (got ",
                attn_mask.defined() ? "a mask" : "no mask", ", dropout_p ", dropout_p,
                "): each rank holds part of the sequence, and a mask or dropout over the whole "
                "(T, S) scores cannot be applied to it");
    ACCEL_CHECK(T == S, ValueError, op, "under ", ca->what,
                ": ring attention is self-attention over the split sequence (T == S), got q ",
                q.sizes(), " and k ", k.sizes());
    return ca->attend(q, k, v, is_causal, sc);
  }
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
    // q, k, v as given, for the create_graph backward (Note [double backward by recompute]): the
    // kernel's operands in `s` are detached.
    autograd::record(
        op, {&q, &k, &v}, {&out},
        [s, sc, is_causal, qs = autograd::save_input(q, 0), ks = autograd::save_input(k, 1),
         vs = autograd::save_input(v, 2)](const autograd::Grads& g) {
          if (autograd::creating_graph()) {
            const Tensor mask = s.mask.unpack();
            return autograd::recompute_grads(
                {qs.unpack(), ks.unpack(), vs.unpack()}, g,
                [&mask, sc, is_causal](const std::vector<Tensor>& in) {
                  return std::vector<Tensor>{
                      sdpa_composed(in[0], in[1], in[2], mask, is_causal, sc, 0.0, nullptr)};
                });
          }
          const Tensor sq = s.q.unpack(), sk = s.k.unpack(), sv = s.v.unpack();
          const DType dt = sq.dtype();
          const Device dev = sq.device();
          Tensor dq = empty_heads_last(sq.sizes(), dt, dev);
          Tensor dk = empty_heads_last(sk.sizes(), dt, dev);
          Tensor dv = empty_heads_last(sv.sizes(), dt, dev);
          sdpa_grads(s, sdpa_operand(ops::as_dtype(g[0], dt)), s.out.unpack(), sc, is_causal, dq,
                     dk, dv);
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
  if (!sdpa_fused(qkv) || T == 0 || ACCEL_UNLIKELY(autocast_enabled()) ||
      ACCEL_UNLIKELY(context_attention() != nullptr)) {
    // The composed path, and context parallelism's ring (Note [context attention]) through the
    // unpacked op.
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
        op, {&qkv}, {&y},
        [s, scale, causal, B, T, C, H, D, split, as_heads,
         qkvs = autograd::save_input(qkv, 0)](const autograd::Grads& g) {
          if (autograd::creating_graph()) {  // Note [double backward by recompute]
            return autograd::recompute_grads(
                {qkvs.unpack()}, g, [=](const std::vector<Tensor>& in) {
                  auto heads = [&](int64_t which) {
                    return in[0].narrow(2, which * C, C).reshape({B, T, H, D}).transpose(1, 2);
                  };
                  return std::vector<Tensor>{sdpa_composed(heads(0), heads(1), heads(2), Tensor(),
                                                           causal, scale, 0.0, nullptr)
                                                 .transpose(1, 2)
                                                 .reshape({B, T, C})};
                });
          }
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

// ---------------- context attention (autograd/context_attention.h) ----------------

namespace {
thread_local const ContextAttention* tls_context_attention = nullptr;
}  // namespace

const ContextAttention* context_attention() { return tls_context_attention; }

Tensor zigzag_part(const Tensor& x, int64_t dim, int rank, int size) {
  const int64_t L = x.size(dim) / (2 * int64_t(size));
  return cat({x.narrow(dim, rank * L, L), x.narrow(dim, (2 * int64_t(size) - 1 - rank) * L, L)},
             dim);
}

ContextAttentionGuard::ContextAttentionGuard(const ContextAttention* ca)
    : saved_(tls_context_attention) {
  tls_context_attention = ca;
}

ContextAttentionGuard::~ContextAttentionGuard() { tls_context_attention = saved_; }

}  // namespace accel
