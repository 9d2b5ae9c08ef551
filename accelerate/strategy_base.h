// The part of dist::Strategy that NoStrategy, DdpStrategy and ZeroStrategy share (and a strategy
// of a program's own may derive from: tests/accelerate/test_strategy_seam.cc): the prepared
// models and optimizers, and checkpoints of full (replicated) models with either plain or ZeRO
// optimizer state. Internal to accelerate/strategy*.cc.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accelerate/strategy.h"
#include "parallel/zero.h"

namespace accel::dist {

// a <-> b elementwise (same shape and dtype), through a buffer of at most 64k elements when both
// are contiguous: how a load replaces values and keeps the old ones for its rollback.
void swap_values(const Tensor& a, const Tensor& b);
// The dtype a checkpoint tensor stored as `saved` is read in for a live tensor of `live`: the
// live one unless that would lose precision.
DType load_dtype(DType saved, DType live);
// Hands cached allocator blocks and freed heap back to the system (after a load).
void release_unused_memory();
// dst := elements [lo, hi) of `name` in `src` (dst may be non-contiguous: through a temporary).
void read_into(const io::SafetensorsCheckpoint& src, const std::string& name, int64_t lo,
               int64_t hi, const Tensor& dst);

// ---- format-2 pieces (Note [format-2 strategy seam] in accelerate/strategy.h;
// accelerate/strategy_pieces.cc) ----
// A fresh tensor of `region.local_shape()` in `dtype` on `device` holding `name`'s elements of
// `region` from `src`; ValueError naming the tensor when the checkpoint's global shape is not
// the region's (another model), IoError from the reader.
Tensor read_region(ckpt::CheckpointSource& src, const std::string& name, const Region& region,
                   DType dtype, Device device);
// Before a model's tensors are read: ValueError listing every (name, global shape) of `want`
// whose checkpoint tensor "model.<model>.<name>" has another shape (another model).
void check_model_shapes(const ckpt::CheckpointSource& src, size_t model,
                        const std::vector<std::pair<std::string, Shape>>& want);
// A whole tensor as saved (its dtype and shape).
Tensor read_whole(ckpt::CheckpointSource& src, const std::string& name);
// The entries of an optimizer state dict that are not per-parameter state ("param_groups.*"):
// "optim.<o>.<key>", whole, written by `primary`; without the group lists
// ("param_groups.<g>.params") unless `group_lists` (a pipeline stage's optimizer indexes only
// its own parameters: StrategyCheckpoint::pipelined).
void optimizer_meta_entries(std::vector<ckpt::StateEntry>& out, size_t o,
                            const io::TensorDict& state, bool primary, bool group_lists = true);
// "param_groups.<g>.params"
bool is_group_list(const std::string& key);
// Puts `opt`'s own group lists into `meta` (read_optimizer_meta's) when the checkpoint has none
// (a pipelined run saved it) or this run is `pipelined`; the state is matched by names.
void own_group_lists(io::TensorDict& meta, const optim::Optimizer& opt, bool pipelined);
// Their values back ("param_groups.*" -> tensor as saved).
io::TensorDict read_optimizer_meta(ckpt::CheckpointSource& src, size_t o);
// Per-rank tensors (window gradients): "<base>.rank<r>", whole (the local shape).
std::string rank_name(const std::string& base, int world_rank);
// The slots saved for a parameter: slot name -> global tensor name ("exp_avg", "step", ...).
std::map<std::string, std::string> saved_slots(const ckpt::CheckpointSource& src, size_t o,
                                               size_t model, const std::string& param);

// StepGrads::names: each of `params` named by `name_of` (a tensor's impl -> "<model>:<name>"),
// or none at all when one of them has no name (ZeRO-1/2's bucket shards).
std::vector<std::string> name_grads(const std::vector<Tensor>& params,
                                    const std::map<const void*, std::string>& name_of);

// What a load replaces (Note [replicated loading memory] in accelerate/strategy.cc); after
// apply_state it holds the replaced state.
struct ReplicatedState : StrategyState {
  std::vector<io::TensorDict> models;      // full state dicts
  std::vector<io::TensorDict> optimizers;  // the user's optimizer (under ZeRO: param groups)
  std::vector<io::TensorDict> shards;      // under ZeRO: shard state keyed by bucket
  std::vector<std::vector<Tensor>> accum;  // ZeRO-2: accumulated gradient shards
  std::vector<std::vector<std::pair<Tensor, Tensor>>> grads;  // per model: (param, grad)
  bool has_grads = false;  // grads replace the parameters' gradients (else: none)
};

class ReplicatedStrategy : public Strategy, public StrategyCheckpoint {
 public:
  explicit ReplicatedStrategy(const StrategyContext& ctx);
  ~ReplicatedStrategy() override;

  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override;
  StepGrads grads(const optim::Optimizer& stepping) override;
  void zero_grad(optim::Optimizer& stepping, bool set_to_none) override;
  StrategyMemory memory() const override;
  StrategyCheckpoint& checkpoint() override { return *this; }

  void apply_state(StrategyState& state) override;
  void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank) override;
  std::unique_ptr<StrategyState> read_pieces(ckpt::CheckpointSource& src, bool mid_window,
                                             int world_rank) override;
  void save_model(size_t index, const std::string& path) override;
  io::TensorDict full_state_dict(size_t index) override;
  void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                  std::exception_ptr& err) override;

 protected:
  struct Slot {
    std::shared_ptr<optim::Optimizer> user;
    std::shared_ptr<optim::Optimizer> stepping;  // == user without ZeRO
    std::unique_ptr<ZeroOptimizer> zero;
    std::vector<Tensor> accum;  // ZeRO-2: earlier micro-batches of the window
    std::shared_ptr<bool> touched = std::make_shared<bool>(false);
  };
  Slot& slot_of(const optim::Optimizer& stepping);
  // This rank's rank in the group ZeRO shards over (the world's without a mesh group).
  int shard_rank() const { return ctx_.shard_group() ? ctx_.shard_group()->rank() : ctx_.rank; }
  // Rank 0's value of t on every rank (t may be a non-contiguous view).
  void broadcast_in_place(const Tensor& t) const;
  // Frozen parameters (and, when `buffers`, the buffers) from rank 0.
  void broadcast_frozen(const nn::Module& model, bool buffers) const;

  StrategyContext ctx_;
  std::vector<std::shared_ptr<nn::Module>> models_;
  // Parameter impl -> "<model>:<name>" for grads(), built once the models are all prepared
  // (rebuilt when another is prepared).
  std::map<const void*, std::string> grad_names_;
  size_t grad_names_models_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace accel::dist
