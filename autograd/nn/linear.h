// Linear, Embedding and Dropout modules.
//
// Initialisation is PyTorch's default: Linear weight Kaiming-uniform with a = sqrt(5) (a bound of
// 1/sqrt(in_features)), bias U(-1/sqrt(in_features), 1/sqrt(in_features)); Embedding N(0, 1).
// Random draws come from `gen`, or the default generator when null.
#pragma once

#include <string>

#include "autograd/nn/module.h"
#include "core/generator.h"

namespace accel::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  // x: (..., in_features) -> (..., out_features)
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t in_features, out_features;
  Parameter weight;  // (out_features, in_features)
  Parameter bias;    // (out_features); undefined without bias
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  // indices: int32/int64 (...) -> (..., embedding_dim); an index outside [0, num_embeddings)
  // throws IndexError.
  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  Parameter weight;  // (num_embeddings, embedding_dim)
};

// Zeroes elements with probability p in training and scales the rest by 1 / (1 - p); the
// identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  double p;

 private:
  Generator* gen_;
};

}  // namespace accel::nn
