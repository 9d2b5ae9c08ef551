// The differentiable op API. Every function here checks its inputs (throwing an accel::Error
// subclass that names the op and prints shapes), dispatches to the device kernel, and records
// its backward when grad mode is on and an input requires grad.
#pragma once

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "core/tensor_index.h"

namespace accel {

// ---- elementwise binary (broadcasting, dtype promotion) ----
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha);
// alpha = 1 without a Scalar argument (what `a + b` and `a - b` call: one stall less per op).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor rsub(const Tensor& a, Scalar b);  // b - a
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor rdiv(const Tensor& a, Scalar b);  // b / a
Tensor pow(const Tensor& a, Scalar exponent);

// ---- comparisons and logic (bool result, not differentiable) ----
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
// True when every element is equal (same shape required) / close within tolerances.
bool equal(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// ---- elementwise unary ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate: "none" (erf) or "tanh".
Tensor gelu(const Tensor& x, const char* approximate = "none");
Tensor silu(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor square(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

// ---- reductions (dims empty = all dims) ----
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Values only; use max_with_indices for both.
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);  // over everything, 0-dim
Tensor min(const Tensor& x);
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // flattened index
// correction 1 = unbiased (PyTorch default).
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std_dev(const Tensor& x, const Shape& dims = {}, int64_t correction = 1,
               bool keepdim = false);
Tensor prod(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor norm(const Tensor& x, double p = 2.0);  // over all elements
// Sum a broadcast gradient back down to `shape` (backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// 1-D/2-D/batched with broadcasting of batch dims, like torch.matmul.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// x: (..., in) w: (out, in) b: (out) -> (..., out)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ---- convolution and pooling (NCHW) ----
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), Shape stride = {1, 1},
              Shape padding = {0, 0}, Shape dilation = {1, 1}, int64_t groups = 1);
// torch.nn.functional.max_pool2d's arguments in its order; stride {} is the kernel. ceil_mode: the
// output size rounds up, ceil((H + 2 padding - kernel) / stride) + 1, less one when the last
// window would start past the input and left padding (torch's rule). dilation must be 1
// (ValueError otherwise: dilated max pooling is not offered).
Tensor max_pool2d(const Tensor& x, Shape kernel, Shape stride = {}, Shape padding = {0, 0},
                  Shape dilation = {1, 1}, bool ceil_mode = false);
// torch.nn.functional.conv_transpose2d (same argument order: groups before dilation).
// x: (N, C_in, H, W) or (C_in, H, W), w: (C_in, C_out / groups, kh, kw), b: (C_out) ->
// (N, C_out, Ho, Wo), Ho = (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1;
// output_padding must be smaller than stride or dilation.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(),
                        Shape stride = {1, 1}, Shape padding = {0, 0},
                        Shape output_padding = {0, 0}, int64_t groups = 1, Shape dilation = {1, 1});
// The 1-D forms (torch.nn.functional.conv1d / conv_transpose1d) run the 2-D ops on
// (N, C, 1, L). x: (N, C_in, L) or (C_in, L); conv1d w: (C_out, C_in / groups, k);
// conv_transpose1d w: (C_in, C_out / groups, k).
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
Tensor conv_transpose1d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(),
                        int64_t stride = 1, int64_t padding = 0, int64_t output_padding = 0,
                        int64_t groups = 1, int64_t dilation = 1);
Tensor avg_pool2d(const Tensor& x, Shape kernel, Shape stride = {}, Shape padding = {0, 0},
                  bool count_include_pad = true);

