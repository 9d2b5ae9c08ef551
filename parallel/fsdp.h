// ZeRO-3 the way PyTorch FSDP does it: a model's trainable parameters are sharded per wrapping
// unit; a unit's full parameters exist only around its forward and its backward.
//
//   auto model = std::make_shared<Gpt>(cfg);              // or built under nn::DeferredInit
//   dist::FullyShardedModel fsdp(model, pg);              // every block of a ModuleList a unit
//   optim::AdamW opt(fsdp.shard_param_groups(groups...)); // steps this rank's slices
//   for (...) {
//     Tensor loss = lm_loss(fsdp.forward(x), y);          // or fsdp(x); units gather / free
//     loss.backward();                                    // reduce-scatter per unit, overlapped
//     opt.step();
//     opt.zero_grad();
//   }
//
// Note [fsdp without its step calls]
// The loop above is torch's FSDP loop; the explicit calls of the split step are optional:
//  - prepare_step() (point the shard leaves' .grad at the gradient shards) runs at the end of
//    every synced backward; opt.zero_grad() (.grad set to None, or zeroed) is honoured by the
//    next synced backward, which then starts the shards from zero instead of adding to them.
//  - after_step() (re-gather the root unit from its updated shard) is done by the next
//    forward() when the root's shard changed on any rank (one all-reduce of a flag per
//    forward, then the gather). A model called directly (model->forward(x), (*model)(x))
//    after a step skips that: its next backward raises DistError on every rank naming the
//    model, forward() and after_step() (agreed by the same all-reduce; a backward right after
//    a re-gather checks nothing, so the Accelerator, which calls after_step, pays it only on
//    the micro-batches of an accumulation window after the first). A direct call that is not
//    differentiated (evaluation under NoGradGuard) is not checked: evaluate through forward().
//    Between steps calling the model directly is harmless: the units gather themselves.
//
// Note [unit lifecycle]
// Units: by default every entry of an nn::ModuleList or nn::Sequential that has trainable
// parameters (outermost first: a unit's descendants are not units); FsdpOptions::wrap picks by
// class name or parameter count instead. Only container entries can be units: the unit wraps
// its module's calls (a call wrapper, Note [module calls] in nn/module.h: any
// arguments and results, operator(), call<R>() and the typed operator() of an
// nn::TypedModule) and the entry, so the parent's direct ->forward(x) calls go through it too
// (Note [entry wrappers] in nn/container.h). The parameters of no unit form the root
// unit, and so does a parameter tied across units (Note [tied parameters] in
// nn/module.cc: used by two units, or by a unit and a module outside every unit): the
// root stays gathered, so every use sees the same values, and its gradient (the sum of all
// uses) is reduced once, at the end of backward.
// Each unit keeps one flat buffer of its parameters (model order, padded to a multiple of the
// world size N); rank r owns slice r of it (`shard`, persistent, the master copy the optimizer
// updates). The module's parameters are views into the flat `full` buffer, whose storage is
// released (core/storage.h Note [released storage]) whenever the unit is resharded, so every
// handle, including the copies autograd saved for backward, stays valid and costs nothing.
//  - forward: the unit's call wrapper all-gathers `full` (or waits for the prefetched gather),
//    starts the gather of the unit that ran next in the previous forward, runs the module (under
//    autograd::checkpoint with activation_checkpointing: the tensor arguments are the
//    checkpoint's inputs, the plain ones are captured), registers a gradient hook on every
//    output tensor that requires grad, and releases `full`.
//  - backward: the output's gradient hook gathers the unit again (prefetching the unit whose
//    backward comes next); once every parameter of the unit has accumulated its gradient the
//    gradients are copied into a staging buffer, reduce-scattered asynchronously into this
//    rank's gradient shard, freed, and `full` is released.
//  - between steps a rank holds its parameter, gradient and optimizer shards, plus the root
//    unit in full: the root is not released, because the model's own forward (which uses it
//    first) cannot be hooked. It is refreshed by an all-gather after each optimizer step.
//  - backward(loss, sync = false) (accumulation, no_sync) keeps the full gradients of the
//    window in the parameters' .grad, as FSDP's no_sync does (memory of one unsharded gradient
//    set), and reduces them on the next synced backward.
// A parameter read outside its unit's forward/backward (a module held in a typed member that
// policy made a unit, or user code between steps) is a released storage: ValueError, not garbage.
// Use full_state_dict()/for_each_full_parameter() to read the whole model.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "comm/process_group.h"

