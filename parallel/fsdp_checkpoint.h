// Sharded checkpoints of ZeRO-3 units (parallel/fsdp.h): each rank writes its own slices, nobody
// gathers the model; a reader re-assembles any range of any parameter from the ranks that hold
// it, so a checkpoint loads into another world size, into one process, or into another strategy.
//
// Note [fsdp checkpoints]
// Per prepared model i and rank r (indexed(): no suffix for i = 0):
//   fsdp_model[_i]_rank<r>.safetensors      trainable parameter name -> this rank's slice
//                                           [lo, hi) of the flattened parameter (1-D; absent
//                                           when the slice is empty)
//   fsdp_optimizer[_i]_rank<r>.safetensors  the stepping optimizer's state_dict: state.<k>.<slot>
//                                           is the slice of parameter k's slot, state.<k>.step
// and state.json records (save_fsdp_state's return value):
//   {"kind": "fsdp", "world": W,
//    "models": [{"params": [{"name", "shape", "spans": [[lo, hi] per rank]}]}],
//    "optimizers": [{"params": ["<model>:<name>" per stepping parameter k]}]}
// Spans depend only on the model and W (Note [unit lifecycle]); the reader trusts no file: every
// slice it reads is checked against the recorded span (IoError naming the file otherwise).
// Buffers and frozen parameters are replicated: the strategy writes them like a plain model.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/module.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "parallel/checkpoint_records.h"
#include "parallel/fsdp.h"

namespace accel::dist {

std::string fsdp_model_file(size_t model, int rank);
std::string fsdp_optimizer_file(size_t opt, int rank);

// A stepping optimizer over shard leaves, with "<model>:<name>" of each of its parameters.
struct FsdpOptimizerRef {
  const optim::Optimizer* stepping = nullptr;
  std::vector<std::string> param_keys;
};

// Writes this rank's files into `dir` (unless `write` is false: an HSDP replica other than the
// first, whose shards equal replica 0's); returns the state.json record (the same on every rank).
// HSDP (Note [hsdp checkpoints] in accelerate/strategy_fsdp.cc): the record's "world" is the shard
// group's size and "replicate" the number of replicas, world x replicate being state.json's
// world_size.
nlohmann::json save_fsdp_state(const std::string& dir,
                               const std::vector<FullyShardedModel*>& models,
                               const std::vector<FsdpOptimizerRef>& optimizers, bool write = true);

// Reads a ZeRO-3 checkpoint by ranges: the record is parsed and checked first (Note [checkpoint
// record validation] in parallel/checkpoint_records.h), shard files are opened on first use and
// only their headers are read; a range of a parameter (or of an optimizer slot) is read with pread
// from exactly the ranks whose spans overlap it, straight into the destination (Note [reading
// parts of a safetensors file]). Each slice is checked against its span (numel, floating dtype)
// before it is read.
class FsdpCheckpointReader {
 public:
  // `saved_world`: state.json's world_size (the record's world x replicate must equal it), or -1
  // when unknown.
  FsdpCheckpointReader(std::string dir, const nlohmann::json& record, int saved_world = -1);
  ~FsdpCheckpointReader();
  int world() const { return int(rec_.world); }
  size_t num_models() const { return rec_.models.size(); }
  size_t num_optimizers() const { return rec_.optimizers.size(); }
  // Trainable parameters of model i in the saved order, and their shapes.
  std::vector<std::string> param_names(size_t model) const;
  bool has_param(size_t model, const std::string& name) const;
  Shape shape(size_t model, const std::string& name) const;
  // dst (contiguous, hi - lo elements, any dtype / device: converted) := elements [lo, hi) of
  // the flattened parameter, from the ranks holding them.
  void read_param(size_t model, const std::string& name, int64_t lo, int64_t hi, const Tensor& dst);
  // The same into a new 1-D CPU tensor of the saved dtype; and the whole parameter in its shape.
  Tensor param_range(size_t model, const std::string& name, int64_t lo, int64_t hi);
  Tensor full_param(size_t model, const std::string& name);
  // Optimizer i: keys ("<model>:<name>") in its parameter order.
  const std::vector<std::string>& optimizer_keys(size_t opt) const;
  // Slot names with state for `key` (empty: never stepped) and its step count, from the file of
  // a rank holding element `near` of the parameter (or the first rank holding any).
  std::vector<std::string> slots(size_t opt, const std::string& key, int64_t near = -1);
  int64_t step(size_t opt, const std::string& key, int64_t near = -1);
  void read_slot(size_t opt, const std::string& key, const std::string& slot, int64_t lo,
                 int64_t hi, const Tensor& dst);
  Tensor slot_range(size_t opt, const std::string& key, const std::string& slot, int64_t lo,
                    int64_t hi);
  // "param_groups.*" of the saved optimizer (rank 0's file).
  io::TensorDict param_groups(size_t opt);

