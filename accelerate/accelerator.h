// accel::Accelerator: the training facade, Hugging Face Accelerate's API in C++.
//
//   Accelerator acc;                                     // config + ACCEL_* env + RANK/WORLD_SIZE
//   auto [model, opt, loader, sched] = acc.prepare(model, opt, loader, sched);
//   for (auto& batch : *loader) {
//     auto scope = acc.accumulate();                     // sync only every k-th micro-batch
//     Tensor loss;
//     { auto ac = acc.autocast(); loss = cross_entropy(model->forward(batch[0]), batch[1]); }
//     acc.backward(loss);
//     acc.clip_grad_norm_(1.0);
//     opt->step(); sched->step(); opt->zero_grad();
//   }
//   acc.save_state();                                    // project_dir/checkpoints/checkpoint_<n>
//
// Everything that depends on how parameters, gradients and optimizer state are distributed is
// delegated to one dist::Strategy (accelerate/strategy.h, Note [strategy seam]), picked from the
// world size and zero_stage: NoStrategy (1 process), DdpStrategy (zero_stage 0; Note [gradient
// sync] in accelerate/strategy_ddp.cc), ZeroStrategy (stages 1-2; Note [zero in the facade] in
// accelerate/strategy_zero.cc), FsdpStrategy (stage 3: per-unit sharding, Note [unit lifecycle] in
// parallel/fsdp.h; AcceleratorConfig::fsdp). The facade counts steps, scales losses, wraps loaders
// and schedulers, and runs the checkpoint protocol.
//
// What prepare() does per object:
//  - Module: moved to device(), then handed to the strategy: under DDP wrapped by a
//    dist::DistributedDataParallel (parameters and buffers broadcast from rank 0, gradients
//    averaged in buckets during backward on every sync step); under ZeRO-1/2 sharded when its
//    optimizer is prepared; under ZeRO-3 sharded per wrapping unit right away (a model built
//    under nn::DeferredInit is materialized unit by unit here, never whole). Models are
//    prepared before the other objects of the same prepare() call.
//  - Optimizer -> AcceleratedOptimizer: step() is a no-op while accumulating, unscales and
//    skips on inf/NaN under fp16, zero_grad() only on sync steps. Under ZeRO the optimizer that
//    steps is your optimizer rebuilt over this rank's shards (optim::Optimizer::rebuild); yours
//    keeps driving the learning rates.
//  - DataLoader -> a new DataLoader over the same dataset and options, sharded to this rank
//    (rank, world size, even_batches, split_batches of the config), whose batches are on
//    device() (config.device_placement; pinned + non-blocking copies on CUDA). Use the returned
//    one.
//  - LRScheduler -> AcceleratedScheduler: steps only when the optimizer really stepped.

#pragma once

#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "core/tensor.h"
#include "data/dataloader.h"
#include "accelerate/amp.h"
#include "parallel/ddp.h"
#include "comm/device_mesh.h"
#include "comm/process_group.h"
#include "core/parallelism.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/fsdp.h"
#include "parallel/tensor_parallel.h"
#include "accelerate/strategy.h"
#include "accelerate/tracking.h"

