// Batch normalisation over (N, C) / (N, C, L) (BatchNorm1d) and (N, C, H, W) (BatchNorm2d),
// composed from framework ops (mean/var over every dim but C), so it runs and differentiates on
// every device.
//
// Training: normalise with the batch statistics (biased variance) and update the running
// statistics with the unbiased variance: running = (1 - momentum) * running + momentum * batch;
// momentum = nullopt gives the cumulative average over all batches seen. Evaluation uses the
// running statistics; with track_running_stats = false there are none and batch statistics are
// used in both modes.
#pragma once

#include <optional>
#include <string>

#include "nn/module.h"

namespace accel::nn {

class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  // weight = 1, bias = 0 (the running statistics are buffers: reset_running_stats()).
  void reset_parameters(Generator* gen = nullptr) override;
  void reset_running_stats();

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Parameter weight, bias;                                 // (C) when affine
  Buffer running_mean, running_var, num_batches_tracked;  // when track_running_stats

 protected:
  BatchNormBase(const char* op, int64_t num_features, double eps, std::optional<double> momentum,
                bool affine, bool track_running_stats, int64_t min_rank, int64_t max_rank);

 private:
  const char* op_;
  int64_t min_rank_, max_rank_;
};

// Input (N, C) or (N, C, L).
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNormBase("BatchNorm1d", num_features, eps, momentum, affine, track_running_stats, 2,
                      3) {}
};

// Input (N, C, H, W).
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNormBase("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats, 4,
                      4) {}
};

}  // namespace accel::nn
