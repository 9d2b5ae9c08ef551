#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace accel::optim {

// ---------------- base ----------------

LRScheduler::LRScheduler(Optimizer& optimizer, const char* name)
    : optimizer_(optimizer), name_(name) {
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) base_lrs_.push_back(optimizer.lr(g));
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::initial_step() {
  last_epoch_ = 0;
  apply();
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::apply() {
  ACCEL_CHECK(optimizer_.num_param_groups() == base_lrs_.size(), ValueError, name_,
              "the optimizer has ", optimizer_.num_param_groups(),
              " parameter groups but the scheduler was built for ", base_lrs_.size());
  last_lrs_.resize(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_lrs_[g] = lr_at(g, last_epoch_);
    optimizer_.set_lr(g, last_lrs_[g]);
  }
}

TensorDict LRScheduler::state_dict() const {
  const int64_t n = int64_t(base_lrs_.size());
  return {{"last_epoch", scalar_tensor(last_epoch_, kInt64)},
          {"base_lrs", tensor(base_lrs_, Shape{n})},
          {"last_lrs", tensor(last_lrs_, Shape{n})}};
}

void LRScheduler::load_state_dict(const TensorDict& state) {
  auto get = [&](const char* key) -> const Tensor& {
    auto it = state.find(key);
    ACCEL_CHECK(it != state.end() && it->second.defined(), ValueError, name_,
                "load_state_dict: missing '", key, "'");
    return it->second;
  };
  for (const auto& [k, v] : state) {
    ACCEL_CHECK(k == "last_epoch" || k == "base_lrs" || k == "last_lrs", ValueError, name_,
                "load_state_dict: unexpected key '", k, "'");
  }
  const Tensor& epoch = get("last_epoch");
  ACCEL_CHECK(epoch.numel() == 1 && !epoch.is_floating_point(), ValueError, name_,
              "load_state_dict: last_epoch must be one integer, got ", epoch.dtype(), " ",
              epoch.sizes());
  const Tensor& base = get("base_lrs");
  const Tensor& last = get("last_lrs");
  const Shape groups{int64_t(base_lrs_.size())};
  ACCEL_CHECK(base.sizes() == groups && last.sizes() == groups, ValueError, name_,
              "load_state_dict: base_lrs ", base.sizes(), " and last_lrs ", last.sizes(),
              " must have one entry per parameter group ", groups);
  base_lrs_ = base.to_vector<double>();
  last_lrs_ = last.to_vector<double>();
  last_epoch_ = epoch.item<int64_t>();
  for (size_t g = 0; g < last_lrs_.size(); ++g) optimizer_.set_lr(g, last_lrs_[g]);
}

// ---------------- schedules ----------------

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer, "LambdaLR"), factor_(std::move(factor)) {
  ACCEL_CHECK(bool(factor_), ValueError, name_, "factor function is empty");
  initial_step();
}
double LambdaLR::lr_at(size_t g, int64_t epoch) const { return base_lrs_[g] * factor_(epoch); }

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer, "ConstantLR"), factor_(factor), total_iters_(total_iters) {
  ACCEL_CHECK(factor >= 0 && factor <= 1, ValueError, name_, "factor must be in [0, 1], got ",
              factor);
  ACCEL_CHECK(total_iters >= 0, ValueError, name_, "total_iters must be >= 0, got ", total_iters);
  initial_step();
}
double ConstantLR::lr_at(size_t g, int64_t epoch) const {
  return epoch < total_iters_ ? base_lrs_[g] * factor_ : base_lrs_[g];
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_(start_factor),
      end_(end_factor),
      total_iters_(total_iters) {
  ACCEL_CHECK(start_factor > 0 && start_factor <= 1 && end_factor >= 0 && end_factor <= 1,
              ValueError, name_, "start_factor must be in (0, 1] and end_factor in [0, 1], got ",
              start_factor, " and ", end_factor);
  ACCEL_CHECK(total_iters > 0, ValueError, name_, "total_iters must be > 0, got ", total_iters);
  initial_step();
}
double LinearLR::lr_at(size_t g, int64_t epoch) const {
  const double t = double(std::min(epoch, total_iters_)) / double(total_iters_);
  return base_lrs_[g] * (start_ + (end_ - start_) * t);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  ACCEL_CHECK(step_size > 0, ValueError, name_, "step_size must be > 0, got ", step_size);
  initial_step();
}
double StepLR::lr_at(size_t g, int64_t epoch) const {
  return base_lrs_[g] * std::pow(gamma_, double(epoch / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}
double MultiStepLR::lr_at(size_t g, int64_t epoch) const {
  // Repeated milestones count once per repetition, as in PyTorch's Counter.
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return base_lrs_[g] * std::pow(gamma_, double(passed));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  initial_step();
}
double ExponentialLR::lr_at(size_t g, int64_t epoch) const {
  return base_lrs_[g] * std::pow(gamma_, double(epoch));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), t_max_(T_max), eta_min_(eta_min) {
  ACCEL_CHECK(T_max > 0, ValueError, name_, "T_max must be > 0, got ", T_max);
  initial_step();
}
double CosineAnnealingLR::lr_at(size_t g, int64_t epoch) const {
  const double c = std::cos(std::numbers::pi * double(epoch) / double(t_max_));
  return eta_min_ + (base_lrs_[g] - eta_min_) * (1.0 + c) / 2.0;
}

WarmupDecayLR::WarmupDecayLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                             Decay decay, double min_lr_ratio)
    : LRScheduler(optimizer, "WarmupDecayLR"),
      warmup_(warmup_steps),
      total_(total_steps),
      decay_(decay),
      min_ratio_(min_lr_ratio) {
  ACCEL_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps, ValueError, name_,
              "need 0 <= warmup_steps <= total_steps, got ", warmup_steps, " and ", total_steps);
  ACCEL_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, ValueError, name_,
              "min_lr_ratio must be in [0, 1], got ", min_lr_ratio);
  initial_step();
}
double WarmupDecayLR::lr_at(size_t g, int64_t epoch) const {
  if (epoch < warmup_) return base_lrs_[g] * double(epoch) / double(std::max<int64_t>(1, warmup_));
  const double progress =
      std::min(1.0, double(epoch - warmup_) / double(std::max<int64_t>(1, total_ - warmup_)));
  const double f = decay_ == Decay::Cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                                           : 1.0 - progress;
  return base_lrs_[g] * (min_ratio_ + (1.0 - min_ratio_) * f);
}