// ---- normalisation, softmax, losses ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Normalises over the trailing dims of normalized_shape. weight/bias optional.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                double eps = 1e-6);
// BatchMean (the sum divided by the batch size, dim 0) is kl_div's only; other losses refuse it.
enum class Reduction : uint8_t { None, Mean, Sum, BatchMean };
// logits: (N, C) or (N, C, d...) ; target: int64 class indices (N) or (N, d...).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::Mean, double label_smoothing = 0.0);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::Mean);
// With class weights (C), or undefined for none (torch.nn.functional.nll_loss's weight): row r of
// class t loses -weight[t] log_probs[r, t]; the mean divides by the sum of weight[t] over the
// rows not ignored. The weight takes no gradient (ValueError when it requires one, as torch).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                int64_t ignore_index = -100, Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// ---- scaled dot-product attention (autograd/ops/attention.cc; kernels/cpu/nn_attention.cc) ----
// torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None,
// dropout_p=0.0, is_causal=False, scale=None):
//   softmax(q k^T * scale + mask) v, scale = 1 / sqrt(D) by default
// q: (..., T, D), k: (..., S, D), v: (..., S, Dv) with the same batch dims (usually (B, H)) ->
// (..., T, Dv). attn_mask broadcasts to (..., T, S): bool (true = takes part, as torch) or
// floating (added to the scores). is_causal masks j > i (top-left aligned, torch's
// tril(ones(T, S))); giving both is a ValueError, as in torch. dropout_p > 0 drops attention
// weights with `gen` (the default generator when null) and always applies (pass 0 in eval, as
// torch's modules do). Rows with every key masked give NaN, as in torch.
// The fused CPU kernel (f32/f64, and bf16 with float32 softmax and statistics: Note [bf16 fused
// attention]) keeps O(T) per row block, never the (T, S) matrix (Note [fused attention]);
// dropout, a float mask that requires grad, f16 outside autocast and bf16 off the CPU run the
// composed ops (materialised). Under bf16 autocast on the CPU attention is matmul-class (bf16
// out); under f16 autocast it runs the float32 kernel (Note [autocast attention]).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);
// The same without mask or dropout; causal needs no mask (kept for the callers before the above).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);
// The same on a packed projection: qkv: (B, T, 3C) = [q | k | v], each split into n_heads heads
// of C / n_heads -> (B, T, C) with the heads merged. Reads and writes (gradient included) the
// packed layout directly, so head split and merge cost no copies.
Tensor scaled_dot_product_attention_packed(const Tensor& qkv, int64_t n_heads, bool causal);
// ---- end scaled dot-product attention ----

// ---- indexing ----
// weight: (V, D), indices: int (any shape) -> (..., D). Out-of-range index: IndexError.
// padding_idx (torch's; negative counts from the end): that row's gradient is zero.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
// torch.nn.functional.embedding's max_norm: the rows indices reach whose norm_type-norm exceeds
// max_norm are first rescaled in place to max_norm (embedding_renorm_), then looked up.
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx,
                 std::optional<double> max_norm, double norm_type = 2.0);
// torch.embedding_renorm_: rows of weight reached by indices with a norm above max_norm scaled
// to max_norm / (norm + 1e-7), in place and without history; returns weight.
Tensor embedding_renorm_(const Tensor& weight, const Tensor& indices, double max_norm,
                         double norm_type = 2.0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x with src added at index along dim (out-of-place, like torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

// ---- joining and splitting ----
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---- advanced indexing (autograd/ops/indexing.cc; rules in docs/indexing.md) ----
// x[indices] with the index list of core/tensor_index.h: a view when every entry is basic (ints,
// slices, None, ellipsis, bools), else a new tensor gathered by the tensor indices (int64/int32
// broadcast together; bool/uint8 masks as their nonzero()). Out-of-range: IndexError naming the
// op, dim, index and size.
Tensor index(const Tensor& x, const std::vector<indexing::TensorIndex>& indices);
// x with x[indices] = values (values broadcast to x[indices]'s shape); accumulate: +=, with
// duplicate indices summed. Without accumulate, a position indexed twice gets one of its values
// (the last in index order on the CPU; unspecified on CUDA), as in torch.
Tensor index_put(const Tensor& x, const std::vector<indexing::TensorIndex>& indices,
                 const Tensor& values, bool accumulate = false);
// The elements of x where mask (broadcast together with x) is true, in row-major order: 1-D.
Tensor masked_select(const Tensor& x, const Tensor& mask);
// x with the positions where mask is true filled, in row-major order, by source's first elements
// (source.numel() >= the count of true; mask broadcasts to x).
Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& source);
// gather along dim after broadcasting x and indices in every other dim; no dim: flattened.
Tensor take_along_dim(const Tensor& x, const Tensor& indices,
                      std::optional<int64_t> dim = std::nullopt);
// Coordinates of the nonzero elements, row-major: (count, x.dim()) int64.
Tensor nonzero(const Tensor& x);
// The same as one 1-D int64 tensor per dim (torch.nonzero(x, as_tuple=True); libtorch's name).
std::vector<Tensor> nonzero_numpy(const Tensor& x);

// ---- sorting and sampling (autograd/ops/sort.cc) ----
// (values, int64 indices) along dim. NaN sorts as the largest value. stable keeps equal elements
// in input order; the kernels are stable either way.
std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                                bool stable = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = false);
// The k largest (smallest) along dim: (values, int64 indices). Ties go to the lower index.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true);
// probs: (n) or (rows, n) non-negative weights (not necessarily normalised) -> (num_samples) or
// (rows, num_samples) int64 category indices.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false,
                   Generator* gen = nullptr);