namespace accel {

using dist::MixedPrecision;

enum class DistributedType : uint8_t { No, MultiCPU, MultiGPU };
std::string_view distributed_type_name(DistributedType t);  // "NO", "MULTI_CPU", "MULTI_GPU"

struct AcceleratorConfig {
  bool cpu = false;  // force CPU even when CUDA devices exist
  MixedPrecision mixed_precision = MixedPrecision::No;
  int gradient_accumulation_steps = 1;
  // Which strategy distributes the model (Note [strategy registry] in
  // accelerate/strategy_registry.h): a registered name ("ddp", "zero1", "zero2", "fsdp", or a
  // program's own), or empty: the one zero_stage selects (0 ddp, 1 zero1, 2 zero2, 3 fsdp).
  std::string strategy;
  // Options of a strategy that has no fields here (one typed value, read by the strategy with
  // StrategyContext::options_as<T>); the built-in ones read ddp / zero / fsdp below.
  std::shared_ptr<const dist::StrategyOptions> strategy_options;
  int zero_stage = 0;             // 0..3; with `strategy` set: the strategy's own stage (or 0)
  std::optional<uint64_t> seed;   // set_seed(seed) at construction when given
  std::string project_dir = ".";  // trackers and automatic checkpoints live here
  std::vector<std::string> log_with = {"jsonl"};  // "jsonl", "tensorboard"
  int total_limit = 0;         // keep at most this many automatic checkpoints (0 = all)
  bool split_batches = false;  // loader batch size is the global batch
  bool even_batches = true;    // pad the last global batch so every rank has as many
  // Prepared loaders hand out batches on device() (Accelerate's device_placement): every tensor
  // of a batch is copied there (from pinned memory, non-blocking, on CUDA). false: batches stay
  // on the CPU and the loop moves them itself.
  bool device_placement = true;
  // Force a sync step at the last batch of a loader epoch even mid-window (Accelerate does).
  bool sync_with_dataloader = true;
  dist::GradScalerOptions scaler;
  // Data-parallel options (bucket_cap_bytes, find_unused_parameters, broadcast_buffers) of the
  // DistributedDataParallel wrapping each model; ZeRO uses its bucket size and
  // find_unused_parameters too. `root` is ignored: rank 0 is always the source.
  dist::DDPOptions ddp;
  // zero_stage 3 (parallel/fsdp.h, Note [unit lifecycle]): which modules are wrapping units,
  // prefetch, activation checkpointing per unit, bf16/fp16 compute parameters.
  // find_unused_parameters comes from `ddp`.
  dist::FsdpOptions fsdp;
  // zero_stage 1 and 2: bf16/fp16 compute parameters with fp32 master shards (param_dtype,
  // reduce_in_fp32 of dist::ZeroOptions; its other fields come from zero_stage and `ddp`).
  dist::ZeroOptions zero;
  std::chrono::milliseconds timeout = dist::kDefaultCollectiveTimeout;
  // The device mesh (Accelerate's ParallelismConfig: dp_replicate_size, dp_shard_size, cp_size,
  // tp_size; and pp_size; docs/parallelism.md): sizes left unset are inferred from the world size
  // (Note [mesh sizes] in core/parallelism.h), and sizes that do not fit it are a ValueError in the
  // constructor. What prepare() runs on today: Note [mesh support] in
  // accelerate/accelerator_mesh.cc.
  ParallelismConfig parallelism;
  // With tp_size > 1: how prepare() splits each model over its tp group (dist::parallelize's
  // plan: module-name patterns and their styles, parallel/tensor_parallel.h;
  // models::gpt_tp_plan() for examples/models.h's Gpt). Required then; ignored otherwise.
  dist::TpPlan tp_plan;
  // With cp_size > 1: which modules' attention runs as ring attention over the cp group and which
  // take token positions (parallel/context_parallel.h; models::gpt_cp_plan() for Gpt). Required
  // then; ignored otherwise. Prepared data loaders then hand each rank its tokens (dim 1 of every
  // batch field with more than one dimension: Note [zig-zag sequence sharding]).
  dist::CpPlan cp_plan;
  // With pp_size > 1: how prepare() cuts each model (which must have a pipeline form,
  // dist::PipelineModel) into stages, and the schedule and microbatches of forward_backward
  // (parallel/pipeline.h; Note [pp step] in parallel/pp_step.cc). Ignored otherwise.
  dist::PipelinePlan pipeline;
  // Override the fields above from ACCEL_STRATEGY, ACCEL_MIXED_PRECISION, ACCEL_USE_CPU,
  // ACCEL_ZERO_STAGE,
  // ACCEL_GRADIENT_ACCUMULATION_STEPS, ACCEL_PARAM_DTYPE / ACCEL_REDUCE_DTYPE (zero and fsdp),
  // ACCEL_FSDP_* (fsdp) and ACCEL_DP_REPLICATE_SIZE / ACCEL_DP_SHARD_SIZE / ACCEL_CP_SIZE /
  // ACCEL_TP_SIZE / ACCEL_PP_SIZE (parallelism) when they are set (what accel-run exports;
  // docs/launcher.md).
  bool read_env = true;

