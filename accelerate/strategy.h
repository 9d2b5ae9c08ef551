// dist::Strategy: how a prepared model's parameters, gradients and optimizer state are
// distributed. The Accelerator (accelerate/accelerator.h) owns one and delegates to it everything
// that depends on that choice; the facade itself only counts steps, scales losses, wraps loaders
// and schedulers, and runs the checkpoint protocol (atomic directory, agree, roll back). It picks
// the strategy by name from a registry (Note [strategy registry] in
// accelerate/strategy_registry.h) and never switches on one; the strategy it holds is that engine
// composed with the mesh's model steps (Note [composed strategy] in accelerate/composition.cc).
//
//   name     file               world  what a rank holds between steps
//   none     strategy.cc        1      everything
//   ddp      strategy_ddp.cc    > 1    everything; gradients all-reduced in buckets
//   (parallel/ddp.h) zero1    strategy_zero.cc   > 1    full parameters and gradients, 1/N
//   optimizer state zero2    strategy_zero.cc   > 1    full parameters, 1/N gradients and optimizer
//   state
//                                      (parallel/zero.h)
//   fsdp     strategy_fsdp.cc   > 1    1/N of parameters, gradients and optimizer state,
//                                      gathered per wrapping unit around its forward and
//                                      backward (parallel/fsdp.h): the one ZeRO-3 engine
//
// Note [strategy seam]
// The facade calls, in a training step:
//   backward(loss, sync)       the loss is already divided by the accumulation steps and scaled
//   grads(stepping)            before the step: unscale, inf/NaN check, clipping act on these
//   (the facade copies the user's per-group lr / weight decay into `stepping`, then steps it)
//   after_step(stepping, ...)  e.g. all-gather updated parameters
//   zero_grad(stepping, ...)
// `stepping` is the optimizer prepare_optimizer returned: the user's own, or one rebuilt over
// this rank's shards with optim::Optimizer::rebuild. The user's optimizer keeps driving the
// learning rate (schedulers hold it); it never steps itself when a rebuilt one exists.
// Checkpoints go through the strategy's StrategyCheckpoint (checkpoint()): how the state is laid
// out in files is the strategy's, the commit protocol around it the facade's.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/module.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "core/error.h"
#include "core/tensor.h"
#include "accelerate/amp.h"
#include "accelerate/strategies/options.h"
#include "parallel/ddp.h"
#include "comm/process_group.h"
#include "parallel/zero.h"
#include "parallel/checkpoint/reader.h"
#include "parallel/checkpoint/writer.h"
#include "parallel/placement.h"

namespace accel::dist {

struct StrategyContext {
  ProcessGroupPtr group;  // the world's; null with one process
  int rank = 0, world_size = 1;
  // The data-parallel groups of the Accelerator's mesh (Note [mesh support] in
  // accelerate/accelerator_mesh.cc), each null where it is `group`: DDP replicates over `dp`
  // (dp_replicate x dp_shard); ZeRO 1-3 shard over `dp_shard` and, with HSDP, replicate each
  // shard across `dp_replicate` (null or a group of one: no replication).
  ProcessGroupPtr dp, dp_shard, dp_replicate;
  const ProcessGroupPtr& dp_group() const { return dp ? dp : group; }
  const ProcessGroupPtr& shard_group() const { return dp_shard ? dp_shard : group; }
  bool hsdp() const { return dp_replicate && dp_replicate->size() > 1; }
  Device device = kCPU;
  GradScaler* scaler = nullptr;  // the facade's; enabled() under fp16
  // Gradient bucketing every strategy shares (bucket size, find_unused_parameters,
  // broadcast_buffers); a ZeRO checkpoint's layout is read against its bucket size.
  DDPOptions ddp;
  MixedPrecision mixed_precision = MixedPrecision::No;
  // StrategySpec::options's value (Note [typed strategy options] in
  // accelerate/strategies/options.h); null: the strategy's defaults.
  std::shared_ptr<const StrategyOptions> options;

