// The context-parallel apply step (Note [cp step] in parallel/cp_step.cc): slot "cp" of
// kApplyOrder (parallel/parallelize.h). Internal to parallel/.
#pragma once

#include <memory>

#include "parallel/parallelize.h"

namespace accel::dist {

std::unique_ptr<ApplyStep> make_cp_step();

}  // namespace accel::dist
