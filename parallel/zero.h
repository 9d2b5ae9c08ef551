// ZeRO data parallelism: optimizer state (stage 1), + gradients (stage 2) sharded across the
// ranks of a group. ZeRO-3 (parameters sharded too) is FullyShardedModel (parallel/fsdp.h), the
// one engine for it.
//
//   dist::ZeroOptions zo;
//   zo.stage = 2;
//   dist::ZeroOptimizer zero(model, [](std::vector<Tensor> shards) {
//     return std::make_unique<optim::AdamW>(std::move(shards), optim::AdamWOptions{});
//   }, nullptr, zo);
//   for (...) {
//     Tensor loss = cross_entropy(zero.forward(x_local), y_local);
//     loss.backward();       // buckets reduced while backward runs, waited for at its end
//     zero.step();           // optimizer on this rank's shard, then parameters re-assembled
//     zero.zero_grad();
//   }
//
// zero.backward(loss) is loss.backward() that also syncs on a rank whose loss reached none of
// the parameters; finish_gradient_sync() is a no-op after a backward that synced itself (Note
// [sync at the end of backward] in parallel/buckets.cc). Calling the model directly instead of
// zero.forward() gives the same gradients (forward() only casts inputs under param_dtype).
// zero.step() is the step: optimizer().step() alone (the split step below) would step shards
// without gradients and leave the parameters as they were.
//
// Layout (Note [zero layout] in zero.cc): parameters are grouped into the same reverse-order
// buckets as DDP; each bucket is one flat buffer padded to a multiple of the world size, and
// rank r owns slice r of every bucket. The optimizer is built by the factory over one 1-D
// "shard parameter" per bucket (this rank's slice), so any elementwise optimizer (SGD, Adam,
// AdamW) works unchanged and gives the same update as on the full parameters.
// Parameter groups (the groups constructor): a bucket never mixes groups, and the optimizer gets
// one param group per given group holding that group's shards (optim::Optimizer::rebuild builds
// it with the source's per-group lr / weight decay), so decay / no-decay recipes work. Its
// parameter k is the shard of bucket shard_bucket(k) (groups in order, buckets in bucket order).
//
// Split step (what dist::ZeroStrategy uses): attach_gradients() points the shards' .grad at the
// reduced gradient shards and returns them (unscale / clip act on these), the caller steps
// optimizer() itself, then finish_step() re-assembles the parameters.
// - stage 1: gradients all-reduced (full copy per rank); each rank steps its slices, then the
//   buckets are all-gathered in place.
// - stage 2: gradients reduce-scattered: a rank keeps only its averaged slice; full-size
//   gradients live only while their bucket is in flight.
//
// Mixed precision (stages 1-2, ZeroOptions::param_dtype = kBFloat16 / kFloat16; Note [zero mixed
// precision] in zero.cc), as DeepSpeed's bf16 + ZeRO-1/2: the trainable parameters become views
// of per-bucket flat buffers in the compute dtype, so forward and backward run in it (feed inputs
// in that dtype or run under autocast; forward() casts them); the optimizer steps fp32 *master
// shards* (the parameters' original dtype, this rank's slice of every bucket only). Gradients
// arrive in the compute dtype and are reduced in it (stage 1 all-reduce, stage 2 reduce-scatter),
// or in fp32 with reduce_in_fp32; the averaged shard the optimizer, unscaling and clipping see is
// fp32 (gradient_shards()). finish_step() casts each rank's updated master slice to the compute
// dtype and all-gathers the buckets. Parameters must be fp32; frozen parameters and buffers are
// not ZeRO's: they keep their own dtype. use_master_parameters() points the parameters at the
// gathered fp32 masters for a while (checkpoints, state dicts: they save master weights, not
// rounded ones) and use_compute_parameters() points them back, optionally taking new values.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/buckets.h"
#include "comm/process_group.h"

