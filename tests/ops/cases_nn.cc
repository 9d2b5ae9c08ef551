// Op cases: softmax family, normalisation, losses, dropout, attention.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

namespace {
// The parameters' dtype for an input x in the mixed-dtype norm cases: float32 for a 16-bit x.
DType param_dtype(const Tensor& x) {
  return x.dtype() == kBFloat16 || x.dtype() == kFloat16 ? kFloat32 : x.dtype();
}
// Runs a mixed-dtype norm case: the CPU must take the mix itself, so a DTypeError (which the
// runner would take for a kernel lacking the 16-bit dtype, Note [16-bit references]) fails it.
template <typename F>
Tensor mixed_required(const char* op, F&& f) {
  try {
    return f();
  } catch (const DTypeError& e) {
    ACCEL_THROW(ValueError, op, "a 16-bit input with float32 parameters must run: ", e.what());
  }
}
}  // namespace

void add_nn_cases(Table& t) {
  OpCase& sm =
      t.add("softmax", "last dim", OP_INPUTS(m.rnd({3, 5})), OP_FN(return softmax(x[0], -1);));
  // Bench rows softmax/ours: (4096, 256) and the gpt attention scores (32*4*128, 128); 2 x 4n
  // bytes.
  for (const Shape& s : {Shape{4096, 256}, Shape{32 * 4 * 128, 128}}) {
    sm.bench(
        "softmax", dims_str(s), [s](Maker& m) { return In{m.rnd(s, -5, 5)}; },
        2.0 * double(s[0] * s[1]) * 4, false, Tol{1e-7, 1e-4});
  }
  t.add("softmax", "middle dim (strided kernel path)", OP_INPUTS(m.rnd({2, 4, 3})),
        OP_FN(return softmax(x[0], 1);));
  t.add("softmax", "non-contiguous input", OP_INPUTS(m.rnd({4, 3})),
        OP_FN(return softmax(x[0].t(), 1);));
  t.add("log_softmax", "last dim", OP_INPUTS(m.rnd({3, 5})), OP_FN(return log_softmax(x[0], 1);));
  t.add("log_softmax", "first dim", OP_INPUTS(m.rnd({4, 3})), OP_FN(return log_softmax(x[0], 0);));
  // A causal-style -inf mask must give exact zeros (softmax) and -inf (log_softmax).
  t.add("softmax", "causal -inf mask, (3, 50, 70)", OP_INPUTS(m.rnd({3, 50, 70}, -6, 6)), OP_FN({
          const Tensor upper = triu(ones({50, 70}, TensorOptions(kBool, x[0].device())), 1);
          return softmax(masked_fill(x[0], upper, -INFINITY), 2);
        }))
      .no_gradcheck();
  t.add("log_softmax", "inner dim, (3, 50, 70)", OP_INPUTS(m.rnd({3, 50, 70}, -6, 6)),
        OP_FN(return log_softmax(x[0], 1);))
      .no_gradcheck();

  t.add("layer_norm", "weight and bias", OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({4}), m.rnd({4})),
        OP_FN(return layer_norm(x[0], {x[0].sizes().back()}, x[1], x[2]);))
      .tol_scale(2)
      .bench("layer_norm", "4096x128",
             OP_INPUTS(m.rnd({4096, 128}, -3, 3), m.rnd({128}), m.rnd({128})), 2.0 * 4096 * 128 * 4,
             false, Tol{1e-5, 1e-4});
  t.add("layer_norm", "two normalized dims, no affine", OP_INPUTS(m.rnd({2, 3, 4})),
        OP_FN(return layer_norm(x[0], {3, 4});))
      .tol_scale(2);
  t.add("layer_norm", "weight only, eps 0.1", OP_INPUTS(m.rnd({5, 3}), m.rnd({3})),
        OP_FN(return layer_norm(x[0], {3}, x[1], Tensor(), 0.1);))
      .tol_scale(2);
  t.add("layer_norm", "(300, 96) affine",
        OP_INPUTS(m.rnd({300, 96}, -3, 5), m.rnd({96}, 0.5, 1.5), m.rnd({96})),
        OP_FN(return layer_norm(x[0], {96}, x[1], x[2]);))
      .no_gradcheck()
      .tol_scale(2)
      .grad_scales({4, 2 * std::sqrt(300.0), 2 * std::sqrt(300.0)});  // dx; dw, db sum 300 rows
  // Note [mixed-dtype norms]: a 16-bit input with float32 parameters (what autocast runs on the
  // CPU, Note [autocast norms]): y and dx in the input's dtype, dweight / dbias in float32.
  const char* mixed_why = "a 16-bit input with float32 parameters is a CPU-only mix";
  t.add("layer_norm", "16-bit input, float32 weight and bias",
        OP_INPUTS(m.rnd({40, 24}, -2, 3), m.rnd({24}, 0.5, 1.5), m.rnd({24})),
        OP_FN(return mixed_required("layer_norm",
                                    [&] {
                                      return layer_norm(x[0], {24}, x[1].to(param_dtype(x[0])),
                                                        x[2].to(param_dtype(x[0])));
                                    });))
      .cpu(mixed_why)
      .tol_scale(2)
      .grad_scales({4, 2 * std::sqrt(40.0), 2 * std::sqrt(40.0)});
  t.add("layer_norm", "16-bit input, float32 bias only", OP_INPUTS(m.rnd({6, 8}), m.rnd({8})),
        OP_FN(return mixed_required("layer_norm",
                                    [&] {
                                      return layer_norm(x[0], {8}, Tensor(),
                                                        x[1].to(param_dtype(x[0])));
                                    });))
      .cpu(mixed_why)
      .tol_scale(2);
  t.add("rms_norm", "16-bit input, float32 weight",
        OP_INPUTS(m.rnd({40, 24}, -2, 3), m.rnd({24}, 0.5, 1.5)),
        OP_FN(return mixed_required(
                         "rms_norm",
                         [&] { return rms_norm(x[0], {24}, x[1].to(param_dtype(x[0]))); });))
      .cpu(mixed_why)
      .tol_scale(2)
      .grad_scales({4, 2 * std::sqrt(40.0)});
  t.add("rms_norm", "weight", OP_INPUTS(m.rnd({3, 5}), m.rnd({5})),
        OP_FN(return rms_norm(x[0], {5}, x[1]);))
      .tol_scale(2);
  t.add("rms_norm", "no weight", OP_INPUTS(m.rnd({2, 2, 3})), OP_FN(return rms_norm(x[0], {2, 3});))
      .tol_scale(2);
  t.add("rms_norm", "(300, 96) weight", OP_INPUTS(m.rnd({300, 96}, -3, 5), m.rnd({96}, 0.5, 1.5)),
        OP_FN(return rms_norm(x[0], {96}, x[1]);))
      .no_gradcheck()
      .tol_scale(2)
      .grad_scales({4, 2 * std::sqrt(300.0), 2 * std::sqrt(300.0)});  // dx; dw, db sum 300 rows

  t.add("cross_entropy", "mean with an ignored row",
        OP_INPUTS(m.rnd({4, 5}), m.idx({1, -100, 4, 0}, {4})),
        OP_FN(return cross_entropy(x[0], x[1]);))
      .bench("cross_entropy", "4096x256",
             OP_INPUTS(m.rnd({4096, 256}, -5, 5), m.rnd_idx(0, 256, {4096})), 4096.0 * 256 * 4,
             false, Tol{1e-6, 1e-5});
  t.add("cross_entropy", "sum, label smoothing 0.2",
        OP_INPUTS(m.rnd({3, 4}), m.idx({3, 0, 3}, {3})),
        OP_FN(return cross_entropy(x[0], x[1], -100, Reduction::Sum, 0.2);));
  t.add("cross_entropy", "none, (N, C, d) input",
        OP_INPUTS(m.rnd({2, 3, 4}), m.idx({0, 1, 2, 1, 2, 2, 0, 0}, {2, 4})),
        OP_FN(return cross_entropy(x[0], x[1], 2, Reduction::None);));
  t.add("cross_entropy", "int32 targets, 1000 classes, smoothing 0.1",
        OP_INPUTS(m.rnd({45, 1000}, -4, 4), m.rnd_idx(0, 1000, {45}, kInt32)),
        OP_FN(return cross_entropy(x[0], x[1], -100, Reduction::Mean, 0.1);))
      .no_gradcheck()
      .tol_scale(4);
  t.add("nll_loss", "mean, ignore_index 1", OP_INPUTS(m.rnd({4, 3}), m.idx({0, 1, 2, 2}, {4})),
        OP_FN(return nll_loss(x[0], x[1], 1);));
  t.add("nll_loss", "none, (N, C, d)", OP_INPUTS(m.rnd({2, 3, 2}), m.idx({0, 2, 1, 1}, {2, 2})),
        OP_FN(return nll_loss(x[0], x[1], -100, Reduction::None);));
  // Class weights (the weight a constant: rnd_const): the mean divides by the targets' weights.
  t.add("nll_loss", "class weights, mean with an ignored row",
        OP_INPUTS(m.rnd({5, 4}), m.idx({3, 0, -100, 3, 1}, {5}), m.rnd_const({4}, 0.5, 2.0)),
        OP_FN(return nll_loss(x[0], x[1], x[2]);));
  t.add("nll_loss", "class weights, none, (N, C, d)",
        OP_INPUTS(m.rnd({2, 3, 2}), m.idx({0, 2, 1, 1}, {2, 2}), m.rnd_const({3}, 0.5, 2.0)),
        OP_FN(return nll_loss(x[0], x[1], x[2], -100, Reduction::None);));
  t.add("mse_loss", "mean, both require grad", OP_INPUTS(m.rnd({3, 4}), m.rnd({3, 4})),
        OP_FN(return mse_loss(x[0], x[1]);));
  t.add("mse_loss", "sum", OP_INPUTS(m.rnd({5}), m.rnd({5})),
        OP_FN(return mse_loss(x[0], x[1], Reduction::Sum);));
  t.add("binary_cross_entropy_with_logits", "mean, target with grad",
        OP_INPUTS(m.rnd({2, 3}), m.rnd_pos({2, 3})),
        OP_FN(return binary_cross_entropy_with_logits(x[0], mul(x[1], 0.5));));
  t.add("binary_cross_entropy_with_logits", "none",
        OP_INPUTS(m.rnd({5}), m.values({0, 1, 1, 0, 0.5}, {5})),
        OP_FN(return binary_cross_entropy_with_logits(x[0], x[1], Reduction::None);));
  // A fresh generator with a fixed seed per call: every evaluation draws the same mask.
  t.add("dropout", "p 0.4", OP_INPUTS(m.rnd({4, 5})), OP_FN({
          Generator g(7);
          return dropout(x[0], 0.4, true, &g);
        }))
      .cpu("the mask comes from each device's own random stream");

  // Fused attention (f64 runs the kernel's loop GEMMs). T = 70 crosses the causal row blocks of 64.
  t.add("scaled_dot_product_attention", "causal, 2 heads",
        OP_INPUTS(m.rnd({1, 2, 5, 3}), m.rnd({1, 2, 5, 3}), m.rnd({1, 2, 5, 3})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], true);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "not causal, S != T, Dv != D, transposed q",
        OP_INPUTS(m.rnd({2, 1, 3, 4}), m.rnd({2, 1, 6, 3}), m.rnd({2, 1, 6, 2})),
        OP_FN(return scaled_dot_product_attention(x[0].transpose(2, 3), x[1], x[2], false);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "causal, T 70 (two row blocks)",
        OP_INPUTS(m.rnd({1, 1, 70, 2}), m.rnd({1, 1, 70, 2}), m.rnd({1, 1, 70, 2})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], true);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention_packed", "causal, 2 heads", OP_INPUTS(m.rnd({2, 4, 12})),
        OP_FN(return scaled_dot_product_attention_packed(x[0], 2, true);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention_packed", "not causal, strided qkv",
        OP_INPUTS(m.rnd({6, 3, 2})),
        OP_FN(return scaled_dot_product_attention_packed(x[0].permute({2, 1, 0}), 1, false);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "head views of a packed (2, 37, 3, 3, 16) buffer",
        OP_INPUTS(m.rnd({2, 37, 3, 3, 16})), OP_FN({
          auto heads = [&](int64_t i) { return x[0].select(2, i).permute({0, 2, 1, 3}); };
          return scaled_dot_product_attention(heads(0), heads(1), heads(2), true);
        }))
      .no_gradcheck()
      .tol_scale(4)
      .grad_scale(8);
  // torch's full signature (attn_mask, dropout_p, is_causal, scale). Masks are inputs: bool ones
  // stay bool, a float mask made with rnd_const takes the fused path, one made with rnd requires
  // grad and takes the composed path. S = 300 leaves the kept-probabilities range (the backward
  // recomputes P from lse); S = 520 spans two key blocks of the online softmax.
  t.add("scaled_dot_product_attention", "bool mask (T, S) broadcast, cross-attention S != T",
        OP_INPUTS(m.rnd({2, 2, 3, 4}), m.rnd({2, 2, 4, 4}), m.rnd({2, 2, 4, 3}),
                  m.mask({1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1}, {3, 4})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], x[3]);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "bool key padding (B, 1, 1, S), scale 0.7",
        OP_INPUTS(m.rnd({2, 2, 3, 4}), m.rnd({2, 2, 5, 4}), m.rnd({2, 2, 5, 4}),
                  m.mask({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 1, 1, 5})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.0, false, 0.7);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "float mask (B, 1, T, S), no grad for it",
        OP_INPUTS(m.rnd({2, 2, 3, 4}), m.rnd({2, 2, 6, 4}), m.rnd({2, 2, 6, 2}),
                  m.rnd_const({2, 1, 3, 6}, -2.0, 1.0)),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], x[3]);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "float mask (T, S) with its gradient (composed)",
        OP_INPUTS(m.rnd({1, 2, 3, 4}), m.rnd({1, 2, 5, 4}), m.rnd({1, 2, 5, 4}),
                  m.rnd({3, 5}, -2.0, 1.0)),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], x[3]);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "causal, T 5 > S 3 (top-left), scale 0.4, (N, T, D)",
        OP_INPUTS(m.rnd({2, 5, 3}), m.rnd({2, 3, 3}), m.rnd({2, 3, 2})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.0, true, 0.4);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "float mask, S 300 (P recomputed from lse)",
        OP_INPUTS(m.rnd({1, 1, 2, 2}), m.rnd({1, 1, 300, 2}), m.rnd({1, 1, 300, 2}),
                  m.rnd_const({300}, -1.0, 1.0)),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], x[3]);))
      .tol_scale(4)
      .grad_scale(8);
  t.add("scaled_dot_product_attention", "causal, T = S = 520 (two key blocks)",
        OP_INPUTS(m.rnd({1, 1, 520, 2}), m.rnd({1, 1, 520, 2}), m.rnd({1, 1, 520, 2})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], true);))
      .no_gradcheck()
      .tol_scale(4)
      .grad_scale(8)
      // bench/kernels row sdpa/ours/B1_H8_T1024_D64_causal: forward FLOPs 4 B H T S D / 2.
      .bench("sdpa", "B1_H8_T1024_D64_causal",
             OP_INPUTS(m.rnd({1, 8, 1024, 64}), m.rnd({1, 8, 1024, 64}), m.rnd({1, 8, 1024, 64})),
             2.0 * 8 * 1024 * 1024 * 64, true, Tol{1e-4, 1e-4});
  t.add("scaled_dot_product_attention", "not causal, S 520 (two key blocks), gradcheck",
        OP_INPUTS(m.rnd({1, 1, 2, 2}), m.rnd({1, 1, 520, 2}), m.rnd({1, 1, 520, 1})),
        OP_FN(return scaled_dot_product_attention(x[0], x[1], x[2], false);))
      .tol_scale(4)
      .grad_scale(8)
      .bench("sdpa", "B1_H8_T1024_D64",
             OP_INPUTS(m.rnd({1, 8, 1024, 64}), m.rnd({1, 8, 1024, 64}), m.rnd({1, 8, 1024, 64})),
             4.0 * 8 * 1024 * 1024 * 64, true, Tol{1e-4, 1e-4});
  // A fresh generator with a fixed seed per call: every evaluation drops the same weights.
  t.add("scaled_dot_product_attention", "dropout 0.3 with a generator (composed)",
        OP_INPUTS(m.rnd({1, 2, 3, 4}), m.rnd({1, 2, 4, 4}), m.rnd({1, 2, 4, 4})), OP_FN({
          Generator g(3);
          return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.3, false, std::nullopt,
                                              &g);
        }))
      .cpu("the dropout mask comes from each device's own random stream");
  // cross_entropy with class weights or probability targets (composed: Note [cross_entropy
  // with weights or probabilities] in autograd/ops/nn.cc).
  t.add("cross_entropy", "probability targets, weights, label smoothing",
        OP_INPUTS(m.rnd({3, 5}), m.rnd({3, 5}, 0.0, 1.0), m.rnd({5}, 0.5, 1.5)),
        OP_FN(return cross_entropy(x[0], x[1], x[2], -100, Reduction::Mean, 0.1);));
  t.add("cross_entropy", "probability targets (N, C, d), no reduction",
        OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({2, 3, 4}, 0.0, 1.0)),
        OP_FN(return cross_entropy(x[0], x[1], -100, Reduction::None);));
  t.add("cross_entropy", "class weights, ignore_index, label smoothing",
        OP_INPUTS(m.rnd({4, 3}), m.rnd({3}, 0.5, 1.5), m.idx({0, 2, -100, 1}, {4})),
        OP_FN(return cross_entropy(x[0], x[2], x[1], -100, Reduction::Mean, 0.2);));
  t.add("cross_entropy", "class weights (N, C, d), sum",
        OP_INPUTS(m.rnd({2, 3, 2}), m.rnd({3}, 0.5, 1.5), m.idx({0, 2, 1, 1}, {2, 2}, kInt32)),
        OP_FN(return cross_entropy(x[0], x[2], x[1], 5, Reduction::Sum);));
}

}  // namespace accel::optable::detail