  // This config with the ACCEL_* overrides applied; ValueError naming the variable when one is
  // malformed.
  AcceleratorConfig with_env() const;
};

class Accelerator;

class AcceleratedOptimizer {
 public:
  // `stepping`: what Strategy::prepare_optimizer returned (null: `opt` itself).
  AcceleratedOptimizer(Accelerator& acc, std::shared_ptr<optim::Optimizer> opt,
                       std::shared_ptr<optim::Optimizer> stepping = nullptr);
  ~AcceleratedOptimizer();
  // See the header comment; returns whether the optimizer stepped.
  bool step();
  // PyTorch's step(closure): closure() with grad mode on (it runs forward and acc.backward),
  // then step(); returns the closure's loss (step_was_skipped() says whether it stepped).
  // An optimizer that requires_closure() (LBFGS) gets the closure itself and calls it as often
  // as it needs (Note [closure optimizers] in accelerate/accelerator.cc).
  Tensor step(const std::function<Tensor()>& closure);
  void zero_grad(bool set_to_none = true);
  bool step_was_skipped() const { return skipped_; }
  // Your optimizer (it holds the learning rates).
  optim::Optimizer& optimizer() { return *opt_; }
  const std::shared_ptr<optim::Optimizer>& shared() const { return opt_; }
  // The one that steps: yours, or under ZeRO yours rebuilt over this rank's shards (its
  // state_dict is what save_state writes per rank).
  optim::Optimizer& stepping_optimizer() { return *stepping_; }
  std::vector<Tensor> params() const;
  double lr(size_t group = 0) const { return opt_->lr(group); }
  // Your optimizer's state (under ZeRO: its param groups; the shard state is saved per rank by
  // Accelerator::save_state).
  io::TensorDict state_dict() const { return opt_->state_dict(); }
  void load_state_dict(const io::TensorDict& s) { opt_->load_state_dict(s); }

 private:
  Accelerator& acc_;
  std::shared_ptr<optim::Optimizer> opt_;
  std::shared_ptr<optim::Optimizer> stepping_;
  bool skipped_ = false;
};

class AcceleratedScheduler {
 public:
  AcceleratedScheduler(Accelerator& acc, std::shared_ptr<optim::LRScheduler> sched);
  // Steps the wrapped scheduler only on sync steps whose optimizer step was not skipped.
  void step();
  // ReduceLROnPlateau's step(metric), on the same steps (every rank must pass the same metric,
  // e.g. one reduced with Accelerator::reduce); ValueError for any other scheduler.
  void step(double metric);
  const std::vector<double>& get_last_lr() const { return sched_->get_last_lr(); }
  optim::LRScheduler& scheduler() { return *sched_; }
  io::TensorDict state_dict() const { return sched_->state_dict(); }
  void load_state_dict(const io::TensorDict& s) { sched_->load_state_dict(s); }

