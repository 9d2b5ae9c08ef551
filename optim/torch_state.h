// PyTorch's optimizer.state_dict() and accel's optimizer state, both ways, for SGD, Adam and AdamW
// (Note [torch optimizer states] in torch_state.cc).
//
//   optim::Adam opt(model.parameters(), {.lr = 1e-3});
//   optim::load_torch_state(opt, io::read_pt("ckpt.pt").at("optimizer"));   // torch's state
//   io::save_pt("opt.pt", optim::torch_state(opt));   // torch: opt.load_state_dict(torch.load(..))
#pragma once

#include "io/torch_format.h"
#include "optim/optimizer.h"

namespace accel::optim {

// torch's layout {'state': {i: {'step': ..., 'exp_avg': ...}}, 'param_groups': [{'lr': ...,
// 'params': [...], ...}]} as accel's flat one (Optimizer::state_dict's). ValueError naming what is
// missing or of the wrong type.
TensorDict flat_state_from_torch(const io::PtValue& torch_state);

// Loads torch's optimizer state into `opt` (SGD, Adam or AdamW), as torch's
// optimizer.load_state_dict does. The hyperparameters torch keeps per group but accel keeps per
// optimizer (betas, eps, momentum, dampening, nesterov; amsgrad and maximize, which accel does not
// have, must be False) must equal the optimizer's options: ValueError listing those that differ
// (construct the optimizer with them). Per-group lr and weight_decay are loaded.
void load_torch_state(Optimizer& opt, const io::PtValue& torch_state);

// `opt`'s state in torch 1.13's layout for its class (SGD, Adam or AdamW; ValueError for
// another): torch.optim.<Class>(params, ...).load_state_dict(torch.load(file)) reads it.
io::PtValue torch_state(const Optimizer& opt);

}  // namespace accel::optim
