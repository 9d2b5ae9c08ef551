// Mixed precision for training: the dynamic loss scaler of fp16 training (GradScaler) and the
// mixed-precision mode names. The autocast scope itself lives in autograd/autocast.h because the
// ops read it.
//
// Note [dynamic loss scaling]
// fp16 gradients underflow for small losses, so the loss is multiplied by `scale` before
// backward and the gradients are divided by it before the optimizer step. When any gradient is
// inf/NaN (the scale was too large) the step is skipped and the scale multiplied by
// backoff_factor; after growth_interval consecutive good steps it is multiplied by
// growth_factor. PyTorch's torch.amp.GradScaler rules, with its defaults. Under data
// parallelism the inf/NaN flag is all-reduced (max) so every rank skips the same steps even
// when gradients are sharded (ZeRO) and each rank only sees its own shard.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"
#include "core/tensor.h"
#include "comm/process_group.h"

namespace accel::dist {

enum class MixedPrecision : uint8_t { No, FP16, BF16 };
std::string_view mixed_precision_name(MixedPrecision m);  // "no", "fp16", "bf16"
// Accepts no / fp16 / bf16 (also "none", "fp32"); ValueError naming `what` otherwise.
MixedPrecision parse_mixed_precision(const std::string& s, const char* what = "mixed_precision");

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  double scale() const { return scale_; }
  double get_scale() const { return scale_; }  // PyTorch's spelling (1.0 when disabled there)
  int64_t growth_tracker() const { return growth_tracker_; }
  // loss * scale (identity when disabled). Differentiable.
  Tensor scale_loss(const Tensor& loss) const;
  // PyTorch's torch.amp.GradScaler loop:
  //   scaler.scale(loss).backward();
  //   scaler.unscale_(opt);              // optional: before clipping
  //   scaler.step(opt);                  // unscales if not done, skips the step on inf/NaN
  //   scaler.update();
  Tensor scale(const Tensor& loss) const { return scale_loss(loss); }
  void unscale_(optim::Optimizer& opt, ProcessGroup* group = nullptr);
  // Unscales opt's gradients unless unscale_(opt) ran this step, then opt.step() unless one of
  // them is inf/NaN. Returns whether it stepped. Disabled: opt.step(). Per optimizer, as
  // PyTorch: several optimizers may share one scaler; update() backs off when any found one.
  bool step(optim::Optimizer& opt, ProcessGroup* group = nullptr);

  // Divides every gradient of `params` by scale in place and records whether any is inf/NaN
  // (all-reduced over `group` when given). Idempotent until update(): a second call in the same
  // step does nothing (clip_grad_norm_ unscales before the optimizer step does).
  void unscale_(const std::vector<Tensor>& params, ProcessGroup* group = nullptr);
  bool unscaled() const { return unscaled_; }
  // Valid after unscale_(): whether the step must be skipped.
  bool found_inf() const { return found_inf_; }
  // Adjusts the scale from found_inf() and resets for the next step (Note [dynamic loss
  // scaling]). Call once per optimizer step, after unscale_().
  void update();

  // {"scale", "growth_tracker", options...} as decimal strings (round-trip exact).
  std::map<std::string, std::string> state_dict() const;
  void load_state_dict(const std::map<std::string, std::string>& s);

 private:
  // The unscale of one parameter list: divides, returns whether any gradient is inf/NaN.
  bool unscale_grads(const std::vector<Tensor>& params, ProcessGroup* group) const;

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
  // unscale_(Optimizer&) this step: which optimizers, and whether each found inf/NaN.
  std::vector<std::pair<const optim::Optimizer*, bool>> unscaled_optimizers_;
};

// True when any element of any gradient is inf or NaN (no communication).
bool grads_have_inf_or_nan(const std::vector<Tensor>& params);

}  // namespace accel::dist
