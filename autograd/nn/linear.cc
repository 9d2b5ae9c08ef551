#include "autograd/nn/linear.h"

#include <cmath>

#include "autograd/nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

// ---------------- Linear ----------------

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen)
    : in_features(in), out_features(out) {
  ACCEL_CHECK(in > 0 && out > 0, ValueError, "Linear",
              "in_features and out_features must be "
              "positive, got ",
              in, " and ", out);
  weight = register_parameter("weight", empty({out, in}));
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());  // None without
  reset_parameters(gen);
}

void Linear::reset_parameters(Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(double(in_features));
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, "Linear", "input is undefined");
  ACCEL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, ShapeError, "Linear",
              "expected input (..., ", in_features, "), got ", x.sizes());
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) +
         ", out_features=" + std::to_string(out_features) +
         ", bias=" + (bias.defined() ? "true" : "false");
}

// ---------------- Embedding ----------------

Embedding::Embedding(int64_t num, int64_t dim, Generator* gen)
    : num_embeddings(num), embedding_dim(dim) {
  ACCEL_CHECK(num > 0 && dim > 0, ValueError, "Embedding",
              "num_embeddings and embedding_dim must be positive, got ", num, " and ", dim);
  weight = register_parameter("weight", empty({num, dim}));
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator* gen) { init::normal_(weight, 0.0, 1.0, gen); }

Tensor Embedding::forward(const Tensor& indices) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  return embedding(weight, indices);
}

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
}

// ---------------- Dropout ----------------

Dropout::Dropout(double p_, Generator* gen) : p(p_), gen_(gen) {
  ACCEL_CHECK(p_ >= 0 && p_ <= 1, ValueError, "Dropout", "p must be in [0, 1], got ", p_);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  return dropout(x, p, true, gen_);
}

std::string Dropout::extra_repr() const { return "p=" + std::to_string(p); }

}  // namespace accel::nn
