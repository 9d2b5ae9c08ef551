// Tensor parallel and sequence parallel (Megatron-LM's layout) over a plain process group
// (docs/parallelism.md "Tensor parallel").
//
//   auto model = std::make_shared<models::Gpt>(cfg, &gen);     // same seed on every rank
//   auto tp = mesh.group("tp");                                // or dist::new_group({...})
//   dist::parallelize(model, tp, models::gpt_tp_plan({.sequence_parallel = true}));
//   optim::AdamW opt(model->parameters());                     // this rank's shards
//   Tensor loss = models::lm_loss((*model)(idx), targets);     // same loss on every tp rank
//   loss.backward();
//   dist::tp_clip_grad_norm_(*model, 1.0);
//   opt.step();
//   io::TensorDict full = dist::tp_full_parameters(*model);   // export: full shapes
//
// After parallelize() a module's parameters are ordinary local tensors (this rank's shards, or the
// replicated full tensor), so an optimizer, DDP or FSDP over a data-parallel group wraps the
// module unchanged. The styles run as call wrappers (Note [module calls] in nn/module.h)
// on the planned modules: their parents must call them through operator() (`(*fc)(x)`), as
// examples/models.h and nn::CausalSelfAttention do, not through forward(). Dropout anywhere in a
// parallelized model draws this rank's slice of the one-process mask (the same mask where the
// activation is replicated over tp); seed every tp rank alike (Note [dropout under tensor
// parallelism] in parallel/tp_random.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "comm/process_group.h"
#include "core/tensor.h"

namespace accel::dist {

// ---------------- differentiable collectives (Note [tp regions] in tp_collectives.cc) ----------
// Each is collective over `group` (every rank calls it with the same shapes, in the same order)
// and records its backward, which is itself collective. With a group of one rank (or none) each
// returns its input. `dim` may be negative. Slices are torch.chunk's (Note [uneven tp shards]):
// rank r of p holds [r * c, min(n, (r + 1) * c)) of n, c = ceil(n / p), possibly nothing; with
// `unit` > 1, of n / unit whole units. The gathers take the full size n (-1: p x this rank's,
// the even case) and pad every piece to c for the collective. The sequence ops need the size
// along d divisible by the group size (ShapeError naming the op, the shape and the group size:
// sequence parallelism with a sequence length tp does not divide is refused).
//
//   op                                  forward                      backward
//   copy_to_tp_region(x)                identity                     all-reduce (sum)
//   reduce_from_tp_region(x)            all-reduce (sum)             identity
//   gather_from_tp_region(x, dim, n)    all-gather along dim         this rank's slice
//   scatter_to_tp_region(x, dim)        this rank's slice            all-gather along dim
//   gather_from_sequence_region(x, d)   all-gather along d           reduce-scatter along d (sum)
//   reduce_scatter_to_sequence_region   reduce-scatter along d (sum) all-gather along d
Tensor copy_to_tp_region(const Tensor& x, const ProcessGroupPtr& group);
Tensor reduce_from_tp_region(const Tensor& x, const ProcessGroupPtr& group);
Tensor gather_from_tp_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group,
                             int64_t full_size = -1, int64_t unit = 1);
Tensor scatter_to_tp_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group,
                            int64_t unit = 1);
Tensor gather_from_sequence_region(const Tensor& x, int64_t dim, const ProcessGroupPtr& group);
Tensor reduce_scatter_to_sequence_region(const Tensor& x, int64_t dim,
                                         const ProcessGroupPtr& group);

// The mean cross-entropy of the full logits (N, V) against targets (N) (int64 in [0, V), or
// ignore_index: left out of the mean), from this rank's vocabulary slice local_logits (N, Vr):
// the columns after those of the lower ranks (torch.chunk's slices, or any split: the ranks'
// widths are all-gathered). The full logits are never built: the row maximum, the sum of
// exponentials and the target's logit are all-reduced (three all-reduces of N values). Equal to
// cross_entropy(full_logits, targets, ignore_index) on every rank; its backward gives each rank the
// gradient of its slice (no communication).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    const ProcessGroupPtr& group, int64_t ignore_index = -100);