namespace accel::dist {

struct ZeroOptions {
  int stage = 1;  // 1 or 2 (3: FullyShardedModel, parallel/fsdp.h)
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  bool find_unused_parameters = false;
  int root = 0;  // whose initial parameters every rank starts from
  // Stages 1-2 mixed precision: the model's parameters become this dtype (kBFloat16 / kFloat16)
  // for forward and backward, while the optimizer steps fp32 master shards (the parameters' own
  // dtype) and the updated shards are cast back and all-gathered. nullopt: no conversion.
  std::optional<DType> param_dtype;
  bool reduce_in_fp32 = false;  // with param_dtype: reduce gradients in the master dtype
  // HSDP (Note [hsdp] in parallel/hsdp.h): the group this rank's shard is replicated across (the
  // mesh's dp_replicate group); state is sharded over `pg` only, and the gradients reduced in
  // `pg` are then averaged across this group (stage 1: whole buckets; stage 2: this rank's
  // slices). Every rank starts from `root` of replica 0. Null (or a group of one): plain ZeRO.
  ProcessGroupPtr replicate;
};

using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> shard_params)>;
// One group per given parameter group, in order (each non-empty).
using GroupOptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup> shard_groups)>;

// Bytes this rank holds, between steps. `full_*` is what one unsharded replica would hold.
struct ZeroMemory {
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t master_param_bytes = 0;  // param_dtype: the fp32 master shards (part of param_bytes)
  int64_t full_param_bytes = 0;
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(NamedParams params, const OptimizerFactory& make_optimizer,
                ProcessGroupPtr pg = nullptr, ZeroOptions options = {});
  // Several parameter groups (each non-empty); the parameters are numbered across groups in
  // order, as an optimizer numbers them.
  ZeroOptimizer(std::vector<NamedParams> groups, const GroupOptimizerFactory& make_optimizer,
                ProcessGroupPtr pg = nullptr, ZeroOptions options = {});
  ZeroOptimizer(std::shared_ptr<nn::Module> module, const OptimizerFactory& make_optimizer,
                ProcessGroupPtr pg = nullptr, ZeroOptions options = {});
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Module form: calls the module (its hooks run), with
  // floating tensor arguments cast to param_dtype: zero.forward(x), or zero.forward<R>(args...)
  // for any signature and result type (Note [module calls] in nn/module.h).
  template <typename R = Tensor, typename... A>
  R forward(const A&... args) {
    std::vector<Tensor> out = forward_values(nn::call_detail::pack(args...));
    return nn::call_detail::unflatten<R>(std::move(out), [this] { return module_->call_name(); });
  }
  template <typename R = Tensor, typename... A>
  R operator()(const A&... args) {
    return forward<R>(args...);
  }
  // The type-erased form of forward.
  std::vector<Tensor> forward_values(nn::Values inputs);

  // loss.backward(); on a rank none of whose parameters got a gradient, the zero-filled
  // collectives its peers issued.
  void backward(const Tensor& loss);
  // Waits for the gradient collectives (with HSDP, then averages across the replicate group
  // unless set_replicate_sync(false)); a no-op after a backward that was finished at its end.
  void finish_gradient_sync();
  // HSDP (Note [hsdp] in parallel/hsdp.h): whether finish_gradient_sync() averages the reduced
  // gradients across the replicate group (default true). A caller that adds several micro-batches'
  // gradient shards up itself (the Accelerator's ZeRO strategy under accumulation) turns it off
  // and averages the window's sum once, with average_shards_across_replicas(): one replicate
  // all-reduce per optimizer step instead of one per micro-batch.
  void set_replicate_sync(bool on) { replicate_sync_ = on; }
  // gradient_shards() := their average over the replicate group (collective over it; no-op
  // without HSDP).
  void average_shards_across_replicas();
  // Steps this rank's shards, then all-gathers the updated parameters:
  // attach_gradients(), optimizer().step(), finish_step().
  void step();
  void zero_grad();

