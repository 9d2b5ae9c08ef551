#include "nn/attention.h"

#include "autograd/context_attention.h"

#include <cmath>
#include <sstream>

#include "nn/init.h"
#include "autograd/ops.h"
#include "core/sharded_random.h"

namespace accel::nn {

CausalSelfAttention::CausalSelfAttention(int64_t c, int64_t h, bool bias, double p, Generator* gen)
    : d_model(c), n_heads(h), head_dim(h > 0 ? c / h : 0), local_heads(h) {
  ACCEL_CHECK(c > 0 && h > 0 && c % h == 0, ValueError, "CausalSelfAttention", "d_model (", c,
              ") must be a positive multiple of n_heads (", h, ")");
  qkv = register_module("qkv", std::make_shared<Linear>(c, 3 * c, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(c, c, bias, gen));
  // The dropouts draw from the default generator: `gen` initialises, and is often a local that
  // is gone by the first training step.
  attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(p));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(p));
}

const Tensor& CausalSelfAttention::causal_mask(int64_t T, Device device) {
  if (!mask_.defined() || mask_.size(0) != T || mask_.device() != device) {
    Tensor m = empty({T, T}, kBool);
    bool* p = m.data<bool>();
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) p[i * T + j] = j > i;
    }
    mask_ = m.to(device);
  }
  return mask_;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, "CausalSelfAttention", "input is undefined");
  ACCEL_CHECK(x.dim() == 3 && x.size(2) == d_model, ShapeError, "CausalSelfAttention",
              "expected input (B, T, ", d_model, "), got ", x.sizes());
  // Through operator(): a tensor-parallel style wraps qkv and proj (parallel/tensor_parallel.h).
  // Under sequence parallelism x is this rank's chunk of the sequence and qkv gathers it, so B
  // and T are read from qkv's output; C is the width of the local heads.
  const Tensor qkv_out = (*qkv)(x);  // (B, T, 3C)
  const int64_t B = qkv_out.size(0), T = qkv_out.size(1), H = local_heads, D = head_dim;
  const int64_t C = H * D;
  if (H == 0) {
    // A tensor-parallel rank holding none of the heads (torch.chunk's last pieces may be empty:
    // parallel/tensor_parallel.cc Note [uneven tp shards]). The output stays a view of qkv's, so
    // the backward reaches qkv's collectives on this rank too; proj adds nothing but its share.
    return resid_dropout->forward((*proj)(qkv_out.narrow(2, 0, 0)));
  }
  if (attn_dropout->p == 0.0 || !attn_dropout->is_training()) {
    // One fused op reads q, k, v in place from the packed projection and writes the merged heads
    // (Note [fused attention] in kernels/cpu/nn_attention.cc); same math as the composed path
    // below.
    const Tensor y = scaled_dot_product_attention_packed(qkv_out, H, /*causal=*/true);
    return resid_dropout->forward((*proj)(y));
  }
  // Dropout on the attention weights needs them materialised: the composed path, which cannot
  // see the other ranks' keys under context parallelism (Note [context attention]).
  if (const ContextAttention* ca = context_attention(); ca != nullptr) {
    ACCEL_THROW(ValueError, "CausalSelfAttention", "attention dropout (p ", attn_dropout->p,
                ") under ", ca->what,
                ": the attention weights of a split sequence are never whole on one rank; "
                "set the attention dropout to 0 or use cp_size 1");
  }
  // (B, T, C) slice -> (B, T, H, D) -> (B, H, T, D)
  auto heads = [&](int64_t which) {
    return qkv_out.narrow(2, which * C, C).reshape({B, T, H, D}).transpose(1, 2);
  };
  // Scaling q (B, H, T, D) is cheaper than scaling the scores (B, H, T, T) when D < T.
  const Tensor q = heads(0) * (1.0 / std::sqrt(double(D)));
  const Tensor k = heads(1);
  const Tensor v = heads(2);
  Tensor att = matmul(q, k.transpose(-2, -1));                    // (B, H, T, T)
  att = masked_fill(att, causal_mask(T, x.device()), -INFINITY);  // hide the future
  {
    // Heads on dim 1 (Note [dropout under tensor parallelism] in parallel/tp_random.cc).
    DrawSiteGuard site(DrawSite::AttentionWeights);
    att = attn_dropout->forward(softmax(att, -1));
  }
  const Tensor y = matmul(att, v).transpose(1, 2).reshape({B, T, C});  // (B, T, C)
  return resid_dropout->forward((*proj)(y));
}

std::string CausalSelfAttention::extra_repr() const {
  std::ostringstream os;
  os << "d_model=" << d_model << ", n_heads=" << n_heads;
  return os.str();
}

}  // namespace accel::nn