 private:
  struct Key {
    size_t model = 0;
    std::string name;
    size_t index = 0;  // position in the optimizer
  };
  const ckpt_records::FsdpParamRecord& param(size_t model, const std::string& name) const;
  const Key& key(size_t opt, const std::string& k) const;
  const io::SafetensorsFile& file(const std::string& name);
  // The rank whose span of `p` holds element `near` (or the first with a non-empty span); -1 if
  // no rank holds any element.
  int holder(const ckpt_records::FsdpParamRecord& p, int64_t near) const;
  // dst := [lo, hi) of a per-rank sliced tensor whose rank-q file entry is `entry`.
  void assemble(const ckpt_records::FsdpParamRecord& p, int64_t lo, int64_t hi,
                const std::function<std::string(int)>& file_of, const std::string& entry,
                const Tensor& dst);
  DType saved_dtype(const ckpt_records::FsdpParamRecord& p, int64_t lo,
                    const std::function<std::string(int)>& file_of, const std::string& entry);

  std::string dir_;
  ckpt_records::FsdpRecord rec_;
  std::vector<std::map<std::string, size_t>> index_;  // per model: name -> position
  std::vector<std::map<std::string, Key>> keys_;
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> files_;
};

// The state_dict an optimizer over this rank's shard leaves of `models` needs, from saved
// optimizer `opt`: `keys` names each of its parameters ("<model>:<name>"); `param_groups` are
// its own param_groups entries (the saved lr / weight decay replace theirs).
io::TensorDict fsdp_shard_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                          const std::vector<std::string>& keys,
                                          const std::vector<FullyShardedModel*>& models,
                                          const io::TensorDict& param_groups);
// The same for a plain optimizer over whole parameters `params` (one process, DDP, ZeRO-1/2
// loading a ZeRO-3 checkpoint): state.<k>.<slot> in the shape, dtype and device of params[k].
io::TensorDict fsdp_full_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                         const std::vector<std::string>& keys,
                                         const std::vector<Tensor>& params,
                                         const io::TensorDict& param_groups);

// A ZeRO-3 checkpoint read as a plain one (one process, DDP, ZeRO-1/2 loading it): each model's
// whole state_dict (sharded parameters assembled, the replicated ones from its model file) and
// each optimizer's per-parameter state, the optimizer's parameters being parameters of `models`.
struct PlainState {
  std::vector<io::TensorDict> models;
  std::vector<io::TensorDict> optimizers;
};
// Parameters are read in the dtype of the model's; `saved_world` is state.json's world_size.
PlainState read_fsdp_as_plain(const std::string& dir, const nlohmann::json& record, int saved_world,
                              const std::vector<std::shared_ptr<nn::Module>>& models,
                              const std::vector<const optim::Optimizer*>& optimizers);
// "model[_i].safetensors": the replicated part a ZeRO-3 checkpoint keeps whole.
std::string fsdp_replicated_file(size_t model);

}  // namespace accel::dist