// ---------------- styles and plans ----------------

struct ColwiseOptions {
  bool gather_output = false;  // all-gather the output's last dim (else it stays sharded)
  // The weight's rows are `chunks` equal blocks, each sharded on its own: a packed [q | k | v]
  // projection (3) gives every rank its heads' rows of q, k and v.
  int64_t chunks = 1;
  bool sequence_parallel = false;  // input sharded along sequence_dim: all-gathered first
  int64_t sequence_dim = 1;        // (B, T, C): 1
  // Note [uneven tp shards]: pieces are torch.chunk's, so out_features need not divide by tp.
  // unit > 1 cuts each block in whole units of that many features (an attention projection's
  // heads: head_dim; nn::CausalSelfAttention's qkv gets its head_dim without asking);
  // require_even refuses a size tp does not divide (ShapeError at parallelize), for layers whose
  // forward needs equal pieces (hf's attention, which reads its heads from the shard).
  int64_t unit = 1;
  bool require_even = false;
};
struct RowwiseOptions {
  // Output reduce-scattered along sequence_dim (else all-reduced); the bias is then replicated in
  // a sequence region and its gradient is all-reduced over the group.
  bool sequence_parallel = false;
  int64_t sequence_dim = 1;
  // As ColwiseOptions' (the input features: an attention output projection's heads).
  int64_t unit = 1;
  bool require_even = false;
};

struct TpStyle {
  enum class Kind : uint8_t { Colwise, Rowwise, VocabEmbedding, Sequence, Replicate };
  Kind kind = Kind::Replicate;
  ColwiseOptions colwise;        // Colwise
  RowwiseOptions rowwise;        // Rowwise, VocabEmbedding (how the output is reduced)
  int64_t shard_input_dim = -1;  // Sequence: >= 0 slices the (full) input along it first
  std::string name() const;      // "colwise", "rowwise", ...
};

// Note [transposed linear layers]
// colwise and rowwise shard an nn::Linear, whose weight is (out_features, in_features) and whose
// forward is linear(x, weight, bias), or a layer that stores its weight the other way round,
// (in_features, out_features), and computes x @ weight + bias: Hugging Face's Conv1D (GPT-2's
// c_attn, c_proj, c_fc; hf/gpt2.h), whose state dicts must keep transformers' layout. Such a
// layer derives from TransposedLinear; its forward must take its sizes from the weight's shape
// (parallelize shards the parameters in place and changes no field of it). Colwise then shards
// the weight's columns (dim 1) and the bias, rowwise its rows (dim 0), and checkpoints record
// those dims (tp_shards), so a file of full tensors loads at any tp size.
class TransposedLinear {
 public:
  virtual ~TransposedLinear() = default;
  virtual Tensor transposed_weight() const = 0;  // (in_features, out_features)
  virtual Tensor transposed_bias() const = 0;    // (out_features), undefined when there is none
};

// nn::Linear: weight rows and bias sharded; input replicated (or all-gathered along the sequence);
// output sharded on the last dim, or gathered.
TpStyle colwise(ColwiseOptions options = {});
// nn::Linear: weight columns sharded, bias replicated; input sharded on the last dim (a colwise
// output); output all-reduced (or reduce-scattered along the sequence), then the bias added once.
// Both also take a TransposedLinear (Note [transposed linear layers]), sharded along its dims.
TpStyle rowwise(RowwiseOptions options = {});
// nn::Embedding: rows (the vocabulary) sharded; indices outside this rank's rows give zeros;
// output all-reduced (or reduce-scattered along the sequence).
TpStyle vocab_embedding(RowwiseOptions options = {});
// A sequence-parallel region (LayerNorm, dropout, residual): the module runs on its sequence chunk
// as it is; its parameters stay replicated and their gradients are all-reduced over the group.
// shard_input_dim >= 0 slices a full input along that dim to this rank's chunk first (a position
// embedding's positions: 0).
TpStyle sequence(int64_t shard_input_dim = -1);
// Left as it is (replicated parameters, replicated input and output).
TpStyle replicate();

