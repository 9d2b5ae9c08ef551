#include "autograd/nn/attention.h"

#include <cmath>
#include <sstream>

#include "autograd/ops.h"

namespace accel::nn {

CausalSelfAttention::CausalSelfAttention(int64_t c, int64_t h, bool bias, double p, Generator* gen)
    : d_model(c), n_heads(h), head_dim(h > 0 ? c / h : 0) {
  ACCEL_CHECK(c > 0 && h > 0 && c % h == 0, ValueError, "CausalSelfAttention", "d_model (", c,
              ") must be a positive multiple of n_heads (", h, ")");
  qkv = register_module("qkv", std::make_shared<Linear>(c, 3 * c, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(c, c, bias, gen));
  attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(p, gen));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(p, gen));
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
  ACCEL_CHECK(x.defined(), ValueError, "CausalSelfAttention", "input is undefined");
  ACCEL_CHECK(x.dim() == 3 && x.size(2) == d_model, ShapeError, "CausalSelfAttention",
              "expected input (B, T, ", d_model, "), got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = d_model, H = n_heads, D = head_dim;
  const Tensor qkv_out = qkv->forward(x);  // (B, T, 3C)
  if (attn_dropout->p == 0.0 || !attn_dropout->is_training()) {
    // One fused op reads q, k, v in place from the packed projection and writes the merged heads
    // (Note [fused attention] in kernels/cpu/nn_attention.cc); same math as the composed path
    // below.
    const Tensor y = scaled_dot_product_attention_packed(qkv_out, H, /*causal=*/true);
    return resid_dropout->forward(proj->forward(y));
  }
  // Dropout on the attention weights needs them materialised: the composed path.
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
  att = attn_dropout->forward(softmax(att, -1));
  const Tensor y = matmul(att, v).transpose(1, 2).reshape({B, T, C});  // (B, T, C)
  return resid_dropout->forward(proj->forward(y));
}

std::string CausalSelfAttention::extra_repr() const {
  std::ostringstream os;
  os << "d_model=" << d_model << ", n_heads=" << n_heads;
  return os.str();
}

}  // namespace accel::nn
