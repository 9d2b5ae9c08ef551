// Reverse-mode engine. See autograd/function.h for nodes and how ops record history.
//
// Note [backward order]
// backward() counts, for every node reachable from the roots, how many edges point at it; a node
// runs once all its incoming gradients have arrived. Among ready nodes the most recently created
// (highest sequence number) runs first, which mirrors the forward in reverse: the last layer's
// parameters get their gradients first, which is what DDP's bucket order relies on.
// Backward formulas run with grad mode off (no higher-order graphs).
//
// Note [end-of-backward callbacks]
// A hook that starts work during a backward (a gradient hook that launches a collective) can ask
// for a function to run once the backward is over: queue_callback(fn), as PyTorch's
// Variable._execution_engine.queue_callback. Callbacks run on the thread that ran the backward,
// in the order queued, after the outermost backward of that thread has finished (a backward run
// inside one, such as an activation checkpoint's recompute, does not end it), before
// Tensor::backward / autograd::grad return, with the caller's grad mode. They run whether the
// backward succeeded or threw (work a hook started must be finished either way), and are told
// which (`succeeded`); an exception of a callback propagates from backward() unless the backward
// itself threw, whose exception wins.
#pragma once

#include <functional>

#include "autograd/function.h"
#include "core/tensor.h"

namespace accel::autograd {

// Number of nodes created so far (sequence numbers); used by tests and DDP bucketing.
uint64_t current_sequence_nr();

// Note [end-of-backward callbacks]. ValueError when no backward runs on this thread.
using BackwardCallback = std::function<void(bool succeeded)>;
void queue_callback(BackwardCallback fn);
// Whether a backward (or autograd::grad) is running on this thread.
bool backward_running();

}  // namespace accel::autograd
