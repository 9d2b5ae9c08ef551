// Gradcheck samples: softmax family, normalisation, losses, dropout.
#include "samples.h"

using namespace accel;
using accel::testing::rnd;
using accel::testing::rnd_pos;

namespace {
Tensor targets(std::vector<int64_t> v, const Shape& shape) { return tensor(v, shape); }
}  // namespace

GRAD_SAMPLE("softmax", "last dim", (rnd({3, 5})), { return softmax(x[0], -1); });
GRAD_SAMPLE("softmax", "middle dim (strided kernel path)", (rnd({2, 4, 3})),
            { return softmax(x[0], 1); });
GRAD_SAMPLE("softmax", "non-contiguous input", (rnd({4, 3})), { return softmax(x[0].t(), 1); });
GRAD_SAMPLE("log_softmax", "last dim", (rnd({3, 5})), { return log_softmax(x[0], 1); });
GRAD_SAMPLE("log_softmax", "first dim", (rnd({4, 3})), { return log_softmax(x[0], 0); });

GRAD_SAMPLE("layer_norm", "weight and bias", (rnd({2, 3, 4}), rnd({4}), rnd({4})),
            { return layer_norm(x[0], {4}, x[1], x[2]); });
GRAD_SAMPLE("layer_norm", "two normalized dims, no affine", (rnd({2, 3, 4})),
            { return layer_norm(x[0], {3, 4}); });
GRAD_SAMPLE("layer_norm", "weight only, eps 0.1", (rnd({5, 3}), rnd({3})),
            { return layer_norm(x[0], {3}, x[1], Tensor(), 0.1); });
GRAD_SAMPLE("rms_norm", "weight", (rnd({3, 5}), rnd({5})), { return rms_norm(x[0], {5}, x[1]); });
GRAD_SAMPLE("rms_norm", "no weight", (rnd({2, 2, 3})), { return rms_norm(x[0], {2, 3}); });

GRAD_SAMPLE("cross_entropy", "mean with an ignored row", (rnd({4, 5}), targets({1, -100, 4, 0}, {4})),
            { return cross_entropy(x[0], x[1]); });
GRAD_SAMPLE("cross_entropy", "sum, label smoothing 0.2", (rnd({3, 4}), targets({3, 0, 3}, {3})),
            { return cross_entropy(x[0], x[1], -100, Reduction::Sum, 0.2); });
GRAD_SAMPLE("cross_entropy", "none, (N, C, d) input", (rnd({2, 3, 4}), targets({0, 1, 2, 1, 2, 2, 0, 0}, {2, 4})),
            { return cross_entropy(x[0], x[1], 2, Reduction::None); });
GRAD_SAMPLE("nll_loss", "mean, ignore_index 1", (rnd({4, 3}), targets({0, 1, 2, 2}, {4})),
            { return nll_loss(x[0], x[1], 1); });
GRAD_SAMPLE("nll_loss", "none, (N, C, d)", (rnd({2, 3, 2}), targets({0, 2, 1, 1}, {2, 2})),
            { return nll_loss(x[0], x[1], -100, Reduction::None); });
GRAD_SAMPLE("mse_loss", "mean, both require grad", (rnd({3, 4}), rnd({3, 4})),
            { return mse_loss(x[0], x[1]); });
GRAD_SAMPLE("mse_loss", "sum", (rnd({5}), rnd({5})), { return mse_loss(x[0], x[1], Reduction::Sum); });
GRAD_SAMPLE("binary_cross_entropy_with_logits", "mean, target with grad", (rnd({2, 3}), rnd_pos({2, 3})),
            { return binary_cross_entropy_with_logits(x[0], mul(x[1], 0.5)); });
GRAD_SAMPLE("binary_cross_entropy_with_logits", "none", (rnd({5})), {
  return binary_cross_entropy_with_logits(x[0], tensor(std::vector<double>{0, 1, 1, 0, 0.5}, {5}),
                                          Reduction::None);
});
// A fresh generator with a fixed seed per call: every evaluation draws the same mask.
GRAD_SAMPLE("dropout", "p 0.4", (rnd({4, 5})), {
  Generator g(7);
  return dropout(x[0], 0.4, true, &g);
});

// Fused attention (f64 runs the kernel's loop GEMMs). T = 70 crosses the causal row blocks of 64.
GRAD_SAMPLE("scaled_dot_product_attention", "causal, 2 heads", (rnd({1, 2, 5, 3}), rnd({1, 2, 5, 3}), rnd({1, 2, 5, 3})),
            { return scaled_dot_product_attention(x[0], x[1], x[2], true); });
GRAD_SAMPLE("scaled_dot_product_attention", "not causal, S != T, Dv != D, transposed q",
            (rnd({2, 1, 3, 4}), rnd({2, 1, 6, 3}), rnd({2, 1, 6, 2})),
            { return scaled_dot_product_attention(x[0].transpose(2, 3), x[1], x[2], false); });
GRAD_SAMPLE("scaled_dot_product_attention", "causal, T 70 (two row blocks)",
            (rnd({1, 1, 70, 2}), rnd({1, 1, 70, 2}), rnd({1, 1, 70, 2})),
            { return scaled_dot_product_attention(x[0], x[1], x[2], true); });
GRAD_SAMPLE("scaled_dot_product_attention_packed", "causal, 2 heads", (rnd({2, 4, 12})),
            { return scaled_dot_product_attention_packed(x[0], 2, true); });
GRAD_SAMPLE("scaled_dot_product_attention_packed", "not causal, strided qkv", (rnd({6, 3, 2})),
            { return scaled_dot_product_attention_packed(x[0].permute({2, 1, 0}), 1, false); });
