#include "nn/batchnorm.h"

#include <sstream>

#include "nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

BatchNormBase::BatchNormBase(const char* op, int64_t c, double eps_, std::optional<double> m,
                             bool aff, bool track, int64_t min_rank, int64_t max_rank)
    : num_features(c),
      eps(eps_),
      momentum(m),
      affine(aff),
      track_running_stats(track),
      op_(op),
      min_rank_(min_rank),
      max_rank_(max_rank) {
  ACCEL_CHECK(c > 0, ValueError, op, "num_features must be positive, got ", c);
  ACCEL_CHECK(!m || (*m >= 0 && *m <= 1), ValueError, op, "momentum must be in [0, 1], got ", *m);
  if (affine) {
    weight = register_parameter("weight", empty({c}));
    bias = register_parameter("bias", empty({c}));
    reset_parameters();
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

void BatchNormBase::reset_parameters(Generator*) {
  if (!affine) return;
  init::ones_(weight);
  init::zeros_(bias);
}

void BatchNormBase::reset_running_stats() {
  if (!track_running_stats) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

Tensor BatchNormBase::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, op_, "input is undefined");
  ACCEL_CHECK(x.dim() >= min_rank_ && x.dim() <= max_rank_ && x.size(1) == num_features, ShapeError,
              op_, "expected input ", min_rank_ == 4 ? "(N, C, H, W)" : "(N, C) or (N, C, L)",
              " with C = ", num_features, ", got ", x.sizes());
  // Statistics over every dim but the channel dim 1; shaped (1, C, 1...) to broadcast.
  Shape dims{0};
  Shape stat_shape(size_t(x.dim()), 1);
  stat_shape[1] = num_features;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);

  const bool use_batch_stats = is_training() || !track_running_stats;
  Tensor mu, var_;
  if (use_batch_stats) {
    const int64_t n = x.numel() / num_features;
    ACCEL_CHECK(n > 1 || !is_training(), ValueError, op_,
                "expected more than 1 value per channel when training, got input ", x.sizes());
    mu = mean(x, dims, /*keepdim=*/true);
    var_ = var(x, dims, /*correction=*/0, /*keepdim=*/true);
    if (is_training() && track_running_stats) {
      NoGradGuard no_grad;
      num_batches_tracked.add_(ones({}, kInt64));
      const double f = momentum ? *momentum : 1.0 / double(num_batches_tracked.item<int64_t>());
      const Tensor batch_mean = mu.detach().reshape({num_features});
      // Running variance is the unbiased estimate, as in PyTorch.
      const Tensor batch_var = var_.detach().reshape({num_features}) * (double(n) / double(n - 1));
      running_mean.mul_(1.0 - f).add_(batch_mean.to(running_mean.dtype()), f);
      running_var.mul_(1.0 - f).add_(batch_var.to(running_var.dtype()), f);
    }
  } else {
    mu = running_mean.view(stat_shape);
    var_ = running_var.view(stat_shape);
  }
  Tensor y = (x - mu) * rsqrt(var_ + eps);
  if (affine) y = y * weight.view(stat_shape) + bias.view(stat_shape);
  return y;
}

std::string BatchNormBase::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=";
  if (momentum) {
    os << *momentum;
  } else {
    os << "None";
  }
  os << ", affine=" << (affine ? "true" : "false")
     << ", track_running_stats=" << (track_running_stats ? "true" : "false");
  return os.str();
}

}  // namespace accel::nn
