// Dropout and other random ops under tensor parallelism: the activation layouts the styles record
// (parallel/tp_random.h), and the generator check of a parallelized model.
//
// Note [dropout under tensor parallelism]
// What is right: an activation replicated over the tp group (outside sequence-parallel regions,
// after a rowwise all-reduce) must get the same dropout mask on every rank, or the replicas drift
// apart; an activation sharded over tp (the sequence chunks of a sequence-parallel region, the
// features of a colwise output, the heads of split attention) must get independent masks per rank,
// or every chunk repeats one mask. Megatron-LM keeps two generator streams for that (its RNG
// tracker: a "model-parallel" stream seeded per tp rank, forked around the sharded regions, and
// the default one, equal on every rank, elsewhere); torch's DTensor instead draws a sharded random
// op at each shard's offset of a counter-based generator (Philox), so that the result does not
// depend on the sharding. accel does the latter, which gives more for less:
//  - Each dropout call draws one 64-bit key from its generator and takes each element's bits at
//    the element's index in a counter-based stream of that key (Note [dropout mask] in
//    autograd/ops/activation.cc). The tp ranks' generators are in one state (the same seed: a tp
//    model must be built alike on every rank anyway, and Accelerator::set_seed with
//    device_specific seeds a tp group alike), so they draw the same key, and each rank takes its
//    elements at their index in the full tensor: a replicated activation gets the same mask on
//    every rank, a sharded one this rank's slice of the one-process mask. Training with dropout at
//    tp, sequence parallel or not, therefore equals one process (at dp 1 without gradient
//    accumulation: a dp rank draws for its own rows, a micro-batch for itself).
//  - Nothing per rank to seed, fork or save: the default generator's state is the whole random
//    state, a checkpoint's "rng.default" resumes it bit for bit (at any tp size: there is no
//    "rng.tp"; Note [generator state in checkpoints] in accelerate/accelerator_state.cc), and
//    activation checkpointing's restored generator redraws the same masks. Megatron's tracker
//    needs all three done for its second stream, and its masks match one process in distribution
//    only.
//  - The cost per rank is a hash of each local element, less than the mt19937_64 draw per element
//    it replaces; accel's generator (mt19937_64) cannot skip ahead cheaply, hence one key per call
//    and a counter-based stream (SplitMix64's, core/sharded_random.h) behind it.
// Where each element sits: activations carry no placement, so each style records the layout of
// its output on the thread as the output leaves it (core/sharded_random.h's ShardedRegion), and a
// random op reads it: colwise without gather -> the last dim sharded (its `chunks` packed blocks),
// heads split; rowwise and vocab_embedding under sequence parallelism -> this rank's chunk along
// sequence_dim; colwise gathered, rowwise and vocab_embedding all-reduced -> whole. Elementwise ops
// in between (residual adds, LayerNorm, GELU) keep the layout, which is what lets a dropout
// anywhere between two styles, a module or a plain dropout() call, find it. Attention weights
// (B, H, L, S) are marked by their callers (scaled_dot_product_attention, CausalSelfAttention:
// DrawSite::AttentionWeights): after a colwise layer their dim 1 holds this rank's heads. The root
// of a parallelized model resets the layout to whole when a call starts and ends (forward hooks:
// its input is replicated over tp), and autograd::checkpoint saves it with the generator state for
// the recompute.
// What raises: a random op whose input does not fit the recorded layout (a chunk flattened to
// (B * T / tp, C), a transposed one, attention weights where no heads were split) cannot be drawn
// as one process would, so it is a ValueError naming the op, the shape and the module whose output
// opened the region; every rank runs the same shapes, so every rank raises.
// The generator check: the first call of a parallelized model that draws random numbers compares
// the tp ranks' default generators (one all-gather of a hash of their state). Generators seeded per
// rank would give replicated activations different masks: a ValueError on every rank, naming the
// model, before the backward.
// Limits: the root must be called through operator() (`(*model)(x)`) for the reset; a dropout
// given its own Generator* follows the layouts, but its state is the caller's to keep alike on the
// tp ranks (not checked, not in checkpoints).
#include "parallel/tp_random.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <sstream>
#include <vector>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/generator.h"

