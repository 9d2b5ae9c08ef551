// Names an engine's call wrapper for errors (Module::set_call_wrapper, Note [module calls] in
// nn/module.h).
#pragma once

#include <string>

#include "nn/module.h"

namespace accel::nn {

// `label` ("tensor-parallel colwise 'blocks.0.fc'", "ZeRO-3 unit 'blocks.1'") names the module
// and the engine when its forward is called directly past the wrapper (check_not_bypassed).
// Call it after set_call_wrapper; set_call_wrapper forgets the label. Kept beside the module, in
// a table of this file's source, so Module's layout stays as it is.
void set_call_wrapper_label(const Module& module, std::string label);
// The label of the module's current wrapper, or "" when none was given.
std::string call_wrapper_label(const Module& module);

}  // namespace accel::nn