namespace accel::dist {

struct FsdpOptions {
  enum class Wrap : uint8_t {
    Entries,    // every ModuleList / Sequential entry with trainable parameters
    Classes,    // entries whose Module::type_name() is in `classes`
    MinParams,  // entries with at least `min_params` trainable parameters
    None,       // no units: the whole model is the root unit
  };
  Wrap wrap = Wrap::Entries;
  std::vector<std::string> classes;
  int64_t min_params = int64_t(1) << 20;
  bool reshard_after_forward = true;
  bool prefetch = true;                   // gather the next unit while this one computes
  bool activation_checkpointing = false;  // recompute each unit's forward in its backward
  // Compute dtype of gathered parameters (kBFloat16 / kFloat16); master shards, gradients shards
  // and optimizer state keep the parameters' own dtype. nullopt: the parameters' dtype.
  std::optional<DType> param_dtype;
  bool reduce_in_fp32 = false;  // with param_dtype: reduce-scatter gradients in the master dtype
  bool find_unused_parameters = false;
  int root = 0;  // whose initial parameters every rank starts from (a rank of the shard group)
  // HSDP (Note [hsdp] in parallel/hsdp.h): the group this rank's shard is replicated
  // across, the ranks holding the same shard coordinate in the other replicas (the mesh's
  // dp_replicate group). Units are sharded over the model's group and each reduced gradient
  // shard is then averaged across this one; every rank starts from the values of `root` of
  // replica 0. Null (or a group of one): plain FSDP.
  ProcessGroupPtr replicate;
};

struct FsdpMemory {
  int64_t shard_bytes = 0;           // master parameter shards
  int64_t grad_shard_bytes = 0;      // reduced gradient shards
  int64_t gathered_bytes = 0;        // unit parameters materialised right now (root included)
  int64_t full_param_bytes = 0;      // one unsharded replica of the trainable parameters
  int64_t unsharded_grad_bytes = 0;  // full gradients held in .grad (no_sync windows)
};

class FullyShardedModel {
 public:
  FullyShardedModel(std::shared_ptr<nn::Module> model, ProcessGroupPtr pg = nullptr,
                    FsdpOptions options = {});
  ~FullyShardedModel();
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  struct UnitInfo {
    std::string name;  // module path ("" for the root unit)
    std::string type;
    int64_t numel = 0;  // trainable parameter elements
  };
  std::vector<UnitInfo> units() const;  // root first, then module order

  // One leaf per trainable parameter (model order): a 1-D view of this rank's slice of it (empty
  // when the slice holds none of it). What the optimizer steps; `shard_param_groups` maps an
  // optimizer's groups (over the model's parameters) to groups over these.
  const std::vector<Tensor>& shard_params() const { return shard_leaves_; }
  std::vector<optim::ParamGroup> shard_param_groups(const std::vector<optim::ParamGroup>& groups,
                                                    const char* op = "fsdp") const;
  // Which elements of each parameter this rank holds: [lo, hi) of the flattened parameter.
  struct Span {
    std::string name;
    Shape shape;
    int64_t lo = 0, hi = 0;
  };
  // Those of another rank (rank < 0: this one); they depend only on the model and the world size.
  std::vector<Span> spans(int rank = -1) const;
  const nn::Named<Tensor>& parameters() const { return params_; }

  // Calls the model (its hooks run) after re-gathering the root unit when an optimizer step
  // changed its shard (Note [fsdp without its step calls]): fsdp.forward(x) for one tensor,
  // fsdp.forward<R>(args...) for any signature and result type (Note [module calls] in
  // nn/module.h). Collective.
  template <typename R = Tensor, typename... A>
  R forward(const A&... args) {
    std::vector<Tensor> out = forward_values(nn::call_detail::pack(args...));
    return nn::call_detail::unflatten<R>(std::move(out), [this] { return model_->call_name(); });
  }
  template <typename R = Tensor, typename... A>
  R operator()(const A&... args) {
    return forward<R>(args...);
  }
  // The type-erased form of forward.
  std::vector<Tensor> forward_values(nn::Values inputs);