namespace {
std::vector<double> repeat(double v, size_t n) { return std::vector<double>(n, v); }
}  // namespace

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       OneCycleOptions options)
    : OneCycleLR(optimizer, repeat(max_lr, optimizer.num_param_groups()), total_steps, options) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       OneCycleOptions o)
    : LRScheduler(optimizer, "OneCycleLR"),
      max_lrs_(std::move(max_lrs)),
      total_steps_(total_steps),
      options_(o) {
  ACCEL_CHECK(total_steps > 0, ValueError, name_, "total_steps must be > 0, got ", total_steps);
  ACCEL_CHECK(o.pct_start >= 0 && o.pct_start <= 1, ValueError, name_,
              "pct_start must be in [0, 1], got ", o.pct_start);
  ACCEL_CHECK(o.div_factor > 0 && o.final_div_factor > 0, ValueError, name_,
              "div_factor and final_div_factor must be > 0");
  ACCEL_CHECK(max_lrs_.size() == optimizer.num_param_groups(), ValueError, name_, "got ",
              max_lrs_.size(), " max_lr values for ", optimizer.num_param_groups(),
              " parameter groups");
  const double t = double(total_steps);
  if (o.three_phase) {
    phases_ = {{o.pct_start * t - 1, kInitial, kMax},
               {2 * o.pct_start * t - 2, kMax, kInitial},
               {t - 1, kInitial, kMin}};
  } else {
    phases_ = {{o.pct_start * t - 1, kInitial, kMax}, {t - 1, kMax, kMin}};
  }
  for (size_t g = 0; g < max_lrs_.size(); ++g) base_lrs_[g] = level(g, kInitial);
  initial_step();
}

double OneCycleLR::level(size_t g, Level l) const {
  const double initial = max_lrs_[g] / options_.div_factor;
  switch (l) {
    case kInitial: return initial;
    case kMax: return max_lrs_[g];
    case kMin: return initial / options_.final_div_factor;
  }
  return initial;
}

double OneCycleLR::lr_at(size_t g, int64_t epoch) const {
  ACCEL_CHECK(epoch <= total_steps_, ValueError, name_, "tried to step ", epoch,
              " times; total_steps is ", total_steps_);
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& ph = phases_[i];
    if (double(epoch) <= ph.end_step || i + 1 == phases_.size()) {
      // Clamped: PyTorch lets the last phase overshoot at epoch == total_steps (an lr no update
      // uses after the final step), which goes negative with linear annealing.
      const double span = ph.end_step - start_step;
      const double pct = span > 0 ? std::clamp((double(epoch) - start_step) / span, 0.0, 1.0) : 1.0;
      const double a = level(g, ph.start), b = level(g, ph.end);
      if (options_.anneal == Anneal::Cos) {
        return b + (a - b) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
      }
      return (b - a) * pct + a;
    }
    start_step = ph.end_step;
  }
  return level(g, kMin);
}

}  // namespace accel::optim

