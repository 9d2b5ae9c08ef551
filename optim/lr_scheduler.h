// Learning-rate schedulers with PyTorch's step() semantics: constructing one sets every group's
// lr to its value at epoch 0 (last_epoch = 0); each step() advances last_epoch by one and sets
// the lr for the new epoch. Call optimizer.step() before scheduler.step().
//
// Every schedule is a closed form of (base_lr, epoch), base_lr being each group's lr when the
// scheduler was built, so resuming from state_dict() reproduces the same values exactly. The
// scheduler keeps a reference to the optimizer: the optimizer must outlive it.
#pragma once

#include <functional>
#include <vector>

#include "optim/optimizer.h"

namespace accel::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Virtual: ReduceLROnPlateau refuses a step without its metric (step(metric)).
  virtual void step();
  // The lr of each group set by the last step() (or the constructor).
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  // {"last_epoch": int64, "base_lrs": float64 (groups), "last_lrs": float64 (groups)}
  // (ReduceLROnPlateau adds its own keys.)
  virtual TensorDict state_dict() const;
  // Restores the position and writes last_lrs back into the optimizer's groups.
  virtual void load_state_dict(const TensorDict& state);

 protected:
  LRScheduler(Optimizer& optimizer, const char* name);
  // Sets last_epoch = 0 and applies it; the last line of every derived constructor (a virtual
  // call from the base constructor would not reach the derived lr_at).
  void initial_step();
  // lr of group `group` at `epoch` >= 0.
  virtual double lr_at(size_t group, int64_t epoch) const = 0;

  Optimizer& optimizer_;
  const char* name_;
  std::vector<double> base_lrs_;

 private:
  void apply();
  int64_t last_epoch_ = -1;
  std::vector<double> last_lrs_;
};

// lr = base_lr * factor(epoch).
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  std::function<double(int64_t)> factor_;
};

// lr = base_lr * factor for epoch < total_iters, then base_lr. factor = 1 keeps lr constant.
class ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3.0, int64_t total_iters = 5);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  double factor_;
  int64_t total_iters_;
};

// Factor moves linearly from start_factor to end_factor over total_iters epochs, then stays.
class LinearLR : public LRScheduler {
 public:
  explicit LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0,
                    int64_t total_iters = 5);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  double start_, end_;
  int64_t total_iters_;
};

// lr = base_lr * gamma ^ (epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma ^ (number of milestones <= epoch).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = base_lr * gamma ^ epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (periodic past T_max,
// like PyTorch's).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up from 0 to base_lr over warmup_steps, then decay to min_lr_ratio * base_lr at
// total_steps (cosine: half a cosine period; linear: a straight line), and min_lr_ratio *
// base_lr after. With min_lr_ratio = 0 these are Hugging Face's
// get_cosine_schedule_with_warmup / get_linear_schedule_with_warmup.
enum class Decay : uint8_t { Cosine, Linear };
class WarmupDecayLR : public LRScheduler {
 public:
  WarmupDecayLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                Decay decay = Decay::Cosine, double min_lr_ratio = 0.0);

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t warmup_, total_;
  Decay decay_;
  double min_ratio_;
};

// Smith's one-cycle policy, PyTorch's OneCycleLR without momentum cycling: lr rises from
// max_lr / div_factor to max_lr over pct_start of total_steps, then anneals to
// max_lr / (div_factor * final_div_factor); three_phase returns to the initial lr first. The
// group lrs given to the optimizer are replaced (base_lrs = max_lr / div_factor). Stepping past
// total_steps throws ValueError; at epoch == total_steps the lr stays at the final value (PyTorch
// extrapolates the last phase there, which can go negative).
enum class Anneal : uint8_t { Cos, Linear };
struct OneCycleOptions {
  double pct_start = 0.3;
  Anneal anneal = Anneal::Cos;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             OneCycleOptions options = {});
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             OneCycleOptions options = {});

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  enum Level : uint8_t { kInitial, kMax, kMin };
  struct Phase {
    double end_step;
    Level start, end;
  };
  double level(size_t group, Level l) const;
  std::vector<double> max_lrs_;
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
};

// PyTorch's ReduceLROnPlateau: step(metric) after each evaluation; when the metric has not
// improved on the best seen for more than `patience` steps, every group's lr becomes
// max(lr * factor, min_lr of the group) (a change of eps or less is not made), then `cooldown`
// steps pass before bad steps count again. "Improved", with threshold_mode rel: metric <
// best * (1 - threshold) (mode min) or > best * (1 + threshold) (mode max); abs: metric <
// best - threshold or > best + threshold. A NaN metric never improves. It changes the lrs the
// optimizer holds (no base_lrs schedule): get_last_lr() is each group's lr after the last step.
// step() without a metric throws ValueError. state_dict adds "best" (float64), "num_bad_epochs"
// and "cooldown_counter" (int64) to the base keys.
enum class PlateauMode : uint8_t { Min, Max };
enum class ThresholdMode : uint8_t { Rel, Abs };
struct ReduceLROnPlateauOptions {
  PlateauMode mode = PlateauMode::Min;
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  ThresholdMode threshold_mode = ThresholdMode::Rel;
  int64_t cooldown = 0;
  std::vector<double> min_lr = {0.0};  // one value for every group, or one per group
  double eps = 1e-8;
};
class ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  void step() override;
  void step(double metric);
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }
  const std::vector<double>& min_lrs() const { return min_lrs_; }

  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

 protected:
  double lr_at(size_t group, int64_t epoch) const override;  // the optimizer's current lr

 private:
  bool is_better(double a, double best) const;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0;
};

}  // namespace accel::optim
