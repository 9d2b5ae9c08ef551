#pragma once
// What a load of named tensors from a file found wrong, in one sentence (shared by the loaders of
// files: hf::load_weights and Accelerator::load_model; Module::load_state_dict keeps torch's own
// multi-line report).
#include <string>
#include <vector>

#include "nn/module.h"

namespace accel::nn {

// "; missing keys (2): a, b; unexpected keys (1): c; shape mismatch (1): d: file (2), model (3)"
// (at most 20 names per list). Missing and unexpected keys are listed only when `strict`; empty
// when nothing is listed.
std::string load_report(const LoadResult& r, const std::vector<std::string>& mismatched,
                        bool strict);

}  // namespace accel::nn
