// Probability distributions (torch.distributions). So far: Categorical.
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

namespace accel::distributions {

// torch.distributions.Categorical(probs=None, logits=None): K categories along the last dim of
// the parameter, the leading dims the batch shape. Built from one of
//   probs (..., K): non-negative weights, normalised here (probs / probs.sum(-1));
//   logits (..., K): unnormalised log-probabilities, normalised here (logits - logsumexp).
// Both parameters are kept, computed with differentiable ops from the given one (probs from
// logits by softmax; logits from probs as log(probs clamped to [eps, 1 - eps]), eps the dtype's
// epsilon, as torch), so log_prob and entropy differentiate to whichever was given. The
// arguments are validated as torch's validate_args does (ValueError naming Categorical).
//
//   auto d = distributions::Categorical::from_logits(policy(obs));   // (B, K)
//   Tensor a = d.sample();                 // (B) int64
//   Tensor loss = -mean(d.log_prob(a) * returns);
class Categorical {
 public:
  static Categorical from_probs(const Tensor& probs);
  static Categorical from_logits(const Tensor& logits);

  // int64 of shape sample_shape + batch_shape, drawn from probs (detached) by multinomial with
  // replacement on the parameter's device, from `gen` or the default generator.
  Tensor sample(const Shape& sample_shape = {}, Generator* gen = nullptr) const;
  // log P(value): value holds category indices (an integer dtype, each in [0, K)), of a shape
  // that broadcasts with batch_shape -> the broadcast shape, in the parameter's dtype.
  Tensor log_prob(const Tensor& value) const;
  // -sum_k p_k log p_k over the last dim -> batch_shape (0 log 0 = 0).
  Tensor entropy() const;

  const Tensor& probs() const { return probs_; }    // (..., K), rows sum to 1
  const Tensor& logits() const { return logits_; }  // (..., K), normalised: logsumexp = 0
  Shape batch_shape() const;
  Shape event_shape() const { return {}; }
  int64_t num_events() const { return probs_.size(probs_.dim() - 1); }

 private:
  Categorical(Tensor probs, Tensor logits) : probs_(std::move(probs)), logits_(std::move(logits)) {}
  Tensor probs_;
  Tensor logits_;
};

}  // namespace accel::distributions
