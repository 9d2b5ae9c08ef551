#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"
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
    // The fan from the weight, as torch: a tensor-parallel piece materialised from deferred init
    // runs this over the full shape while in_features is already its piece's (Note [deferred
    // parts] in nn/module.cc).
    const double bound = 1.0 / std::sqrt(double(weight.size(1)));
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
    : Embedding(EmbeddingOptions(num, dim), gen) {}

Embedding::Embedding(const EmbeddingFields& o, Generator* gen)
    : num_embeddings(o.num_embeddings),
      embedding_dim(o.embedding_dim),
      max_norm(o.max_norm),
      norm_type(o.norm_type) {
  const int64_t num = o.num_embeddings, dim = o.embedding_dim;
  ACCEL_CHECK(num > 0 && dim > 0, ValueError, "Embedding",
              "num_embeddings and embedding_dim must be positive, got ", num, " and ", dim);
  if (o.padding_idx) {
    const int64_t p = *o.padding_idx;
    ACCEL_CHECK(p >= -num && p < num, ValueError, "Embedding", "padding_idx ", p,
                " must be within num_embeddings ", num);
    padding_idx = p < 0 ? p + num : p;
  }
  ACCEL_CHECK(!max_norm || *max_norm >= 0, ValueError, "Embedding", "max_norm must be >= 0, got ",
              max_norm.value_or(0));
  weight = register_parameter("weight", empty({num, dim}));
  reset_parameters(gen);
}

// N(0, 1), then the padding row zero (torch's _fill_padding_idx_with_zero).
void Embedding::reset_parameters(Generator* gen) {
  init::normal_(weight, 0.0, 1.0, gen);
  if (padding_idx && !is_deferred(weight)) {  // deferred: materialize() runs this again
    NoGradGuard no_grad;
    weight.select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  if (max_norm) return embedding(weight, indices, padding_idx, max_norm, norm_type);
  return embedding(weight, indices, padding_idx);
}

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  if (padding_idx) s += ", padding_idx=" + std::to_string(*padding_idx);
  if (max_norm) s += ", max_norm=" + std::to_string(*max_norm);
  if (max_norm && norm_type != 2.0) s += ", norm_type=" + std::to_string(norm_type);
  return s;
}

// ---------------- Dropout ----------------

Dropout::Dropout(double p_, Generator* gen) : Dropout(p_, false, gen) {}

Dropout::Dropout(const DropoutFields& o, Generator* gen) : Dropout(o.p, o.inplace, gen) {}

Dropout::Dropout(double p_, bool inplace_, Generator* gen) : p(p_), inplace(inplace_), gen_(gen) {
  ACCEL_CHECK(p_ >= 0 && p_ <= 1, ValueError, "Dropout", "p must be in [0, 1], got ", p_);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  if (!inplace) return dropout(x, p, true, gen_);
  Tensor y = x;  // the caller's impl, overwritten (torch's inplace=True)
  return dropout_(y, p, true, gen_);
}

std::string Dropout::extra_repr() const {
  return "p=" + std::to_string(p) + (inplace ? ", inplace=true" : "");
}

}  // namespace accel::nn