  // The options as the strategy's type T (defaults when none were given); ValueError naming
  // `strategy` when they are of another type.
  template <typename T>
  const T& options_as(std::string_view strategy) const {
    static const T defaults{};
    if (!options) return defaults;
    const T* o = dynamic_cast<const T*>(options.get());
    ACCEL_CHECK(o != nullptr, ValueError, "accelerator", "strategy '", strategy,
                "' was given options of another strategy");
    return *o;
  }
};

// The gradients an optimizer step reads, as the strategy holds them.
struct StepGrads {
  std::vector<Tensor> params;  // tensors whose .grad is what the optimizer steps with
  bool sharded = false;        // each rank holds a disjoint part: norms and flags are reduced
  // sharded: the group over whose ranks the parts are disjoint (HSDP: the shard group, whose
  // replicas hold equal parts); null: the world.
  ProcessGroupPtr shard_group;
  // Per entry of `params`, when the strategy knows it: "<model index>:<parameter name>" of the
  // model parameter the gradient belongs to (what the composition needs to tell parameters cut
  // along a mesh dimension from replicated ones: Note [composed gradient norms] in
  // accelerate/composition.cc).
  std::vector<std::string> names;
  // One parameter's range [begin, begin + length) of an entry's flattened gradient (length -1:
  // all of it), named as `names` names them; `weight`: the factor of its p-th power in the
  // reduced norm, set by the composition.
  struct Part {
    std::string name;
    int64_t begin = 0, length = -1;
    double weight = 1;
  };
  // Per entry of `params`, or empty: the parameters an entry holds when it holds several (a
  // ZeRO-1/2 bucket shard: one part per parameter it overlaps); an entry without parts is the one
  // parameter `names` gives, whole. After the composition: every entry's parts with weights,
  // or empty when every weight is 1.
  std::vector<std::vector<Part>> parts;
};

// Bytes this rank holds for the prepared models and optimizers (see ZeroMemory).
struct StrategyMemory {
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t gathered_param_bytes = 0;  // stage 3: unit parameters materialised right now
  int64_t full_param_bytes = 0;      // one unsharded replica
};

// What read_pieces() found in a checkpoint: applied by apply_state().
struct StrategyState {
  virtual ~StrategyState() = default;
};

// How a strategy's state is laid out in a checkpoint and read back (Note [checkpoint loading] in
// accelerate/accelerator.cc): each strategy provides one (Strategy::checkpoint()); the facade
// runs the commit protocol around it (Note [atomic checkpoints] in accelerate/checkpoint.h).
using PlaceFn =
    std::function<TensorPlace(size_t model, const std::string& name, const Shape& local)>;

// Note [format-2 strategy seam]
// save_state writes checkpoint format 2 (Note [format-2 checkpoints] in
// parallel/checkpoint/reader.h): the facade asks the strategy for its pieces (state_entries: the
// models' parameters and persistent buffers, the optimizers' slots and steps by parameter, the
// optimizers' param groups, and inside an accumulation window each rank's own gradients), adds
// schedulers and RNG, and ckpt::save_pieces writes them. load_state opens the checkpoint
// (ckpt::open_checkpoint) and asks the strategy for its state read from it (read_pieces: every
// tensor this rank keeps, read as its region of the global tensor into fresh buffers, whatever
// mesh saved it), which apply_state swaps in (Note [checkpoint loading]). A format-1 checkpoint
// (state.json) is read through the same call: ckpt::open_legacy gives its tensors format 2's names
// (Note [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h).
// Regions compose: the strategy that cuts a tensor last (ZeRO's flat range of a bucket shard,
// FSDP's span) narrows the region its place() gives, which is the whole tensor, or, under tensor
// parallelism, the tp part the composition gives it through set_place() (Note [composed strategy]
// in accelerate/composition.cc).
class StrategyCheckpoint {
 public:
  virtual ~StrategyCheckpoint() = default;
  // Format 2: this rank's pieces (Note [format-2 strategy seam]); `world_rank` names the per-rank
  // window gradients ("grad.<i>.<name>.rank<r>"). Default: NotImplementedError naming the seam.
  virtual void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank);
  // Step 1 of a load: what this rank keeps, read from `src` (format 2, or format 1 through
  // ckpt::open_legacy) into fresh buffers; changes nothing. IoError / ValueError naming the tensor
  // or the mismatch. Window gradients only when `mid_window` (the facade checked the mesh).
  virtual std::unique_ptr<StrategyState> read_pieces(ckpt::CheckpointSource& src, bool mid_window,
                                                     int world_rank);
  // Where prepared models' tensors lie before this strategy cuts them (the composition sets it
  // from the model steps' layouts: ParallelPlan::place); null: whole, this rank primary.
  void set_place(PlaceFn f) { place_ = std::move(f); }
  TensorPlace place(size_t model, const std::string& name, const Shape& local) const {
    if (place_) return place_(model, name, local);
    return TensorPlace{Region::whole(local), true, true, ""};
  }
  // Pipeline parallelism (the composition sets it at pp_size > 1): whether state entry `name` of
  // prepared model `model` is held by another pipeline stage, so a checkpoint or file holding it
  // is not "unexpected" here. Pipelined optimizers hold one stage's parameters: their group
  // membership is read by parameter names, not from the file's index lists.
  void set_elsewhere(std::function<bool(size_t model, const std::string& name)> f) {
    elsewhere_ = std::move(f);
  }
  bool held_elsewhere(size_t model, const std::string& name) const {
    return elsewhere_ && elsewhere_(model, name);
  }
  bool pipelined() const { return static_cast<bool>(elsewhere_); }