  // loss.backward() with the per-unit reduce-scatters (sync) or local accumulation (no sync);
  // returns once the gradient shards are complete. Collective when sync.
  void backward(const Tensor& loss, bool sync = true);
  // A plain loss.backward() through the model works too: the first gradient hook of a backward
  // that was not begun explicitly begins one with this setting (default true: sync), and an
  // end-of-backward callback ends it (Note [end-of-backward callbacks] in autograd/engine.h).
  void set_auto_sync(bool sync) { auto_sync_ = sync; }
  // The same in two halves around your own loss.backward() (several models in one backward);
  // end_backward keeps `err` (the backward's exception) or stores its own.
  void begin_backward(bool sync);
  void end_backward(std::exception_ptr& err);
  // Points the shard leaves' .grad at the gradient shards (undefined before any synced backward).
  // Done at the end of every synced backward (Note [fsdp without its step calls]).
  void prepare_step();
  // After the optimizer updated the shards: re-gathers the root unit (forward() does it when
  // needed, Note [fsdp without its step calls]).
  void after_step();
  // After the shards were written: all-gathers the root unit's parameters from them and releases
  // any other unit still gathered.
  void refresh_root();
  void zero_grad();
  bool has_grads() const { return grads_valid_; }

  // Gathers every unit, one at a time, calling fn(name, full parameter) for each of its
  // parameters (model order), then releases it. Collective.
  void for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn);
  // (name, shape, master dtype) in the order for_each_full_parameter visits them.
  struct ParamEntry {
    std::string name;
    Shape shape;
    DType dtype = kFloat32;
  };
  std::vector<ParamEntry> full_parameter_order() const;
  // The whole model's state (parameters cloned, buffers shared). Collective; holds it all.
  io::TensorDict full_state_dict();
  // Loads full values into this rank's shards (every rank passes the same dict; only its slices
  // are read), then refreshes the root. Throws ValueError for missing / mis-shaped entries.
  void load_full_parameters(const std::function<Tensor(const std::string&)>& value_of);

  FsdpMemory memory() const;
  const FsdpOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *pg_; }
  // The replicate group of HSDP (null without one).
  const ProcessGroupPtr& replicate_group() const { return options_.replicate; }

  struct Unit;

 private:
  void build_units();
  void init_values();
  // Note [deferred regions] in parallel/materialize.cc. UnitIndex: each trainable parameter's unit
  // and its index there.
  using UnitIndex = std::unordered_map<const TensorImpl*, std::pair<const Unit*, size_t>>;
  void init_eager_unit(Unit& u);
  void init_deferred_unit(Unit& u, const UnitIndex& where);
  void materialize_unit_modules(Unit& u, const UnitIndex& where);
  void gather(Unit& u, bool wait);
  void wait_gather(Unit& u);
  void release(Unit& u);
  std::vector<Tensor> unit_call(Unit& u, nn::Values& in, const nn::CallFn& call);
  std::vector<Tensor> checkpoint_call(nn::Values& in, const nn::CallFn& call);
  void on_output_grad(Unit& u);
  void on_param_grad(Unit& u, size_t j);
  void issue_reduce(Unit& u);
  void finish_backward(bool sync, std::exception_ptr& err);
  void drain_reduces(size_t keep);
  void take_optimizer_grads();
  bool root_stale_anywhere();
  void check_root_fresh();

  std::shared_ptr<nn::Module> model_;
  ProcessGroupPtr pg_;
  FsdpOptions options_;
  nn::Named<Tensor> params_;  // trainable, model order
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::pair<nn::Module*, int>> module_units_;  // every module and its unit
  std::vector<Tensor> shard_leaves_;
  std::vector<Tensor> grad_views_;  // per parameter: its slice of the unit's gradient shard
  std::vector<Unit*> fwd_order_, last_fwd_order_, bwd_order_;
  std::deque<Unit*> reduce_order_;  // reduce-scatters in flight, oldest first
  void begin_backward_from_hook();
  bool in_backward_ = false, sync_ = true, grads_valid_ = false, auto_sync_ = true;
  // Note [fsdp without its step calls]: the root shard's version when the root was last
  // gathered, and whether no backward began since (then no step can have changed it).
  uint32_t root_version_ = 0;
  bool root_fresh_ = true;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace accel::dist
