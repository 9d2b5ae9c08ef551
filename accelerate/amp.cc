// GradScaler; see Note [dynamic loss scaling] in accelerate/amp.h.
#include "accelerate/amp.h"

#include <cmath>
#include <cstdio>
#include <type_traits>

#include "autograd/ops.h"

namespace accel::dist {

std::string_view mixed_precision_name(MixedPrecision m) {
  switch (m) {
    case MixedPrecision::No: return "no";
    case MixedPrecision::FP16: return "fp16";
    case MixedPrecision::BF16: return "bf16";
  }
  return "?";
}

MixedPrecision parse_mixed_precision(const std::string& s, const char* what) {
  if (s == "no" || s == "none" || s == "fp32" || s == "false") return MixedPrecision::No;
  if (s == "fp16" || s == "float16") return MixedPrecision::FP16;
  if (s == "bf16" || s == "bfloat16") return MixedPrecision::BF16;
  ACCEL_THROW(ValueError, "accelerator", what, ": expected one of no, fp16, bf16, got '", s, "'");
}

namespace {
std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
double get_double(const std::map<std::string, std::string>& s, const std::string& k) {
  auto it = s.find(k);
  ACCEL_CHECK(it != s.end(), ValueError, "grad_scaler", "state has no key '", k, "'");
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  ACCEL_THROW(ValueError, "grad_scaler", "state key '", k, "' is not a number: '", it->second, "'");
}

bool tensor_has_inf_or_nan(const Tensor& g) {
  if (g.device().is_cpu() && g.is_contiguous()) {
    return ACCEL_DISPATCH_FLOATING(g.dtype(), "grad_scaler", [&]<typename T>() {
      const T* p = g.data<T>();
      const int64_t n = g.numel();
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(static_cast<double>(
                static_cast<std::conditional_t<std::is_same_v<T, double>, double, float>>(p[i]))))
          return true;
      return false;
    });
  }
  // 0 * x is 0 for finite x and NaN for inf/NaN, so the sum is finite iff every element is.
  NoGradGuard ng;
  return !std::isfinite(mul(g, 0.0).sum().item<double>());
}
}  // namespace

bool grads_have_inf_or_nan(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined() && tensor_has_inf_or_nan(g)) return true;
  }
  return false;
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  ACCEL_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale), ValueError,
              "grad_scaler", "init_scale must be positive and finite, got ", options.init_scale);
  ACCEL_CHECK(options.growth_factor > 1, ValueError, "grad_scaler",
              "growth_factor must be > 1, got ", options.growth_factor);
  ACCEL_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1, ValueError, "grad_scaler",
              "backoff_factor must be in (0, 1), got ", options.backoff_factor);
  ACCEL_CHECK(options.growth_interval >= 1, ValueError, "grad_scaler",
              "growth_interval must be >= 1, got ", options.growth_interval);
}

Tensor GradScaler::scale_loss(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  return mul(loss, scale_);
}

void GradScaler::unscale_(const std::vector<Tensor>& params, ProcessGroup* group) {
  if (!options_.enabled || unscaled_) return;
  found_inf_ = unscale_grads(params, group);
  unscaled_ = true;
}

bool GradScaler::unscale_grads(const std::vector<Tensor>& params, ProcessGroup* group) const {
  NoGradGuard ng;
  const double inv = 1.0 / scale_;  // exact: the scale stays a power of two with default factors
  bool inf = false;
  Device dev = kCPU;  // the flag travels on the gradients' device (NCCL needs CUDA tensors)
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    dev = g.device();
    g.mul_(inv);
    if (!inf && tensor_has_inf_or_nan(g)) inf = true;
  }
  if (group && group->size() > 1) {
    Tensor flag = scalar_tensor(inf ? 1.0 : 0.0, TensorOptions(kFloat32)).to(dev);
    group->all_reduce(flag, ReduceOp::Max);
    inf = flag.item<double>() > 0;
  }
  return inf;
}

namespace {
std::vector<Tensor> all_params(const optim::Optimizer& opt) {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt.num_param_groups(); ++g)
    for (const Tensor& p : opt.params(g)) out.push_back(p);
  return out;
}
}  // namespace

// Per optimizer, as PyTorch: each optimizer's gradients are unscaled once per step, each
// optimizer skips on its own inf/NaN, update() backs off when any had one.
void GradScaler::unscale_(optim::Optimizer& opt, ProcessGroup* group) {
  if (!options_.enabled) return;
  for (const auto& [o, inf] : unscaled_optimizers_)
    if (o == &opt) return;
  const bool inf = unscale_grads(all_params(opt), group);
  unscaled_optimizers_.emplace_back(&opt, inf);
  found_inf_ = found_inf_ || inf;
}

bool GradScaler::step(optim::Optimizer& opt, ProcessGroup* group) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  unscale_(opt, group);  // a no-op when unscale_(opt) ran already this step
  for (const auto& [o, inf] : unscaled_optimizers_)
    if (o == &opt && inf) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
  unscaled_optimizers_.clear();
}

std::map<std::string, std::string> GradScaler::state_dict() const {
  return {{"scale", num(scale_)},
          {"growth_tracker", std::to_string(growth_tracker_)},
          {"growth_factor", num(options_.growth_factor)},
          {"backoff_factor", num(options_.backoff_factor)},
          {"growth_interval", std::to_string(options_.growth_interval)},
          {"enabled", options_.enabled ? "1" : "0"}};
}

void GradScaler::load_state_dict(const std::map<std::string, std::string>& s) {
  double sc = get_double(s, "scale");
  ACCEL_CHECK(sc > 0 && std::isfinite(sc), ValueError, "grad_scaler", "bad scale in state: ", sc);
  scale_ = sc;
  growth_tracker_ = int64_t(get_double(s, "growth_tracker"));
  options_.growth_factor = get_double(s, "growth_factor");
  options_.backoff_factor = get_double(s, "backoff_factor");
  options_.growth_interval = int64_t(get_double(s, "growth_interval"));
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace accel::dist
