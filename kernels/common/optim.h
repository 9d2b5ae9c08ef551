// The fused Adam/AdamW step (kernels/stubs/optim.h) written once: the per-call coefficients, folded
// on the host, and the per-element update that the CPU scalar path, the CPU 16-bit path and the
// CUDA kernel run (the CPU's AVX loop in kernels/cpu/optim.cc mirrors adam_update in intrinsics).
#pragma once

#include <cmath>

#include "kernels/common/macros.h"

namespace accel::common {

struct AdamScalars {
  double beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, inv_sqrt_bc2, eps;
  double decay_scale;  // AdamW: 1 - lr * wd, Adam: 1
  double l2;           // Adam: wd (added to the gradient), AdamW: 0
};

// hp: an AdamStepParams (kernels/stubs/optim.h); a template so that nvcc need not see that header.
template <typename Params>
AdamScalars adam_scalars(const Params& hp) {
  return AdamScalars{hp.beta1,
                     hp.beta2,
                     1.0 - hp.beta1,
                     1.0 - hp.beta2,
                     hp.lr / hp.bias_correction1,
                     1.0 / std::sqrt(hp.bias_correction2),
                     hp.eps,
                     hp.decoupled ? 1.0 - hp.lr * hp.weight_decay : 1.0,
                     hp.decoupled ? 0.0 : hp.weight_decay};
}

// The coefficients in the arithmetic type A (float for f32/f16/bf16, double for f64).
template <typename A>
struct AdamCoeffs {
  A beta1, beta2, omb1, omb2, step_size, inv_sqrt_bc2, eps, decay_scale, l2;
  ACCEL_HD explicit AdamCoeffs(const AdamScalars& s)
      : beta1(A(s.beta1)),
        beta2(A(s.beta2)),
        omb1(A(s.one_minus_beta1)),
        omb2(A(s.one_minus_beta2)),
        step_size(A(s.step_size)),
        inv_sqrt_bc2(A(s.inv_sqrt_bc2)),
        eps(A(s.eps)),
        decay_scale(A(s.decay_scale)),
        l2(A(s.l2)) {}
};

// One element: p, m, v updated in place from the gradient g. M::sqrt is the backend's sqrt
// (kernels/common/scalar_math.h describes the math policies).
template <typename M, typename A>
ACCEL_HD void adam_update(A& p, A g, A& m, A& v, const AdamCoeffs<A>& c) {
  const A gi = g + c.l2 * p;
  m = c.beta1 * m + c.omb1 * gi;
  v = c.beta2 * v + c.omb2 * gi * gi;
  p = p * c.decay_scale - c.step_size * m / (M::sqrt(v) * c.inv_sqrt_bc2 + c.eps);
}

}  // namespace accel::common