// ---- more shape ops, norms, where with scalars, losses ----
// torch.Tensor.repeat: x tiled repeats[i] times along dim i (leading repeats add dims).
Tensor repeat(const Tensor& x, const Shape& repeats);
// Vector norm over dims (empty: all): p = 2, 1, INFINITY, -INFINITY, 0 (count of nonzeros), any
// other real; "fro" is p = 2. Gradients as torch's, 0 at a zero norm.
Tensor norm(const Tensor& x, double p, const Shape& dims, bool keepdim = false);
Tensor norm(const Tensor& x, std::string_view p, const Shape& dims = {}, bool keepdim = false);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
Tensor where(const Tensor& cond, Scalar a, Scalar b);
// With class weights (C), or undefined for none. target: class indices as above, or class
// probabilities of logits' shape (floating; ignore_index must stay -100), as torch.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     int64_t ignore_index = -100, Reduction reduction = Reduction::Mean,
                     double label_smoothing = 0.0);

// ---- more losses (autograd/ops/losses.cc; composed from the ops above, torch.nn.functional's
// definitions, arguments and defaults; input and target of the same shape, no broadcasting) ----
// input: probabilities in [0, 1] (else ValueError); weight broadcasts to input's shape.
// -w (t log x + (1 - t) log(1 - x)), each log clamped at -100 as torch.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const Tensor& weight = Tensor(), Reduction reduction = Reduction::Mean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta (beta = 0: l1_loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      Reduction reduction = Reduction::Mean, double beta = 1.0);
// |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta); delta > 0.
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);
// input: log-probabilities; target: probabilities (log-probabilities when log_target).
// t (log t - x) (0 where t = 0), or exp(t) (t - x). BatchMean divides the sum by input.size(0).
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
              bool log_target = false);
// x1, x2 broadcast together; dim of the broadcast shape is reduced:
// sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps), dim).
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim = 1, double eps = 1e-8);
// x1, x2: (N, D) with target (N), or (D) with target (); target entries 1 or -1:
// 1 - cos for 1, max(0, cos - margin) for -1 (anything else: 0), cos over D.
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             double margin = 0.0, Reduction reduction = Reduction::Mean);

// ---- image ops: group / instance norm, adaptive pools, pixel shuffle, pad, interpolate ----
// (autograd/ops/nn.cc, pool.cc, resample.cc)
// torch.nn.functional's definitions, arguments and defaults. x: (N, C, H, W) or (C, H, W) unless
// said otherwise.
// Output (oh, ow); window i of a dim of size n spans [floor(i n / o), ceil((i + 1) n / o)).
Tensor adaptive_avg_pool2d(const Tensor& x, Shape output_size);
Tensor adaptive_max_pool2d(const Tensor& x, Shape output_size);
// (values, int64 indices): the flat index h * W + w of each maximum in its input plane.
std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& x, Shape output_size);
// x: (N, C, *) normalised over each of num_groups groups of C / num_groups channels (and all of
// *); weight, bias: (C) or undefined. Fused kernel (kernels/<backend>/nn_group_norm.*).
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// x: (N, C, *). With use_input_stats, each (n, c) plane is normalised by its own statistics
// (group_norm with C groups) and running_mean / running_var (C), when defined, are updated in place
// with momentum (the unbiased variance, averaged over N); without, the running statistics
// normalise.
Tensor instance_norm(const Tensor& x, const Tensor& running_mean = Tensor(),
                     const Tensor& running_var = Tensor(), const Tensor& weight = Tensor(),
                     const Tensor& bias = Tensor(), bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5);
