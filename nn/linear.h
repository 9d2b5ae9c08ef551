// Linear, Embedding and Dropout modules.
//
// Initialisation is PyTorch's default: Linear weight Kaiming-uniform with a = sqrt(5) (a bound of
// 1/sqrt(in_features)), bias U(-1/sqrt(in_features), 1/sqrt(in_features)); Embedding N(0, 1).
// Random draws come from `gen`, or the default generator when null.
#pragma once

#include <optional>
#include <string>

#include "nn/module.h"
#include "autograd/options.h"
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

// torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
// norm_type=2.0), libtorch's nn::EmbeddingOptions(n, d).padding_idx(0) or the designated
// {.num_embeddings = n, .embedding_dim = d, .padding_idx = 0} (Note [options structs]).
// padding_idx (negative counts from the end): that row starts at zero and gets no gradient, so
// it stays what it is set to. max_norm: before each lookup, the rows looked up whose
// norm_type-norm exceeds it are rescaled in place to max_norm (embedding_renorm_ in
// autograd/ops.h). scale_grad_by_freq and sparse gradients are not offered.
struct EmbeddingFields {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  std::optional<int64_t> padding_idx = std::nullopt;
  std::optional<double> max_norm = std::nullopt;
  double norm_type = 2.0;
};

struct EmbeddingOptions : EmbeddingFields {
  using Fields = EmbeddingFields;
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim) {
    Fields::num_embeddings = num_embeddings;
    Fields::embedding_dim = embedding_dim;
  }
  ACCEL_OPTIONS_FROM_FIELDS(EmbeddingOptions)
  ACCEL_OPTION(num_embeddings)
  ACCEL_OPTION(embedding_dim)
  ACCEL_OPTION(padding_idx)
  ACCEL_OPTION(max_norm)
  ACCEL_OPTION(norm_type)
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  explicit Embedding(const EmbeddingFields& options, Generator* gen = nullptr);
  // indices: int32/int64 (...) -> (..., embedding_dim); an index outside [0, num_embeddings)
  // throws IndexError.
  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr) override;
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  Parameter weight;                    // (num_embeddings, embedding_dim)
  std::optional<int64_t> padding_idx;  // in [0, num_embeddings) once constructed
  std::optional<double> max_norm;
  double norm_type = 2.0;
};

// torch.nn.Dropout(p=0.5, inplace=False) options, shared by Dropout1d / 2d / 3d as libtorch's
// Dropout2dOptions are its DropoutOptions: nn::Dropout(nn::DropoutOptions(0.2).inplace(true)).
struct DropoutFields {
  double p = 0.5;
  bool inplace = false;
};
struct DropoutOptions : DropoutFields {
  using Fields = DropoutFields;
  DropoutOptions(double p = 0.5) { Fields::p = p; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(DropoutOptions)
  ACCEL_OPTION(p)
  ACCEL_OPTION(inplace)
};

// Zeroes elements with probability p in training and scales the rest by 1 / (1 - p); the
// identity in eval mode. inplace: the input is overwritten (dropout_ in autograd/ops.h).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Dropout(double p, bool inplace, Generator* gen = nullptr);
  explicit Dropout(const DropoutFields& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  double p;
  bool inplace = false;

 private:
  Generator* gen_;
};

}  // namespace accel::nn
