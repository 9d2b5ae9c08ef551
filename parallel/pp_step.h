// The pipeline-parallel apply step (Note [pp step] in parallel/pp_step.cc): slot "pp" of
// kApplyOrder (parallel/parallelize.h). Internal to parallel/.
#pragma once

#include <memory>

#include "parallel/parallelize.h"

namespace accel::dist {

std::unique_ptr<ApplyStep> make_pp_step();

}  // namespace accel::dist