namespace accel::nn {

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double p, bool bias, bool add_bias_kv,
                                       bool add_zero_attn, std::optional<int64_t> kd,
                                       std::optional<int64_t> vd, bool bf, Generator* gen)
    : embed_dim(e),
      kdim(kd.value_or(e)),
      vdim(vd.value_or(e)),
      num_heads(h),
      head_dim(h > 0 ? e / h : 0),
      dropout(p),
      batch_first(bf),
      qkv_same_embed_dim(kdim == e && vdim == e),
      gen_(gen) {
  const char* op = "MultiheadAttention";
  ACCEL_CHECK(e > 0 && h > 0 && e % h == 0, ValueError, op, "embed_dim (", e,
              ") must be a positive multiple of num_heads (", h, ")");
  ACCEL_CHECK(kdim > 0 && vdim > 0, ValueError, op, "kdim and vdim must be positive, got ", kdim,
              " and ", vdim);
  ACCEL_CHECK(p >= 0 && p <= 1, ValueError, op, "dropout must be in [0, 1], got ", p);
  ACCEL_CHECK(!add_bias_kv && !add_zero_attn, ValueError, op,
              "add_bias_kv and add_zero_attn are not supported");
  if (qkv_same_embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * e, e}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({e, e}));
    k_proj_weight = register_parameter("k_proj_weight", empty({e, kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({e, vdim}));
  }
  if (bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, bias, gen));
  reset_parameters(gen);
}

void MultiheadAttention::reset_parameters(Generator* gen) {
  if (qkv_same_embed_dim) {
    init::xavier_uniform_(in_proj_weight, 1.0, gen);
  } else {
    init::xavier_uniform_(q_proj_weight, 1.0, gen);
    init::xavier_uniform_(k_proj_weight, 1.0, gen);
    init::xavier_uniform_(v_proj_weight, 1.0, gen);
  }
  if (in_proj_bias.defined()) {
    init::zeros_(in_proj_bias);
    init::zeros_(out_proj->bias);
  }
}

