// What checkpoint files hold: tensors by name, and string metadata (safetensors' __metadata__).
// Module::state_dict and Optimizer::state_dict return a TensorDict; nn::TensorDict and
// nn::Metadata name the same types.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace accel::io {

// Name -> tensor, sorted by name (what state_dict() returns and safetensors files hold).
using TensorDict = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

}  // namespace accel::io
