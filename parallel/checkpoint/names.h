// The global names of a format-2 checkpoint's tensors (docs/checkpointing.md; one place, so the
// format-2 writer, its loaders and the format-1 source name a tensor alike).
//
//   ckpt::names::model(0, "blocks.0.attn.qkv.weight")        "model.0.blocks.0.attn.qkv.weight"
//   ckpt::names::optim_slot(0, 0, "lm_head.weight", "exp_avg") "optim.0.0.lm_head.weight.exp_avg"
#pragma once

#include <cstddef>
#include <string>

namespace accel::dist::ckpt::names {

// A parameter or persistent buffer of prepared model `model` (its state-dict name).
inline std::string model(size_t model, const std::string& name) {
  return "model." + std::to_string(model) + "." + name;
}

// Slot `slot` ("exp_avg", "momentum_buffer", ...) of optimizer `optim` for parameter `param` of
// prepared model `model`: placed like the region of that parameter the stepping rank holds.
inline std::string optim_slot(size_t optim, size_t model, const std::string& param,
                              const std::string& slot) {
  return "optim." + std::to_string(optim) + "." + std::to_string(model) + "." + param + "." + slot;
}

// The optimizer's step count for that parameter (0-dim; ZeRO-1/2: the bucket's, one per parameter
// of the bucket, equal by construction).
inline std::string optim_step(size_t optim, size_t model, const std::string& param) {
  return optim_slot(optim, model, param, "step");
}

// Entry `key` of optimizer `optim`'s param groups as its state_dict names it
// ("param_groups.<g>.lr", ".weight_decay", ".params"): "optim.<o>.param_groups.<g>.lr".
inline std::string optim_group(size_t optim, const std::string& key) {
  return "optim." + std::to_string(optim) + "." + key;
}

// Optimizer state that is not per model parameter (LBFGS's "state.lbfgs.*", the state of a tensor
// of no prepared model), `rest` being its state_dict key after "state.":
// "optim.<o>.opaque.lbfgs.d".
inline std::string optim_opaque(size_t optim, const std::string& rest) {
  return "optim." + std::to_string(optim) + ".opaque." + rest;
}

// A gradient saved inside an accumulation window (each rank's own un-averaged sum: same mesh only).
inline std::string grad(size_t model, const std::string& name) {
  return "grad." + std::to_string(model) + "." + name;
}

// The same saved by world rank `rank` (a per-rank tensor, whole: "grad.<i>.<name>.rank<r>"), and
// the ZeRO-1/2 window's gradient shard of bucket `bucket` of optimizer `optim` on that rank.
inline std::string grad_of_rank(size_t model, const std::string& name, int64_t rank) {
  return grad(model, name) + ".rank" + std::to_string(rank);
}
inline std::string zero_accum_of_rank(size_t optim, size_t bucket, int64_t rank) {
  return "grad.accum." + std::to_string(optim) + "." + std::to_string(bucket) + ".rank" +
         std::to_string(rank);
}

// The default generator's state (Note [generator state in checkpoints] in
// accelerate/accelerator_state.cc). Dropout under tp has no stream of its own to save (Note
// [dropout under tensor parallelism] in parallel/tp_random.cc): there is no "rng.tp".
inline const char* const kRngDefault = "rng.default";

}  // namespace accel::dist::ckpt::names
