#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/function.h"
#include "autograd/ops.h"

namespace accel::autograd {

namespace {
double weighted_sum(const Tensor& out, const Tensor& v) {
  return sum(mul(out.to(kFloat64), v)).item<double>();
}
}  // namespace

GradcheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  GradcheckResult res;
  std::vector<Tensor> diff_inputs;
  std::vector<size_t> diff_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    ACCEL_CHECK(x.dtype() == kFloat64 && x.device().is_cpu(), DTypeError, "gradcheck", "input ", i,
                " must be a float64 cpu tensor, got ", x.dtype(), " on ", x.device());
    diff_inputs.push_back(x);
    diff_index.push_back(i);
  }
  ACCEL_CHECK(!diff_inputs.empty(), ValueError, "gradcheck", "no input requires grad");

  Tensor out = fn(inputs);
  ACCEL_CHECK(out.requires_grad(), ValueError, "gradcheck", "output of shape ", out.sizes(),
              " does not require grad");
  Generator gen(opt.seed);
  Tensor v = randn(out.sizes(), TensorOptions(kFloat64), &gen);
  Tensor loss = sum(mul(out.to(kFloat64), v));
  std::vector<Tensor> analytic = grad({loss}, diff_inputs, {}, false, true);

  NoGradGuard no_grad;
  for (size_t k = 0; k < diff_inputs.size(); ++k) {
    Tensor x = diff_inputs[k];
    ACCEL_CHECK(x.is_contiguous(), ValueError, "gradcheck", "input ", diff_index[k],
                " must be contiguous");
    Tensor ga = analytic[k].defined() ? analytic[k].to(kFloat64).contiguous()
                                      : zeros(x.sizes(), TensorOptions(kFloat64));
    const double* gp = ga.data<double>();
    double* xp = x.data<double>();
    for (int64_t e = 0; e < x.numel(); ++e) {
      const double orig = xp[e];
      xp[e] = orig + opt.eps;
      const double fp = weighted_sum(fn(inputs), v);
      xp[e] = orig - opt.eps;
      const double fm = weighted_sum(fn(inputs), v);
      xp[e] = orig;
      const double numeric = (fp - fm) / (2 * opt.eps);
      const double err = std::abs(numeric - gp[e]);
      res.max_abs_error = std::max(res.max_abs_error, err);
      ++res.elements_checked;
      // Written as !(err <= tol) so that a NaN on either side fails instead of comparing false.
      if (res.ok && !(err <= opt.atol + opt.rtol * std::abs(numeric))) {
        res.ok = false;
        std::ostringstream os;
        os.precision(10);
        os << "input " << diff_index[k] << " (shape " << x.sizes() << ") element " << e
           << ": analytic " << gp[e] << " vs numeric " << numeric;
        res.message = os.str();
      }
    }
  }
  return res;
}

}  // namespace accel::autograd
