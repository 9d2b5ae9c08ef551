#pragma once
// Note [replicated gradient check]
// Under tensor parallelism a parameter the plan leaves whole (Replicate on tp: a LayerNorm, a
// bias after a row-wise reduction, the position embedding) is held alike by every rank of its tp
// group, and so must its gradient be: the step then keeps the copies equal. A plan can be wrong
// in ways no static check sees: a module planned replicate() whose input is this rank's chunk of
// the sequence (its gradient is a partial sum), a user's module that mixes sharded activations
// into a replicated parameter. The run then trains, with a loss that looks right, while the
// copies drift apart (4.5e-2 after 15 steps in issue 37's report).
//
// check_replicated_grads compares, over the group, three float64 fingerprints of each gradient
// (its sum, a sum with position weights ((i * 2654435761) mod 1024) / 1024, which catches
// permutations and offsetting changes the plain sum misses, and its L1 norm) by one MIN and one
// MAX all-reduce of 4 doubles per gradient. A spread above `relative` x (the largest L1 norm +
// 1e-300) in the sum or the weighted sum, or a gradient that some ranks have and others not, is a
// DistError on every rank (every rank sees the same minima and maxima) naming the parameters,
// the mesh dimension and the values. Correct plans give bit-equal gradients (the same operations
// on the same values, or one all-reduce's result), so the tolerance only has to cover kernels
// whose summation order varies between runs (atomics on a GPU): 1e-9 in float64, 1e-4 below.
//
// The Accelerator runs it at the first optimizer step of a tp run (and at every step when
// ACCEL_VERIFY_PLACEMENTS=1): one pass over the replicated gradients, once.
#include <string>
#include <string_view>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace accel::dist {

// grads[k] (undefined: the parameter got no gradient) is the gradient of `names[k]`, or this
// rank's span of it when the gradients are sharded over another dimension (the ranks of `group`
// then hold equal spans). Collective over `group` and, when given, `world` (which decides for
// all: a difference seen in one group's spans is an error on every rank): every rank calls it
// with the same names in the same order.
void check_replicated_grads(const std::vector<std::string>& names, const std::vector<Tensor>& grads,
                            ProcessGroup& group, std::string_view dim,
                            ProcessGroup* world = nullptr);

}  // namespace accel::dist
