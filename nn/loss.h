// Loss modules: thin holders of the options of the loss functions in autograd/ops.h, for code
// that passes a criterion around. forward(input, target) -> loss.
#pragma once

#include <utility>

#include "nn/module.h"
#include "autograd/ops.h"

namespace accel::nn {

// torch.nn.CrossEntropyLoss(weight=None, ignore_index=-100, reduction='mean',
// label_smoothing=0.0). logits: (C), (N, C) or (N, C, d...); target: class indices (int64 or
// int32) of shape (), (N) or (N, d...), or class probabilities of the logits' shape (floating;
// ignore_index must stay -100). weight: (C) class weights, a buffer (moves with to()).
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(int64_t ignore_index = -100, Reduction reduction = Reduction::Mean,
                            double label_smoothing = 0.0)
      : ignore_index(ignore_index), reduction(reduction), label_smoothing(label_smoothing) {}
  explicit CrossEntropyLoss(Tensor weight, int64_t ignore_index = -100,
                            Reduction reduction = Reduction::Mean, double label_smoothing = 0.0)
      : CrossEntropyLoss(ignore_index, reduction, label_smoothing) {
    if (weight.defined()) this->weight = register_buffer("weight", std::move(weight));
  }
  Tensor forward(const Tensor& logits, const Tensor& target) const {
    if (weight.defined())
      return cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing);
    return cross_entropy(logits, target, ignore_index, reduction, label_smoothing);
  }
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return forward(logits, target);
  }
  Buffer weight;  // undefined: every class weighs 1
  int64_t ignore_index;
  Reduction reduction;
  double label_smoothing;
};

// torch.nn.NLLLoss(weight=None, ignore_index=-100, reduction='mean'): log_probs (C), (N, C) or
// (N, C, d...), target class indices; weight (C) class weights, a buffer (moves with to()); the
// weighted mean divides by the sum of the targets' weights (nll_loss in autograd/ops.h).
class NLLLoss : public Module {
 public:
  explicit NLLLoss(int64_t ignore_index = -100, Reduction reduction = Reduction::Mean)
      : ignore_index(ignore_index), reduction(reduction) {}
  explicit NLLLoss(Tensor weight, int64_t ignore_index = -100,
                   Reduction reduction = Reduction::Mean)
      : NLLLoss(ignore_index, reduction) {
    if (weight.defined()) this->weight = register_buffer("weight", std::move(weight));
  }
  Tensor forward(const Tensor& log_probs, const Tensor& target) const {
    return nll_loss(log_probs, target, weight, ignore_index, reduction);
  }
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return forward(log_probs, target);
  }
  Buffer weight;  // undefined: every class weighs 1
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

// torch.nn.BCELoss(weight=None, reduction='mean'): input holds probabilities in [0, 1] (a
// ValueError otherwise), target the same shape; weight broadcasts to the input's shape and is a
// buffer. binary_cross_entropy in autograd/ops.h; logs clamped at -100 as torch.
class BCELoss : public Module {
 public:
  explicit BCELoss(Tensor weight = Tensor(), Reduction reduction = Reduction::Mean)
      : reduction(reduction) {
    if (weight.defined()) this->weight = register_buffer("weight", std::move(weight));
  }
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return binary_cross_entropy(input, target, weight, reduction);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Buffer weight;
  Reduction reduction;
};

// torch.nn.L1Loss(reduction='mean'): |input - target|, input and target of one shape.
class L1Loss : public Module {
 public:
  explicit L1Loss(Reduction reduction = Reduction::Mean) : reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return l1_loss(input, target, reduction);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Reduction reduction;
};

// torch.nn.SmoothL1Loss(reduction='mean', beta=1.0): 0.5 d^2 / beta where |d| < beta, else
// |d| - 0.5 beta (beta = 0 is L1Loss).
class SmoothL1Loss : public Module {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0)
      : reduction(reduction), beta(beta) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return smooth_l1_loss(input, target, reduction, beta);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Reduction reduction;
  double beta;
};

// torch.nn.HuberLoss(reduction='mean', delta=1.0): 0.5 d^2 where |d| < delta, else
// delta (|d| - 0.5 delta); SmoothL1Loss(beta) times beta.
class HuberLoss : public Module {
 public:
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0)
      : reduction(reduction), delta(delta) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return huber_loss(input, target, reduction, delta);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Reduction reduction;
  double delta;
};

// torch.nn.KLDivLoss(reduction='mean', log_target=False): input log-probabilities, target
// probabilities (log-probabilities when log_target), one shape. Reduction::BatchMean is torch's
// 'batchmean' (the mathematically right KL divergence per sample); Mean averages every element.
class KLDivLoss : public Module {
 public:
  explicit KLDivLoss(Reduction reduction = Reduction::Mean, bool log_target = false)
      : reduction(reduction), log_target(log_target) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return kl_div(input, target, reduction, log_target);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  Reduction reduction;
  bool log_target;
};

// torch.nn.CosineSimilarity(dim=1, eps=1e-8): x1, x2 broadcast together, dim reduced.
class CosineSimilarity : public Module {
 public:
  explicit CosineSimilarity(int64_t dim = 1, double eps = 1e-8) : dim(dim), eps(eps) {}
  Tensor forward(const Tensor& x1, const Tensor& x2) const {
    return cosine_similarity(x1, x2, dim, eps);
  }
  Tensor operator()(const Tensor& x1, const Tensor& x2) const { return forward(x1, x2); }
  int64_t dim;
  double eps;
};

// torch.nn.CosineEmbeddingLoss(margin=0.0, reduction='mean'): x1, x2 (N, D) with target (N) of
// 1 / -1, or (D) with target (); 1 - cos for 1, max(0, cos - margin) for -1.
class CosineEmbeddingLoss : public Module {
 public:
  explicit CosineEmbeddingLoss(double margin = 0.0, Reduction reduction = Reduction::Mean)
      : margin(margin), reduction(reduction) {}
  Tensor forward(const Tensor& x1, const Tensor& x2, const Tensor& target) const {
    return cosine_embedding_loss(x1, x2, target, margin, reduction);
  }
  Tensor operator()(const Tensor& x1, const Tensor& x2, const Tensor& target) const {
    return forward(x1, x2, target);
  }
  double margin;
  Reduction reduction;
};

}  // namespace accel::nn