// Module-name patterns (named_modules() names; `*` matches one path component:
// "blocks.*.attn.qkv") and their styles, applied in order. A module matched by two patterns is a
// ValueError.
using TpPlan = std::vector<std::pair<std::string, TpStyle>>;
// Whether the named_modules() name `name` matches a plan's pattern ('*': one path component).
bool module_name_matches(const std::string& pattern, const std::string& name);

// torch's parallelize_module: applies `plan` over `group` to `module` in place and returns it.
// Each planned parameter is replaced (in place: same TensorImpl, so module members and existing
// handles see it) by this rank's shard of its current full value, which every rank must hold
// alike (same seed, or a broadcast). A CausalSelfAttention whose qkv is colwise (chunks 3) and
// proj rowwise runs this rank's torch.chunk of its heads (5 heads over tp 2: 3 and 2; over tp 4:
// 2, 2, 1 and 0). Sizes need not divide by the group size (Note [uneven tp shards] in
// tensor_parallel.cc). Everything is checked before anything changes: a pattern matching no
// module, or a style on a module of the wrong type, is a ValueError naming it; a size that is not
// whole blocks of whole units (or not divisible under require_even) is a ShapeError naming the
// module and the sizes. A module parallelized already is a ValueError.
std::shared_ptr<nn::Module> parallelize(std::shared_ptr<nn::Module> module,
                                        const ProcessGroupPtr& group, const TpPlan& plan);

// Every parameter of `module` by name in its full shape: sharded ones all-gathered over their
// group (collective: every rank of each group calls it), replicated ones as they are (detached).
io::TensorDict tp_full_parameters(nn::Module& module);
// The squared 2-norm of all gradients of the full model: sharded parameters' squares summed over
// their group (one all-reduce per group), replicated ones counted once. Collective.
double tp_grad_norm_squared(nn::Module& module);
// clip_grad_norm_ with that norm: scales every gradient by max_norm / (norm + 1e-6) when below
// 1, as nn::clip_grad_norm_ does for the full model; returns the norm. Collective.
double tp_clip_grad_norm_(nn::Module& module, double max_norm);
// Whether parameter `name` of `module` (dotted, as named_parameters()) is a tp shard.
bool is_tp_sharded(nn::Module& module, const std::string& name);
// How a tp-sharded parameter is cut (what parallelize recorded): along `dim`, which holds `chunks`
// equal blocks, each split over the group in rank order as torch.chunk splits its units of
// `unit` elements (a packed [q | k | v]: chunks 3, unit head_dim): Region::shard(dim, chunks,
// tp size, tp rank, unit) of the full shape is this rank's piece.
struct TpShard {
  int64_t dim = 0;
  int64_t chunks = 1;
  int64_t unit = 1;
  int64_t full = 0;  // the full length along dim (the global shape's)
};
// Every tp-sharded parameter of `module` by name (named_parameters() names); the rest are
// replicated. What the tp step records as each parameter's layout (Note [tp step] in
// parallel/tp_step.cc).
std::map<std::string, TpShard> tp_shards(nn::Module& module);
// Rank `rank` of `size`'s piece of the full tensor `full` cut as `s` says (a contiguous copy),
// and the full tensor from every rank's piece `local` (collective over `group`: pieces padded to
// the largest for one all-gather per block).
Tensor tp_piece(const Tensor& full, const TpShard& s, int rank, int size);
Tensor tp_gather(const Tensor& local, const TpShard& s, const ProcessGroupPtr& group);

}  // namespace accel::dist