// Channel dropout (torch.nn.functional.dropout1d / 2d / 3d; autograd/ops/activation.cc, Note
// [channel dropout]): zeroes whole channels, one draw per (n, c) (per c unbatched), the rest
// scaled by 1 / (1 - p). dropout1d: (N, C, L) or (C, L); dropout3d: (N, C, D, H, W) or
// (C, D, H, W); dropout2d: (N, C, H, W), and a 3-D input is (N, C, L) as torch reads it (with a
// warning once), not an unbatched (C, H, W). The `_` forms write x in place.
Tensor dropout1d(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor dropout2d(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor dropout3d(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor& dropout1d_(Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor& dropout2d_(Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor& dropout3d_(Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
// (*, C r^2, H, W) -> (*, C, H r, W r) and back.
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);
// pads: (left, right) pairs from the last dim backwards, as torch. mode: "constant" (any number
// of dims, negative pads crop), "reflect", "replicate", "circular" (the last 1, 2 or 3 dims).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode = "constant",
           double value = 0.0);
// x: (N, C, L) for "nearest" / "linear", (N, C, H, W) for "nearest" / "bilinear". Give size or
// scale_factor (one entry, or one per spatial dim). align_corners: linear modes only (default
// false). recompute_scale_factor: false (torch's default) uses 1 / scale_factor as the source step,
// true uses in / out.
Tensor interpolate(const Tensor& x, Shape size = {}, std::vector<double> scale_factor = {},
                   std::string_view mode = "nearest",
                   std::optional<bool> align_corners = std::nullopt,
                   bool recompute_scale_factor = false);
// x > 0 ? x : negative_slope x; x > 0 ? x : alpha (exp(x) - 1).
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
// ---- end image ops ----

// ---- more activations and the in-place forms (autograd/ops/activation.cc) ----
// torch.nn.functional's definitions and defaults. hardtanh: clamp to [min_val, max_val] with a
// gradient on the open interval only; relu6 = hardtanh(0, 6); selu = 1.0507 elu(x, 1.6733);
// celu: x > 0 ? x : alpha (exp(x / alpha) - 1); threshold: x > threshold ? x : value.
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor relu6(const Tensor& x);
Tensor selu(const Tensor& x);
Tensor celu(const Tensor& x, double alpha = 1.0);
Tensor threshold(const Tensor& x, double threshold, double value);
// hardsigmoid(x) = relu6(x + 3) / 6, gradient 1/6 strictly inside (-3, 3);
// hardswish(x) = x relu6(x + 3) / 6, gradient 0 below -3, x / 3 + 1/2 on [-3, 3), 1 from 3 on
// (torch's vectorised hardswish_backward).
Tensor hardsigmoid(const Tensor& x);
Tensor hardswish(const Tensor& x);
// In place (torch's F.relu_, F.leaky_relu_, ..., and what inplace=True modules run; Note
// [in-place activations]): x is overwritten and returned; an in-place op's rules apply (a leaf
// that requires grad is refused, a tensor saved for backward raises at backward).
Tensor& relu_(Tensor& x);
Tensor& leaky_relu_(Tensor& x, double negative_slope = 0.01);
Tensor& elu_(Tensor& x, double alpha = 1.0);
Tensor& hardtanh_(Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor& relu6_(Tensor& x);
Tensor& selu_(Tensor& x);
Tensor& celu_(Tensor& x, double alpha = 1.0);
Tensor& threshold_(Tensor& x, double threshold, double value);
Tensor& silu_(Tensor& x);
Tensor& hardsigmoid_(Tensor& x);
Tensor& hardswish_(Tensor& x);
// dropout's in-place form: the same draws and result as dropout(x, p, training, gen).
Tensor& dropout_(Tensor& x, double p, bool training = true, Generator* gen = nullptr);

// ---- operators ----
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
inline Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(Scalar a, const Tensor& b) { return rdiv(b, a); }
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
inline Tensor operator<(const Tensor& a, Scalar b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, Scalar b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, Scalar b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, Scalar b) { return ge(a, b); }
inline Tensor operator==(const Tensor& a, Scalar b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, Scalar b) { return ne(a, b); }

}  // namespace accel