 private:
  Accelerator& acc_;
  std::shared_ptr<optim::LRScheduler> sched_;
};

class Accelerator {
 public:
  explicit Accelerator(AcceleratorConfig config = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- where we run ----
  const AcceleratorConfig& config() const { return config_; }
  Device device() const { return device_; }
  DistributedType distributed_type() const { return distributed_type_; }
  MixedPrecision mixed_precision() const { return config_.mixed_precision; }
  int num_processes() const { return world_size_; }
  int process_index() const { return rank_; }
  int local_process_index() const { return local_rank_; }
  bool is_main_process() const { return rank_ == 0; }
  bool is_local_main_process() const { return local_rank_ == 0; }
  bool is_last_process() const { return rank_ == world_size_ - 1; }
  int gradient_accumulation_steps() const { return config_.gradient_accumulation_steps; }
  // The process group (null with one process).
  dist::ProcessGroup* process_group() const { return group_.get(); }
  // The device mesh of config().parallelism over this world (dimensions dp_replicate, dp_shard,
  // tp, and "dp" flattened from the first two; Note [mesh layout] in comm/device_mesh.h). A
  // layout: which ranks form each group; it holds no process groups yet.
  const dist::DeviceMesh& mesh() const { return *mesh_; }
  // The strategy in use ("none" with one process unless the strategy runs alone).
  std::string_view strategy_name() const { return strategy_->name(); }

  // ---- prepare ----
  template <typename M>
  std::shared_ptr<M> prepare_model(std::shared_ptr<M> model) {
    static_assert(std::is_base_of_v<nn::Module, M>, "prepare_model expects an nn::Module");
    prepare_module(model);
    return model;
  }
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer(std::shared_ptr<optim::Optimizer> opt);
  std::shared_ptr<data::DataLoader> prepare_data_loader(std::shared_ptr<data::DataLoader> loader);
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(std::shared_ptr<optim::LRScheduler> s);
  // prepare(model, optimizer, loader, scheduler, ...) in any order and number: a tuple of the
  // prepared objects, each by the rule of the header comment. Models are prepared first (as
  // Accelerate does), the rest left to right: an optimizer under ZeRO is rebuilt over the
  // parameters of prepared models, whatever the argument order.
  template <typename... Ts>
  auto prepare(Ts&&... objects) {
    (prepare_if_model(objects), ...);  // a fold over `,` runs left to right
    // Braced initialisation evaluates left to right too (make_tuple's arguments need not).
    return std::tuple<decltype(prepare_rest(std::forward<Ts>(objects)))...>{
        prepare_rest(std::forward<Ts>(objects))...};
  }
  // The model itself (this facade does not wrap the module object); for API parity.
  template <typename M>
  M& unwrap_model(const std::shared_ptr<M>& model) const {
    return *model;
  }
  // The DistributedDataParallel synchronising a prepared model's gradients; null with one
  // process, under ZeRO, and for a model without trainable parameters.
  dist::DistributedDataParallel* ddp(const nn::Module& model) const;
  // The distribution strategy (name(): "none", "ddp", "zero1", ...) and the bytes it holds for
  // the prepared models and optimizers on this rank.
  const dist::Strategy& strategy() const { return *strategy_; }
  dist::StrategyMemory memory() const { return strategy_->memory(); }
  // The whole state_dict of a prepared model (Accelerate's get_state_dict): under ZeRO-3 every
  // unit is gathered, so this one call holds the whole model. Collective.
  io::TensorDict get_state_dict(const nn::Module& model);
  // One consolidated safetensors file of a prepared model, written by the main process
  // (Accelerate's save_model). Under ZeRO-3 it streams unit by unit: no rank holds more than one
  // unit in full. Collective.
  void save_model(const nn::Module& model, const std::string& path);
  // Loads weights into a model (Accelerate's load_checkpoint_in_model): `path` is a safetensors
  // file, a sharded set's index (model.safetensors.index.json, as transformers writes it) or a
  // directory holding either. A prepared model is loaded where it lives, under every strategy,
  // each rank reading only what it keeps (under ZeRO-3 its own shards: Note [streaming model
  // loads] in accelerate/accelerator.cc); an unprepared model is loaded whole, locally (deferred
  // tensors get their memory). Values are converted to the model's dtypes. Strict by default:
  // names the model lacks or the file lacks are a ValueError listing them (strict = false
  // returns them instead); a shape mismatch always is. Names and shapes are checked on every
  // rank before anything is read (nothing changes when one rank refuses); a read that fails
  // afterwards (a file changing underfoot) is an IoError on every rank, the model partly
  // loaded. Collective for a prepared model.
  nn::LoadResult load_model(nn::Module& model, const std::string& path, bool strict = true);

  // ---- training step ----
  // loss / gradient_accumulation_steps (times the loss scale under fp16), backward with
  // autocast suspended (it gives the same gradients inside or outside an autocast scope), and
  // the gradient sync of Note [gradient sync] on sync steps; returns once the gradients are
  // averaged. A plain loss.backward() on the prepared models syncs the same way (the strategy's
  // gradient hooks do it); but it does not divide or scale the loss, so with
  // gradient_accumulation_steps > 1 or fp16 the next step, clip or zero_grad raises ValueError
  // naming acc.backward(loss) (Note [plain backward] in accelerate/accelerator.cc).
  void backward(const Tensor& loss);
  // One micro-step's forward and backward on every mesh: loss(model(inputs), targets), then
  // backward() of it; returns the loss (detached). Under pp_size > 1 the prepared model runs as a
  // pipeline (dist::pipeline_step over the pp group with AcceleratorConfig::pipeline's schedule
  // and microbatches: inputs read on the first stage, targets on the last, each cut into the
  // microbatches along dim 0) and the returned loss is the batch's mean loss on every rank, a
  // 0-dim float64 tensor. The gradients then are those of backward(loss) on one process: divided
  // by the accumulation steps, synced once on sync steps (after the stage's last microbatch).
  // Mixed precision as for backward(): the forward runs in the autocast scope of the caller
  // ({ auto ac = acc.autocast(); loss = acc.forward_backward(...); }), the backward outside it.
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  Tensor forward_backward(nn::Module& model, const Tensor& inputs, const Tensor& targets,
                          const LossFn& loss);
  bool sync_gradients() const { return sync_gradients_; }
  // Micro-batches seen by accumulate() scopes (Accelerate's `step`).
  int64_t step() const { return step_; }
  // Optimizer steps actually taken (not skipped, not accumulating).
  int64_t optimizer_steps() const { return optimizer_steps_; }
  bool optimizer_step_was_skipped() const;

  // with accelerator.accumulate(model): advances the micro-batch counter and decides whether
  // this is a sync step (every k-th, or the last batch of a loader epoch); a non-sync step runs
  // as under no_sync() until the scope ends.
  class AccumulateScope {
   public:
    explicit AccumulateScope(Accelerator& acc);
    ~AccumulateScope();
    AccumulateScope(const AccumulateScope&) = delete;
    AccumulateScope& operator=(const AccumulateScope&) = delete;

   private:
    Accelerator& acc_;
    bool prev_no_sync_;
  };
  AccumulateScope accumulate() { return AccumulateScope(*this); }
  // with model.no_sync(): backward() inside only accumulates locally.
  class NoSyncScope {
   public:
    explicit NoSyncScope(Accelerator& acc);
    ~NoSyncScope();
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    Accelerator& acc_;
    bool prev_;
  };
  NoSyncScope no_sync() { return NoSyncScope(*this); }

  // Mixed-precision forward scope (autograd/autocast.h): bf16/fp16 per the config, a no-op
  // with mixed_precision = no.
  AutocastGuard autocast() const;

  // Clips the gradients of every prepared model (or `params`) to total p-norm max_norm and
  // returns the norm before clipping. Under fp16 the gradients are unscaled first (once per
  // step). The norm is that of the full gradient: with replicated gradients (this fallback and
  // DDP) the local norm, with sharded gradients the all-reduced one.
  double clip_grad_norm_(double max_norm, double p = 2.0);
  double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p = 2.0);
  void clip_grad_value_(double clip_value);