// ---------------- ReduceLROnPlateau ----------------

namespace accel::optim {

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions o)
    : LRScheduler(optimizer, "ReduceLROnPlateau"), options_(std::move(o)) {
  ACCEL_CHECK(options_.factor < 1.0 && options_.factor >= 0, ValueError, name_,
              "factor must be in [0, 1), got ", options_.factor);
  ACCEL_CHECK(options_.patience >= 0 && options_.cooldown >= 0, ValueError, name_,
              "patience and cooldown must be >= 0, got ", options_.patience, " and ",
              options_.cooldown);
  ACCEL_CHECK(options_.threshold >= 0 && options_.eps >= 0, ValueError, name_,
              "threshold and eps must be >= 0, got ", options_.threshold, " and ", options_.eps);
  const size_t groups = optimizer.num_param_groups();
  ACCEL_CHECK(options_.min_lr.size() == 1 || options_.min_lr.size() == groups, ValueError, name_,
              "expected 1 or ", groups, " min_lr values (one per parameter group), got ",
              options_.min_lr.size());
  min_lrs_ = options_.min_lr.size() == 1 ? std::vector<double>(groups, options_.min_lr[0])
                                         : options_.min_lr;
  for (double m : min_lrs_) ACCEL_CHECK(m >= 0, ValueError, name_, "min_lr must be >= 0, got ", m);
  best_ = options_.mode == PlateauMode::Min ? std::numeric_limits<double>::infinity()
                                            : -std::numeric_limits<double>::infinity();
  initial_step();  // last_epoch = 0; the lrs stay as they are
}

double ReduceLROnPlateau::lr_at(size_t group, int64_t) const { return optimizer_.lr(group); }

void ReduceLROnPlateau::step() {
  ACCEL_THROW(ValueError, name_,
              "step() needs the monitored metric: call step(metric) (e.g. the validation loss)");
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  const double th = options_.threshold;
  const bool rel = options_.threshold_mode == ThresholdMode::Rel;
  if (options_.mode == PlateauMode::Min) return rel ? a < best * (1.0 - th) : a < best - th;
  return rel ? a > best * (th + 1.0) : a > best + th;
}

void ReduceLROnPlateau::step(double metric) {
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    ACCEL_CHECK(optimizer_.num_param_groups() == min_lrs_.size(), ValueError, name_,
                "the optimizer has ", optimizer_.num_param_groups(),
                " parameter groups but the scheduler was built for ", min_lrs_.size());
    for (size_t g = 0; g < min_lrs_.size(); ++g) {
      const double old_lr = optimizer_.lr(g);
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[g]);
      if (old_lr - new_lr > options_.eps) optimizer_.set_lr(g, new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  LRScheduler::step();  // last_epoch + 1; get_last_lr() = the lrs now
}

TensorDict ReduceLROnPlateau::state_dict() const {
  TensorDict out = LRScheduler::state_dict();
  out["best"] = scalar_tensor(best_, kFloat64);
  out["num_bad_epochs"] = scalar_tensor(num_bad_epochs_, kInt64);
  out["cooldown_counter"] = scalar_tensor(cooldown_counter_, kInt64);
  return out;
}

void ReduceLROnPlateau::load_state_dict(const TensorDict& state) {
  TensorDict base = state;
  auto take = [&](const char* key, bool is_int) -> double {
    auto it = base.find(key);
    ACCEL_CHECK(it != base.end() && it->second.defined(), ValueError, name_,
                "load_state_dict: missing '", key, "'");
    const Tensor t = it->second;
    ACCEL_CHECK(t.numel() == 1 && t.is_floating_point() != is_int, ValueError, name_,
                "load_state_dict: '", key, "' must be one ", is_int ? "integer" : "float", ", got ",
                t.dtype(), " ", t.sizes());
    base.erase(it);
    return t.item<double>();
  };
  const double best = take("best", false);
  const int64_t bad = int64_t(take("num_bad_epochs", true));
  const int64_t cooldown = int64_t(take("cooldown_counter", true));
  LRScheduler::load_state_dict(base);
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
}

}  // namespace accel::optim
