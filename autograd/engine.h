// Reverse-mode engine. See autograd/function.h for nodes and how ops record history.
//
// Note [backward order]
// backward() counts, for every node reachable from the roots, how many edges point at it; a node
// runs once all its incoming gradients have arrived. Among ready nodes the most recently created
// (highest sequence number) runs first, which mirrors the forward in reverse: the last layer's
// parameters get their gradients first, which is what DDP's bucket order relies on.
// Backward formulas run with grad mode off (no higher-order graphs).
#pragma once

#include "autograd/function.h"
#include "core/tensor.h"

namespace accel::autograd {

// Number of nodes created so far (sequence numbers); used by tests and DDP bucketing.
uint64_t current_sequence_nr();

}  // namespace accel::autograd