  // ---- collectives for evaluation (identity-like with one process) ----
  // Concatenation along dim 0 of every rank's tensor (rank order); ranks may differ in dim 0,
  // the other dims must agree. 0-dim tensors are gathered as (W,).
  Tensor gather(const Tensor& t);
  // gather() without the samples even_batches duplicated: each rank drops the last
  // `num_padding` rows of its tensor (from its Batch) before it is gathered.
  Tensor gather_for_metrics(const Tensor& t, const data::Batch& batch);
  Tensor gather_for_metrics(const Tensor& t, int64_t num_padding);
  // A reduced copy: "sum", "mean", "max", "min".
  Tensor reduce(const Tensor& t, const std::string& op = "sum");
  // Pads t along `dim` (with `pad_value`) to the largest size any rank has.
  Tensor pad_across_processes(const Tensor& t, int64_t dim = 0, double pad_value = 0,
                              bool pad_first = false);
  // A copy of rank `root`'s tensor on every rank (shapes must agree).
  Tensor broadcast(const Tensor& t, int root = 0);

  // ---- process control ----
  void wait_for_everyone();
  // Runs fn on the main process first, then on the others.
  void main_process_first(const std::function<void()>& fn);
  void local_main_process_first(const std::function<void()>& fn);
  // This rank's contiguous share of `items` (the first len % W ranks get one more); with
  // apply_padding every rank gets ceil(len / W), the short ones repeating their last item.
  template <typename T>
  std::vector<T> split_between_processes(const std::vector<T>& items,
                                         bool apply_padding = false) const;
  // Seeds the default generator (plus the data-parallel index when device_specific: the process
  // index without tp; the ranks of a tp group share one, so their dropout masks of replicated
  // activations agree).
  void set_seed(uint64_t seed, bool device_specific = false);
  // std::cout on the main process only, one line, flushed.
  template <typename... Args>
  void print(Args&&... args) const {
    if (!is_main_process()) return;
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    std::cout << os.str() << std::endl;
  }