namespace accel::dist::detail {

namespace {
int size_of(const ProcessGroupPtr& g) { return g ? g->size() : 1; }
}  // namespace

ShardedRegion feature_region(const ProcessGroupPtr& g, const Tensor& out, int64_t chunks,
                             bool uneven, const std::shared_ptr<const std::string>& source) {
  if (size_of(g) == 1 || !out.defined() || out.dim() == 0) return {};
  ShardedRegion r;
  r.ways = g->size();
  r.index = g->rank();
  r.dim = -1;
  r.length = out.size(-1);
  r.chunks = chunks;
  r.heads = true;
  r.uneven = uneven;
  r.source = source;
  return r;
}

ShardedRegion sequence_region(const ProcessGroupPtr& g, const Tensor& out, int64_t dim,
                              const std::shared_ptr<const std::string>& source) {
  if (size_of(g) == 1 || !out.defined()) return {};
  ShardedRegion r;
  r.ways = g->size();
  r.index = g->rank();
  r.ndim = out.dim();
  r.dim = dim < 0 ? dim + out.dim() : dim;
  r.length = out.size(r.dim);
  r.source = source;
  return r;
}

namespace {

struct RootState {
  std::atomic<uint64_t> draws_at_entry{0};
  std::atomic<bool> checked{false};
};

// ValueError on every rank of `g` unless their default generators are in one state.
void check_generators(const ProcessGroupPtr& g, const std::string& model) {
  std::string state;
  {
    Generator& gen = default_generator();
    std::lock_guard<std::mutex> lk(gen.mutex());
    state = gen.state();
  }
  const uint64_t h = std::hash<std::string>{}(state);
  // Two exact 32-bit halves in float64, gathered from every rank of the group.
  const Tensor mine = tensor(std::vector<double>{double(h >> 32), double(h & 0xffffffffu)}, {2},
                             TensorOptions(kFloat64));
  Tensor all = empty({g->size(), 2}, TensorOptions(kFloat64));
  g->all_gather(all, mine);
  const double* a = all.data<double>();
  std::vector<int> differ;
  for (int q = 1; q < g->size(); ++q)
    if (a[2 * q] != a[0] || a[2 * q + 1] != a[1]) differ.push_back(q);
  if (differ.empty()) return;
  std::ostringstream ranks;
  for (size_t i = 0; i < differ.size(); ++i) ranks << (i ? ", " : "") << differ[i];
  ACCEL_THROW(ValueError, "parallelize", "the default generator of tp rank(s) ", ranks.str(),
              " of ", model, " is not in tp rank 0's state (of ", g->size(),
              " ranks), so dropout on activations replicated over tp would draw different masks "
              "and the replicas would drift apart: seed every rank of a tp group alike "
              "(manual_seed(seed) on every rank, or Accelerator::set_seed(seed, device_specific), "
              "which seeds a tp group alike) (Note [dropout under tensor parallelism])");
}

}  // namespace

void install_region_reset(nn::Module& root, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return;
  auto state = std::make_shared<RootState>();
  root.register_forward_pre_hook([state](nn::Module&, std::vector<Tensor>&) {
    set_sharded_region({});
    state->draws_at_entry.store(sharded_draw_count(), std::memory_order_relaxed);
  });
  root.register_forward_hook(
      [state, g](nn::Module& m, const std::vector<Tensor>&, std::vector<Tensor>&) {
        set_sharded_region({});
        if (state->checked.load(std::memory_order_relaxed) ||
            sharded_draw_count() == state->draws_at_entry.load(std::memory_order_relaxed))
          return;
        state->checked.store(true, std::memory_order_relaxed);
        check_generators(g, m.type_name());
      });
}

}  // namespace accel::dist::detail
