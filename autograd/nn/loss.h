// Loss modules: thin holders of the options of the loss functions in autograd/ops.h, for code
// that passes a criterion around. forward(input, target) -> loss.
#pragma once

#include "autograd/nn/module.h"
#include "autograd/ops.h"

namespace accel::nn {

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(int64_t ignore_index = -100, Reduction reduction = Reduction::Mean,
                            double label_smoothing = 0.0)
      : ignore_index(ignore_index), reduction(reduction), label_smoothing(label_smoothing) {}
  // logits: (N, C) or (N, C, d...), target: int64 (N) or (N, d...)
  Tensor forward(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, ignore_index, reduction, label_smoothing);
  }
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return forward(logits, target);
  }
  int64_t ignore_index;
  Reduction reduction;
  double label_smoothing;
};

class NLLLoss : public Module {
 public:
  explicit NLLLoss(int64_t ignore_index = -100, Reduction reduction = Reduction::Mean)
      : ignore_index(ignore_index), reduction(reduction) {}
  Tensor forward(const Tensor& log_probs, const Tensor& target) const {
    return nll_loss(log_probs, target, ignore_index, reduction);
  }
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return forward(log_probs, target);
  }
  int64_t ignore_index;
  Reduction reduction;
};

class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return mse_loss(input, target, reduction);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Reduction reduction;
};

class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::Mean) : reduction(reduction) {}
  Tensor forward(const Tensor& logits, const Tensor& target) const {
    return binary_cross_entropy_with_logits(logits, target, reduction);
  }
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return forward(logits, target);
  }
  Reduction reduction;
};

}  // namespace accel::nn
