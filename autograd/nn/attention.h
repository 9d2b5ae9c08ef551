// Causal multi-head self-attention (GPT-2 style):
//   x: (B, T, C) -> qkv = x W_qkv^T + b: (B, T, 3C) -> q, k, v: (B, H, T, D), D = C / H
//   att = softmax(mask(q k^T / sqrt(D))): (B, H, T, T), position t attends to positions <= t
//   y = att v: (B, H, T, D) -> (B, T, C) -> output projection: (B, T, C)
#pragma once

#include <memory>
#include <string>

#include "autograd/nn/linear.h"
#include "autograd/nn/module.h"

namespace accel::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t d_model, int64_t n_heads, bool bias = true, double dropout = 0.0,
                      Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  int64_t d_model, n_heads, head_dim;
  std::shared_ptr<Linear> qkv;   // C -> 3C: [q | k | v]
  std::shared_ptr<Linear> proj;  // C -> C
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;

 private:
  // (T, T) bool, true above the diagonal (future positions), rebuilt when T or device change.
  const Tensor& causal_mask(int64_t T, Device device);
  Tensor mask_;
};

}  // namespace accel::nn