 private:
  PlaceFn place_;
  std::function<bool(size_t, const std::string&)> elsewhere_;

 public:
  // Step 3: replaces this rank's models, optimizers and window gradients by `state` and leaves in
  // `state` what it replaced, so that a second apply_state(state) undoes the first: a load needs
  // no copy of the model for its rollback (Note [checkpoint loading]). It checks everything
  // first: it either throws having changed nothing or changes everything. No collective.
  virtual void apply_state(StrategyState& state) = 0;
  // After the facade agreed on the outcome of a load (applied, or undone), on every rank:
  // collective work the load needs (ZeRO-3: gather the root units from the new shards).
  virtual void finish_load() {}
  // One consolidated safetensors file of prepared model `index` written by rank 0 (collective;
  // sharded strategies stream it unit by unit).
  virtual void save_model(size_t index, const std::string& path) = 0;
  // The shape state entry `name` of prepared model `index` has in a full (1-process) file, given
  // its shape here: `local` unless the strategy splits it (tensor parallelism).
  virtual Shape full_shape(size_t index, const std::string& name, const Shape& local) const {
    (void)index;
    (void)name;
    return local;
  }
  // The whole state_dict of prepared model `index` on every rank (collective; under ZeRO-3 it
  // gathers every unit: the one call that holds the whole model).
  virtual io::TensorDict full_state_dict(size_t index) = 0;
  // Accelerator::load_model (which checked names and shapes): reads every entry of prepared model
  // `index`'s state that `src` holds into what this rank keeps of it, straight into the model's
  // tensors (ZeRO-3: this rank's span of each trainable parameter, the rest whole; Note
  // [streaming model loads] in accelerate/accelerator.cc). Collective: an error of the reads is
  // kept in `err` until the collective work is done, so no peer is left waiting.
  virtual void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                          std::exception_ptr& err) = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;  // its registered name

  // ---- prepare ----
  // Once per model, in prepare order, after it was moved to the device.
  virtual void prepare_model(const std::shared_ptr<nn::Module>& model) = 0;
  // The optimizer that will step (Note [strategy seam]).
  virtual std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) = 0;
  // The DistributedDataParallel of a prepared model; null unless this is DDP.
  virtual DistributedDataParallel* ddp(const nn::Module&) const { return nullptr; }
  // Whether prepare_model takes a model built under nn::DeferredInit as it is and materialises it
  // itself (ZeRO-3: unit by unit); otherwise the model steps before it materialise their pieces
  // (Note [tp step] in parallel/tp_step.cc).
  virtual bool takes_deferred_models() const { return false; }
  // The model chunks this rank runs when prepared model `m` is pipelined (pp_size > 1: Note [pp
  // step] in parallel/pp_step.cc), in the order of its virtual stages; null otherwise.
  virtual const std::vector<std::function<Tensor(const Tensor&)>>* pipeline(
      const nn::Module& m) const {
    (void)m;
    return nullptr;
  }

  // ---- step ----
  // Note [plain backward]: a backward syncs the gradients when `sync` (the facade's sync step
  // outside no_sync), through the gradient hooks; backward(loss, sync) is loss.backward() under
  // that setting, and set_sync(s) is what a plain loss.backward() of the user's gets from then on.
  virtual void backward(const Tensor& loss, bool sync) = 0;
  virtual void set_sync(bool sync) { (void)sync; }
  // Whether a window may run backward passes that each reach only part of the trainable
  // parameters (a pipeline stage of several chunks: one backward per chunk and microbatch), synced
  // at its end by one more backward of zero over every parameter. One process and DDP can; ZeRO-1/2
  // cannot (each backward reduces what it gives), nor ZeRO-3 (a parameter is released outside its
  // unit's forward and backward). Default: no.
  virtual bool takes_partial_backwards() const { return false; }
  virtual StepGrads grads(const optim::Optimizer& stepping) = 0;
  virtual void after_step(optim::Optimizer& stepping, bool stepped) = 0;
  virtual void zero_grad(optim::Optimizer& stepping, bool set_to_none) = 0;
  virtual StrategyMemory memory() const = 0;

  // ---- checkpoints ----
  virtual StrategyCheckpoint& checkpoint() = 0;
};

}  // namespace accel::dist