namespace {

// A mask as scores to add in dtype dt: bool true (torch's "not allowed" here) -> -inf.
Tensor additive(const Tensor& m, DType dt) {
  if (m.dtype() != kBool) return m;
  return masked_fill(zeros(m.sizes(), TensorOptions(dt, m.device())), m, -INFINITY);
}

void check_mask_dtype(const Tensor& m, const char* name) {
  ACCEL_CHECK(m.dtype() == kBool || is_floating(m.dtype()), DTypeError, "MultiheadAttention", name,
              " must be bool or floating, got ", m.dtype(), " of shape ", m.sizes());
}

}  // namespace

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value,
                                                       std::optional<Tensor> key_padding_mask,
                                                       bool need_weights,
                                                       std::optional<Tensor> attn_mask,
                                                       bool average_attn_weights, bool is_causal) {
  const char* op = "MultiheadAttention";
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(query.defined() && key.defined() && value.defined(), ValueError, op,
              "query, key and value must be defined");
  const bool batched = query.dim() == 3;
  ACCEL_CHECK(
      (batched || query.dim() == 2) && key.dim() == query.dim() && value.dim() == query.dim(),
      ShapeError, op,
      "expected query, key and value all batched (3-D) or all unbatched (2-D), got ", query.sizes(),
      ", ", key.sizes(), ", ", value.sizes());
  // -> (L, N, E), (S, N, kdim), (S, N, vdim)
  Tensor qi = query, ki = key, vi = value;
  if (!batched) {
    qi = qi.unsqueeze(1);
    ki = ki.unsqueeze(1);
    vi = vi.unsqueeze(1);
  } else if (batch_first) {
    qi = qi.transpose(0, 1);
    ki = ki.transpose(0, 1);
    vi = vi.transpose(0, 1);
  }
  const int64_t L = qi.size(0), N = qi.size(1), S = ki.size(0);
  const int64_t E = embed_dim, H = num_heads, hd = head_dim;
  ACCEL_CHECK(qi.size(2) == E && ki.size(2) == kdim && vi.size(2) == vdim && ki.size(1) == N &&
                  vi.size(1) == N && vi.size(0) == S,
              ShapeError, op, "expected query (L, N, ", E, "), key (S, N, ", kdim,
              ") and value (S, N, ", vdim, ")", batch_first ? " (batch_first: N first)" : "",
              batched ? "" : " without N", ", got ", query.sizes(), ", ", key.sizes(), ", ",
              value.sizes());

  // Input projections: one GEMM for self-attention on one tensor, three otherwise.
  Tensor q, k, v;
  Tensor bq, bk, bv;
  if (in_proj_bias.defined()) {
    bq = in_proj_bias.narrow(0, 0, E);
    bk = in_proj_bias.narrow(0, E, E);
    bv = in_proj_bias.narrow(0, 2 * E, E);
  }
  if (qkv_same_embed_dim && query.is_same(key) && key.is_same(value)) {
    const Tensor qkv = linear(qi, in_proj_weight, in_proj_bias);  // (L, N, 3E)
    q = qkv.narrow(2, 0, E);
    k = qkv.narrow(2, E, E);
    v = qkv.narrow(2, 2 * E, E);
  } else if (qkv_same_embed_dim) {
    q = linear(qi, in_proj_weight.narrow(0, 0, E), bq);
    k = linear(ki, in_proj_weight.narrow(0, E, E), bk);
    v = linear(vi, in_proj_weight.narrow(0, 2 * E, E), bv);
  } else {
    q = linear(qi, q_proj_weight, bq);
    k = linear(ki, k_proj_weight, bk);
    v = linear(vi, v_proj_weight, bv);
  }
  // (n, N, E) -> (N, H, n, hd), a view
  auto heads = [N, H, hd](const Tensor& t, int64_t n) {
    return t.reshape({n, N, H, hd}).permute({1, 2, 0, 3});
  };

  // Masks -> one (N | 1, H | 1, L, S) mask for scaled_dot_product_attention.
  Tensor kpm = key_padding_mask.value_or(Tensor()), am = attn_mask.value_or(Tensor());
  ACCEL_CHECK(!is_causal || am.defined(), ValueError, op,
              "is_causal is a hint that attn_mask is the causal mask (as in torch): give "
              "attn_mask too, e.g. Transformer::generate_square_subsequent_mask(",
              L, ")");
  if (kpm.defined()) {
    check_mask_dtype(kpm, "key_padding_mask");
    if (!batched) kpm = kpm.unsqueeze(0);
    ACCEL_CHECK(kpm.dim() == 2 && kpm.size(0) == N && kpm.size(1) == S, ShapeError, op,
                "expected key_padding_mask (N, S) = (", N, ", ", S, ")",
                batched ? "" : " or (S) unbatched", ", got ", key_padding_mask->sizes());
    kpm = kpm.reshape({N, 1, 1, S});
  }
  if (am.defined()) {
    check_mask_dtype(am, "attn_mask");
    const bool ok = (am.dim() == 2 && am.size(0) == L && am.size(1) == S) ||
                    (am.dim() == 3 && am.size(0) == N * H && am.size(1) == L && am.size(2) == S);
    ACCEL_CHECK(ok, ShapeError, op, "expected attn_mask (L, S) = (", L, ", ", S,
                ") or (N * num_heads, L, S) = (", N * H, ", ", L, ", ", S, "), got ", am.sizes());
    am = am.dim() == 2 ? am.reshape({1, 1, L, S}) : am.reshape({N, H, L, S});
  }
  // The causal hint reaches the kernel only where torch's does: no padding mask, no weights.
  const bool causal = is_causal && !kpm.defined() && !need_weights;
  const DType dt = q.dtype();
  Tensor mask;  // scaled_dot_product_attention's convention: bool true = takes part
  if (!causal) {
    if (am.defined() && kpm.defined()) {
      mask = add(additive(am, dt), additive(kpm, dt));
    } else if (am.defined() || kpm.defined()) {
      const Tensor& m = am.defined() ? am : kpm;
      mask = m.dtype() == kBool ? logical_not(m) : m;
    }
  }

  const double p = is_training() ? dropout : 0.0;
  const Tensor qh = heads(q, L), kh = heads(k, S), vh = heads(v, S);
  Tensor attn, weights;  // (N, H, L, hd), (N, H, L, S)
  if (const ContextAttention* ca = context_attention(); ca != nullptr) {
    ACCEL_CHECK(!need_weights, ValueError, "MultiheadAttention", "need_weights under ", ca->what,
                ": the attention weights of a split sequence are never whole on one rank; call "
                "it with need_weights = false");
  }
  if (!need_weights) {
    attn = scaled_dot_product_attention(qh, kh, vh, mask, p, causal, std::nullopt, gen_);
  } else {
    // torch's materialised path: the weights are returned, after dropout.
    Tensor att = matmul(mul(qh, 1.0 / std::sqrt(double(hd))), kh.transpose(-2, -1));
    if (mask.defined()) {
      att = mask.dtype() == kBool ? masked_fill(att, logical_not(mask), -INFINITY) : add(att, mask);
    }
    att = softmax(att, -1);
    if (p > 0) att = accel::dropout(att, p, true, gen_);
    attn = matmul(att, vh);
    weights = average_attn_weights ? mean(att, {1}) : att;
  }
  // (N, H, L, hd) -> (L, N, H, hd) -> (L, N, E)
  Tensor out = out_proj->forward(attn.permute({2, 0, 1, 3}).reshape({L, N, E}));
  if (!batched) {
    out = out.squeeze(1);
    if (weights.defined()) weights = weights.squeeze(0);
  } else if (batch_first) {
    out = out.transpose(0, 1);
  }
  return {out, weights};
}

std::string MultiheadAttention::extra_repr() const {
  std::ostringstream os;
  os << "embed_dim=" << embed_dim << ", num_heads=" << num_heads << ", dropout=" << dropout
     << ", batch_first=" << (batch_first ? "true" : "false");
  if (!qkv_same_embed_dim) os << ", kdim=" << kdim << ", vdim=" << vdim;
  return os.str();
}

}  // namespace accel::nn
