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
  std::vector<Tensor> analytic = grad({loss}, diff_inputs, {}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);

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

GradcheckResult gradgradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                              const GradcheckOptions& opt) {
  const size_t n = inputs.size();
  std::vector<size_t> diff;
  for (size_t i = 0; i < n; ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) diff.push_back(i);
  ACCEL_CHECK(!diff.empty(), ValueError, "gradgradcheck", "no input requires grad");
  Tensor out;
  {
    EnableGradGuard grad_on;
    out = fn(inputs);
  }
  ACCEL_CHECK(out.defined() && out.requires_grad(), ValueError, "gradgradcheck",
              "output does not require grad");
  Generator gen(opt.seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<Tensor> all = inputs;
  all.push_back(randn(out.sizes(), TensorOptions(kFloat64), &gen).requires_grad_(true));
  // The first derivative as a function of (inputs, u): what gradcheck differentiates.
  const TensorFn first = [&fn, &diff, n](const std::vector<Tensor>& in) -> Tensor {
    EnableGradGuard grad_on;  // gradcheck evaluates under NoGradGuard
    const std::vector<Tensor> xs(in.begin(), in.begin() + std::ptrdiff_t(n));
    const Tensor o = fn(xs);
    std::vector<Tensor> wrt;
    for (size_t i : diff) wrt.push_back(xs[i]);
    const std::vector<Tensor> gs = grad({o}, wrt, {in[n].to(o.dtype())}, /*retain_graph=*/true,
                                        /*create_graph=*/true, /*allow_unused=*/true);
    std::vector<Tensor> flat;
    for (const Tensor& g : gs)
      if (g.defined()) flat.push_back(g.to(kFloat64).reshape({-1}));
    ACCEL_CHECK(!flat.empty(), ValueError, "gradgradcheck", "no input got a gradient");
    return flat.size() == 1 ? flat[0] : cat(flat, 0);
  };
  return gradcheck(first, all, opt);
}

}  // namespace accel::autograd
