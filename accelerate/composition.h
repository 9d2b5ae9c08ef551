// The Accelerator's strategy: the data-parallel engine composed with the model steps of the mesh
// (Note [composed strategy] in accelerate/composition.cc). Internal to accelerate/.
#pragma once

#include <memory>
#include <vector>

#include "accelerate/strategy.h"
#include "comm/device_mesh.h"
#include "parallel/parallelize.h"

namespace accel::dist {

// `engine` (built over the mesh's data-parallel group, of which this rank is `engine_rank` of
// `engine_size`) as the last slot of a ParallelPlan over `mesh`; `world`: the world group (null
// with one process), over which gradient norms of cut models are reduced. `mesh` must outlive it.
std::unique_ptr<Strategy> compose(const DeviceMesh& mesh, ParallelOptions options,
                                  std::unique_ptr<Strategy> engine, ProcessGroupPtr world,
                                  int engine_rank, int engine_size);

// The p-th power of the p-norm of gradient `g` (p = inf: its largest magnitude) in float64,
// counting each of `parts` (StepGrads::parts of its entry; empty: all of it) with its weight.
// Undefined when nothing is counted.
Tensor grad_norm_term(const Tensor& g, const std::vector<StepGrads::Part>& parts, double p);

}  // namespace accel::dist