  // ---- trackers (main process only) ----
  void init_trackers(const std::string& run_name = "",
                     const std::map<std::string, std::string>& config = {});
  void log(const dist::Metrics& metrics, int64_t step = -1);
  void end_training();
  // Directory the trackers write to (project_dir/<run_name>).
  const std::string& logging_dir() const { return logging_dir_; }

  // ---- checkpoints (Note [atomic checkpoints] in accelerate/checkpoint.h) ----
  // Saves every prepared object, each rank's RNG, loader positions, scaler and counters into
  // `dir` (empty: project_dir/checkpoints/checkpoint_<n>, with total_limit rotation). Collective:
  // every rank must call it. Returns the checkpoint directory. `dir` is replaced as a whole, so an
  // IoError on every rank refuses one that is neither empty nor a checkpoint folder of accel's
  // (Note [what save_state replaces] in accelerate/checkpoint.h). Several machines need one shared
  // file system for `dir` (docs/checkpointing.md).
  std::string save_state(const std::string& dir = "");
  // Loads a checkpoint directory, or the one named by `dir`/latest (empty:
  // project_dir/checkpoints). Collective. Another world size re-shards (ZeRO state) or just
  // reloads (replicated state), loaders resume at the same global sample; not inside an
  // accumulation window. All or nothing: on any error (IoError for a missing or malformed file)
  // no prepared object, RNG, loader or counter has changed, on any rank (Note [checkpoint
  // loading] in accelerate/accelerator.cc).
  std::string load_state(const std::string& dir = "");
  // Extra state saved with every checkpoint under `name` (string maps, per rank).
  using SaveFn = std::function<std::map<std::string, std::string>()>;
  using LoadFn = std::function<void(const std::map<std::string, std::string>&)>;
  void register_for_checkpointing(const std::string& name, SaveFn save, LoadFn load);
  // Where automatic checkpoints go: project_dir/checkpoints.
  std::string checkpoints_dir() const;

  dist::GradScaler& scaler() { return scaler_; }

  // AcceleratedOptimizer::step on a sync step (Note [strategy seam]): copies the lr / weight
  // decay of every group of your optimizer into the stepping one, unscales and checks the
  // strategy's gradients under fp16, steps, tells the strategy. Returns false when skipped.
  bool step_prepared_optimizer(AcceleratedOptimizer& opt);
  // AcceleratedOptimizer::step(closure) for an optimizer that requires_closure().
  Tensor step_prepared_closure(AcceleratedOptimizer& opt, const std::function<Tensor()>& closure);
  // AcceleratedOptimizer::zero_grad on a sync step.
  void zero_grad_prepared_optimizer(AcceleratedOptimizer& opt, bool set_to_none);

 private:
  // What a backward runs on: `loss` / gradient_accumulation_steps, times the loss scale under
  // fp16 (backward(), forward_backward()'s microbatches).
  Tensor loss_for_backward(const Tensor& loss);
  struct CheckpointIo;  // accelerate/accelerator_state.cc: Note [checkpoint loading]

