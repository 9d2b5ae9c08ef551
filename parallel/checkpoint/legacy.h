// The tensors of a format-1 checkpoint (what save_state wrote before format 2: state.json plus
// per-strategy files) as a CheckpointSource: the same piece tables a format-2 index holds, built
// from state.json's records and the files' headers, read-only (docs/checkpointing.md, "Format 1 as
// pieces"). Model tensors always; optimizer state with a LegacyContext (what the run loading the
// checkpoint prepared: plain optimizer files and ZeRO-1/2 buckets name no parameters).
//
//   // load_state (accelerate/accelerator_state.cc), once the folder holds state.json:
//   std::vector<const optim::Optimizer*> users;   // the prepared optimizers (the user's objects)
//   for (auto& o : optimizers_) users.push_back(&o->optimizer());
//   auto src = ckpt::open_legacy(dir, ckpt::legacy_context(models_, users,
//                                                           config_.ddp.bucket_cap_bytes));
//   const ckpt::TensorRecord& r = src->tensor(ckpt::names::optim_slot(0, 0, "head.weight",
//                                                                     "exp_avg"));
//   src->read(name, layout.region, dst);   // this rank's region, any layout; src->meta():
//   state.json
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/buckets.h"
#include "parallel/checkpoint/reader.h"

namespace accel::dist::ckpt {

// One parameter of an optimizer of the run that loads: its prepared model, its name there (the
// state-dict name; empty: a tensor of no prepared model, whose plain state is opaque) and its
// param group.
struct LegacyParam {
  size_t model = 0;
  std::string name;
  size_t group = 0;
};

// What the format-1 loaders took from the live run: per prepared optimizer (prepared order) its
// parameters in the optimizer's order (groups in order; parameter k is "state.<k>" of a plain
// optimizer file), and the bucket cap ZeRO-1/2 laid them out with (AcceleratorConfig::ddp; the
// save's and the load's are the same setting, as the old loader assumed).
struct LegacyContext {
  std::vector<std::vector<LegacyParam>> optimizers;
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
};

// The context of prepared `models` and `optimizers` (the user's optimizer objects: their
// parameters are the models' own, tp-local under tp, matched by identity; a tensor of no model
// gets an empty name).
LegacyContext legacy_context(const std::vector<std::shared_ptr<nn::Module>>& models,
                             const std::vector<const optim::Optimizer*>& optimizers,
                             size_t bucket_cap_bytes);

// Note [format-1 checkpoints as pieces]
// Format 1 keeps a model in one of these layouts (state.json's records say which):
//   plain (one process, DDP, ZeRO-1/2)  model[_i].safetensors: every entry whole, tied names
//                                       once with `alias -> kept` in __metadata__;
//   ZeRO-3 / HSDP ("fsdp" record)       fsdp_model[_i]_rank<s>.safetensors for the S shard ranks
//                                       (HSDP: replica 0's only): entry <name> is the 1-D span
//                                       [lo, hi) of the flattened parameter (the record's spans;
//                                       absent when empty), and model[_i].safetensors the
//                                       replicated part (buffers, frozen parameters), whole;
//   tp ("tp" record)                    tp<t>/ for t < T, each holding one of the above (the
//                                       "inner" record), the parameters of "models[i]" cut
//                                       {dim, chunks} over T (torch.chunk per block), the others
//                                       whole at every t (tp0's are read).
// and optimizer o (state_dict keys "state.<k>.<slot>", "state.<k>.step", "param_groups.<g>.*")
//   plain                               optimizer[_o].safetensors: the whole state, k being the
//                                       context's parameter k;
//   ZeRO-1/2 ("zero" record, per        zero_optimizer[_o]_rank<q>.safetensors for the Z ranks
//   optimizer [used, numel] per bucket) of a shard group (state.json's "zero_world", else its
//                                       world_size): "state.<b>.<slot>" is rank q's slice
//                                       [q n/Z, (q+1) n/Z) of bucket b's flat buffer of n
//                                       elements, "state.<b>.step" its step; which parameter lies
//                                       where in a bucket is assign_buckets over the context's
//                                       parameters (shapes and dtypes of the saved model), its
//                                       groups and bucket cap (checked against the record's
//                                       `used`; ValueError when they differ); optimizer[_o] holds
//                                       the param groups;
//   ZeRO-3 / HSDP                       fsdp_optimizer[_o]_rank<s>.safetensors: "state.<k>.<slot>"
//                                       the span of parameter k (the record's "optimizers[o]"
//                                       names it "<model>:<name>") like the model's, absent when
//                                       empty; the param groups in rank 0's;
//   tp                                  as above in each tp<t>/, the slots of a cut parameter cut
//                                       like it, steps and param groups from tp0.
// As pieces of global tensors (names.h): model.<i>.<name>; optim.<o>.<i>.<param>.<slot> of the
// parameter's global shape; optim.<o>.<i>.<param>.step (the entry's shape, one integer; ZeRO-1/2:
// the bucket's, equal on every rank of the bucket: checked, IoError otherwise);
// optim.<o>.param_groups.<g>.{lr,weight_decay,params}; optim.<o>.opaque.<key after "state."> for
// state that is not per model parameter (LBFGS's "state.lbfgs.*", a tensor of no prepared model:
// plain files only; refused under tp). A whole entry is Region::whole(shape), a span
// Region::whole(shape).flat(lo, hi) (a bucket slice: the span of each parameter it meets, read at
// its offset in the slice), and under tp both are prefixed with shard(dim, chunks, T, t) of the
// global shape (the tp-local shapes summed along dim, each checked against its part).
// Checks before anything is read (IoError naming the file and, where there is one, the tensor):
// state.json (read without following a link, at most kMaxIndexBytes) is a format-1 object whose
// records pass Note [checkpoint record validation] (parallel/checkpoint_records.h; the tp record
// with the same rules as the strategy's); no entry of the folder or of a tp<t>/ folder is a link,
// the only folders are tp<t>/ of a tp checkpoint and hold regular files only; every data file is
// opened without following a link and its header checked (a truncated file is refused naming it);
// each piece's entry has the dtype of the tensor's other pieces and its region's local shape (a
// bucket slice: n/Z elements), optimizer slots are floating, steps one integer; no tensor comes
// from two places; every rank of a ZeRO bucket or ZeRO-3 span has the same slots. Tied aliases:
// meta()["aliases"] ({"model.0.head.weight": "model.0.embed.weight"}), from the files' metadata
// and state.json's "aliases" record (written since ZeRO-3 files keep no names of tied
// parameters). Pieces carry no CRCs (format 1 has none); read() checks coverage and each entry as
// the format-2 reader does. Saved inside an accumulation window (sync_gradients false), each
// rank's gradients are per-rank tensors, whole (they resume on the same mesh only), named by
// world rank r (a tp folder's rank d is r = d T + t: tp is the mesh's innermost dimension):
// grads[_i]_rank<d> / fsdp_grads[_i]_rank<d> entry <name> -> grad.<i>.<name>.rank<r>,
// zero_grads[_o]_rank<d> entry bucket.<b> -> grad.accum.<o>.<b>.rank<r> (names.h). The rest of
// state.json (scheduler files, loader positions, RNG, counters) is not pieces here (meta() holds
// state.json as it is).
std::unique_ptr<CheckpointSource> open_legacy(const std::string& dir);  // model tensors only
std::unique_ptr<CheckpointSource> open_legacy(const std::string& dir, const LegacyContext& ctx);

}  // namespace accel::dist::ckpt
