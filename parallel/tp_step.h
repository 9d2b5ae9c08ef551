// The tensor-parallel apply step (Note [tp step] in parallel/tp_step.cc): slot "tp" of
// kApplyOrder (parallel/parallelize.h). Internal to parallel/.
#pragma once

#include <memory>

#include "parallel/parallelize.h"

namespace accel::dist {

std::unique_ptr<ApplyStep> make_tp_step();

}  // namespace accel::dist