  // The shard parameters (one 1-D leaf per bucket, bucket order) with .grad set to this rank's
  // averaged gradient slice of each bucket (persistent tensors: stage 1 a view of the
  // all-reduced buffer, stage 2 the reduce-scatter output).
  std::vector<Tensor> attach_gradients();
  // The gradient slices attach_gradients() points at, bucket order.
  std::vector<Tensor> gradient_shards() const;
  // After optimizer().step(): drops the shards' .grad and all-gathers the updated
  // slices into the parameters. `stepped` false skips the all-gather (nothing changed).
  void finish_step(bool stepped = true);
  // The optimizer's state_dict with its state keyed by bucket ("state.<b>.*"), and the reverse:
  // what a ZeRO shard holds (checkpoints: Note [zero pieces] in accelerate/strategy_pieces.cc).
  io::TensorDict shard_state_dict() const;
  void load_shard_state_dict(const io::TensorDict& by_bucket);
  // The same, handing the tensors to the optimizer without a copy where it can take them as they
  // are (optim::Optimizer::load_state_dict(TensorDict&&)).
  void load_shard_state_dict(io::TensorDict&& by_bucket);

  // ---- mixed precision (param_dtype; stages 1-2) ----
  bool mixed_precision() const { return options_.param_dtype.has_value(); }
  // This rank's fp32 master slice of every bucket (bucket order); empty without param_dtype.
  const std::vector<Tensor>& master_shards() const { return master_; }
  // Collective: all-gathers the master shards into full fp32 buffers and points the parameters
  // at them (they read and load as fp32 master weights). No-op without param_dtype.
  void use_master_parameters();
  // Points the parameters back at the compute-dtype buffers. `take_values`: the values now in the
  // (master) parameters, e.g. a loaded checkpoint, become the master weights and are cast into
  // the compute buffers (every rank must hold the same values; no communication).
  void use_compute_parameters(bool take_values);
  bool master_parameters_in_use() const { return !master_full_.empty(); }

  ZeroMemory memory() const;
  optim::Optimizer& optimizer() { return *optimizer_; }
  const std::shared_ptr<optim::Optimizer>& shared_optimizer() const { return optimizer_; }
  int stage() const { return options_.stage; }
  const std::vector<Bucket>& buckets() const { return bucketer_->buckets(); }
  const NamedParams& params() const { return bucketer_->params(); }
  const std::vector<Tensor>& shard_params() const { return shards_; }
  size_t num_groups() const { return num_groups_; }
  // The group of parameter i (numbered across groups), of bucket b.
  size_t param_group(size_t i) const { return group_of_[i]; }
  size_t bucket_group(size_t b) const;
  // Optimizer parameter k is the shard of this bucket; and the reverse.
  size_t shard_bucket(size_t k) const { return opt_to_bucket_[k]; }
  size_t shard_index(size_t b) const { return bucket_to_opt_[b]; }
  const SyncStats& last_stats() const { return bucketer_->last_stats(); }

 private:
  void init(const GroupOptimizerFactory& make_optimizer, const std::vector<Tensor>& masters);
  void sync_gradients();  // what finish_gradient_sync() does, unconditionally
  Tensor reduced_slice(size_t b) const;
  void point_params_at(const std::vector<Tensor>& flats);

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr pg_;
  ZeroOptions options_;
  std::unique_ptr<GradBucketer> bucketer_;
  std::vector<Tensor> flat_;    // full flat parameters per bucket
  std::vector<Tensor> shards_;  // what the optimizer steps: one 1-D leaf per bucket
  std::vector<Shape> shapes_;   // parameter shapes
  // param_dtype (Note [zero mixed precision]): flat_ holds the compute dtype.
  DType master_dtype_ = kFloat32;
  std::vector<Tensor> master_;       // fp32 master slice per bucket (what the optimizer steps)
  std::vector<Tensor> master_grad_;  // fp32 gradient slice per bucket when reduced in 16 bits
  std::vector<Tensor> master_full_;  // gathered masters while use_master_parameters() holds
  size_t num_groups_ = 1;
  std::vector<size_t> group_of_;       // per parameter
  std::vector<size_t> opt_to_bucket_;  // optimizer parameter k -> bucket
  std::vector<size_t> bucket_to_opt_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  bool replicate_sync_ = true;
};

}  // namespace accel::dist