  void prepare_module(const std::shared_ptr<nn::Module>& model);
  // Every prepared optimizer's Strategy::grads; `sharded` when any is.
  // `parts`: each gradient's StepGrads::parts entry (empty: all of it, weight 1).
  std::vector<Tensor> step_grads(bool& sharded, dist::ProcessGroupPtr* shard_group = nullptr,
                                 std::vector<std::vector<dist::StepGrads::Part>>* parts = nullptr);
  template <typename T>
  static constexpr bool is_model_ptr = requires(const T& t) {
    requires std::is_base_of_v<nn::Module, typename T::element_type>;
  };
  template <typename T>
  void prepare_if_model(const T& obj) {
    if constexpr (is_model_ptr<std::decay_t<T>>) prepare_model(obj);
  }
  template <typename T>
  auto prepare_rest(T&& obj) {
    if constexpr (is_model_ptr<std::decay_t<T>>) {
      return std::decay_t<T>(obj);  // prepared by prepare_if_model
    } else {
      return prepare_one(std::forward<T>(obj));
    }
  }
  template <typename M>
  std::shared_ptr<M> prepare_one(
      std::shared_ptr<M> model) requires std::is_base_of_v<nn::Module, M> {
    return prepare_model(std::move(model));
  }
  template <typename O>
  std::shared_ptr<AcceleratedOptimizer> prepare_one(
      std::shared_ptr<O> opt) requires std::is_base_of_v<optim::Optimizer, O> {
    return prepare_optimizer(std::move(opt));
  }
  template <typename S>
  std::shared_ptr<AcceleratedScheduler> prepare_one(
      std::shared_ptr<S> s) requires std::is_base_of_v<optim::LRScheduler, S> {
    return prepare_scheduler(std::move(s));
  }
  std::shared_ptr<data::DataLoader> prepare_one(std::shared_ptr<data::DataLoader> l) {
    return prepare_data_loader(std::move(l));
  }
  std::vector<Tensor> model_params() const;
  bool at_end_of_loader() const;
  // Tells the strategy whether a backward now syncs (sync step outside no_sync).
  void update_sync();
  // The ranks whose `failed` is true (collective; every rank gets the same list).
  std::vector<int> agree_failed(bool failed);
  // Note [plain backward]: ValueError when gradients came from a plain loss.backward() while
  // this accelerator scales the loss (`op` names the call that found out).
  void check_plain_backward(const char* op) const;
  Tensor gather_rows(const Tensor& t, int64_t keep_rows);

  AcceleratorConfig config_;
  Device device_ = kCPU;
  DistributedType distributed_type_ = DistributedType::No;
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_world_size_ = 1;
  dist::ProcessGroupPtr group_;
  bool owns_group_ = false;
  std::unique_ptr<dist::DeviceMesh> mesh_;

  size_t model_index(const nn::Module& model, const char* op) const;
  std::unique_ptr<dist::Strategy> strategy_;
  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers_;
  std::vector<std::shared_ptr<data::DataLoader>> loaders_;
  std::vector<std::shared_ptr<AcceleratedScheduler>> schedulers_;
  struct Custom {
    std::string name;
    SaveFn save;
    LoadFn load;
  };
  std::vector<Custom> customs_;

  dist::GradScaler scaler_;
  // Set by the parameters' gradient hooks: gradients arrived outside Accelerator::backward.
  struct BackwardFlags {
    bool in_accelerator_backward = false;
    bool plain_backward = false;
  };
  std::shared_ptr<BackwardFlags> backward_flags_ = std::make_shared<BackwardFlags>();
  bool sync_gradients_ = true;
  bool no_sync_ = false;
  int64_t step_ = 0;
  int64_t optimizer_steps_ = 0;
  int64_t save_iteration_ = 0;

  std::string logging_dir_;
  std::vector<dist::TrackerPtr> trackers_;
  bool trackers_ready_ = false;
};

template <typename T>
std::vector<T> Accelerator::split_between_processes(const std::vector<T>& items,
                                                    bool apply_padding) const {
  const int64_t n = int64_t(items.size()), w = world_size_, r = rank_;
  const int64_t base = n / w, extra = n % w;
  const int64_t begin = r * base + std::min(r, extra);
  const int64_t len = base + (r < extra ? 1 : 0);
  std::vector<T> out(items.begin() + begin, items.begin() + begin + len);
  if (apply_padding) {
    const int64_t want = base + (extra ? 1 : 0);
    while (int64_t(out.size()) < want && !items.empty())
      out.push_back(out.empty() ? items.back() : out.back());
  }
  return out;
}

}  // namespace accel
