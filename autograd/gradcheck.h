// Numerical gradient checking: compares the autograd gradient of sum(fn(inputs) * v), v a fixed
// random cotangent, with central finite differences, element by element; gradgradcheck does the
// same for the gradient itself (double backward).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace accel::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // first mismatch: input index, element, analytic vs numeric
  double max_abs_error = 0;
  int64_t elements_checked = 0;
};

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs that require grad must be float64 CPU tensors; others are passed through unchanged.
GradcheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt = {});

// torch.autograd.gradgradcheck: gradcheck of the gradient. Draws grad_outputs u (float64 normal,
// the output's shape, requiring grad) from opt.seed and gradchecks
//   (inputs..., u) -> the gradients of fn(inputs) w.r.t. the inputs that require grad, seeded
//                     with u and taken with create_graph, flattened and concatenated
// so the analytical second derivatives (the backward of the backward, w.r.t. the inputs and u)
// are compared with central differences of the first. In the result's messages input
// inputs.size() is u. Inputs as gradcheck's.
GradcheckResult gradgradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                              const GradcheckOptions& opt = {});

}  // namespace accel::autograd
