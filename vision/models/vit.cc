#include "vision/models/vit.h"

#include <cmath>
#include <string>

#include "nn/activation.h"
#include "nn/init.h"
#include "autograd/ops.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

MLPBlock::MLPBlock(int64_t in_dim, int64_t mlp_dim, double dropout)
    : ops::MLP(in_dim, {mlp_dim, in_dim}, {}, ops::activation_without_inplace<nn::GELU>(),
               /*dropout_inplace=*/false, /*bias=*/true, dropout) {
  for (auto& [name, m] : named_modules()) {
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      nn::init::xavier_uniform_(lin->weight);
      nn::init::normal_(lin->bias, 0.0, 1e-6);
    }
  }
}

EncoderBlock::EncoderBlock(int64_t num_heads_, int64_t hidden_dim, int64_t mlp_dim,
                           double dropout_p, double attention_dropout, ops::NormLayer norm_layer)
    : num_heads(num_heads_) {
  ln_1 = register_module("ln_1", norm_layer(hidden_dim));
  self_attention = register_module(
      "self_attention",
      std::make_shared<nn::MultiheadAttention>(hidden_dim, num_heads, attention_dropout, true,
                                               false, false, std::nullopt, std::nullopt,
                                               /*batch_first=*/true));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(dropout_p));
  ln_2 = register_module("ln_2", norm_layer(hidden_dim));
  mlp = register_module("mlp", std::make_shared<MLPBlock>(hidden_dim, mlp_dim, dropout_p));
}

Tensor EncoderBlock::forward(const Tensor& input) {
  ACCEL_CHECK(input.defined() && input.dim() == 3, ShapeError, "EncoderBlock",
              "expected (batch_size, seq_length, hidden_dim), got ",
              input.defined() ? input.sizes() : Shape{});
  Tensor x = (*ln_1)(input);
  x = std::get<0>((*self_attention)(x, x, x, std::nullopt, /*need_weights=*/false));
  x = add((*dropout)(x), input);
  return add(x, (*mlp)((*ln_2)(x)));
}

Encoder::Encoder(int64_t seq_length, int64_t num_layers, int64_t num_heads, int64_t hidden_dim,
                 int64_t mlp_dim, double dropout_p, double attention_dropout,
                 ops::NormLayer norm_layer) {
  pos_embedding = register_parameter("pos_embedding", empty({1, seq_length, hidden_dim}));
  reset_parameters();
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(dropout_p));
  auto seq = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < num_layers; ++i) {
    seq->push_back("encoder_layer_" + std::to_string(i),
                   std::make_shared<EncoderBlock>(num_heads, hidden_dim, mlp_dim, dropout_p,
                                                  attention_dropout, norm_layer));
  }
  layers = register_module("layers", seq);
  ln = register_module("ln", norm_layer(hidden_dim));
}

void Encoder::reset_parameters(Generator* gen) { nn::init::normal_(pos_embedding, 0.0, 0.02, gen); }

Tensor Encoder::forward(const Tensor& input) {
  ACCEL_CHECK(input.defined() && input.dim() == 3 && input.size(1) == pos_embedding.size(1) &&
                  input.size(2) == pos_embedding.size(2),
              ShapeError, "Encoder", "expected (batch_size, ", pos_embedding.size(1), ", ",
              pos_embedding.size(2), "), got ", input.defined() ? input.sizes() : Shape{});
  return (*ln)((*layers)((*dropout)(add(input, pos_embedding))));
}

VisionTransformer::VisionTransformer(int64_t image_size_, int64_t patch_size_, int64_t num_layers,
                                     int64_t num_heads, int64_t hidden_dim_, int64_t mlp_dim_,
                                     const VisionTransformerOptions& o, ops::NormLayer norm_layer)
    : image_size(image_size_), patch_size(patch_size_), hidden_dim(hidden_dim_), mlp_dim(mlp_dim_) {
  const char* op = "VisionTransformer";
  ACCEL_CHECK(patch_size > 0 && image_size > 0 && image_size % patch_size == 0, ValueError, op,
              "input shape indivisible by patch size: image_size ", image_size, ", patch_size ",
              patch_size);
  ACCEL_CHECK(o.num_classes >= 1, ValueError, op, "num_classes must be positive, got ",
              o.num_classes);
  conv_proj = register_module("conv_proj",
                              std::make_shared<nn::Conv2d>(3, hidden_dim, patch_size, patch_size));
  seq_length = (image_size / patch_size) * (image_size / patch_size) + 1;  // + the class token
  class_token = register_parameter("class_token", zeros({1, 1, hidden_dim}));
  encoder = register_module(
      "encoder", std::make_shared<Encoder>(seq_length, num_layers, num_heads, hidden_dim, mlp_dim,
                                           o.dropout, o.attention_dropout, norm_layer));
  auto h = std::make_shared<nn::Sequential>();
  std::shared_ptr<nn::Linear> pre_logits;
  if (o.representation_size) {
    pre_logits = std::make_shared<nn::Linear>(hidden_dim, *o.representation_size);
    h->push_back("pre_logits", pre_logits);
    h->push_back("act", std::make_shared<nn::Tanh>());
  }
  auto head =
      std::make_shared<nn::Linear>(o.representation_size.value_or(hidden_dim), o.num_classes);
  h->push_back("head", head);
  heads = register_module("heads", h);

  // conv_proj: truncated normal with std sqrt(1 / fan_in) (cut at +-2, absolute, as
  // torch.nn.init.trunc_normal_'s defaults), zero bias; pre_logits likewise; head zero.
  const double fan_in = double(3 * patch_size * patch_size);
  nn::init::trunc_normal_(conv_proj->weight, 0.0, std::sqrt(1.0 / fan_in));
  nn::init::zeros_(conv_proj->bias);
  if (pre_logits) {
    nn::init::trunc_normal_(pre_logits->weight, 0.0,
                            std::sqrt(1.0 / double(pre_logits->in_features)));
    nn::init::zeros_(pre_logits->bias);
  }
  nn::init::zeros_(head->weight);
  nn::init::zeros_(head->bias);
}

void VisionTransformer::reset_parameters(Generator*) { nn::init::zeros_(class_token); }

Tensor VisionTransformer::forward(const Tensor& x) {
  const char* op = "VisionTransformer";
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, op,
              "expected an input (N, 3, ", image_size, ", ", image_size, "), got ",
              x.defined() ? x.sizes() : Shape{});
  ACCEL_CHECK(x.size(2) == image_size && x.size(3) == image_size, ShapeError, op,
              "wrong image size: expected ", image_size, "x", image_size, ", got ", x.size(2), "x",
              x.size(3));
  const int64_t n = x.size(0), patches = (image_size / patch_size) * (image_size / patch_size);
  // (N, D, H/p, W/p) -> (N, D, S - 1) -> (N, S - 1, D)
  Tensor h = (*conv_proj)(x).reshape({n, hidden_dim, patches}).permute({0, 2, 1});
  h = cat({class_token.expand({n, -1, -1}), h}, 1);  // (N, S, D)
  h = (*encoder)(h);
  return (*heads)(h.select(1, 0));  // the class token's output (N, D)
}

std::shared_ptr<VisionTransformer> vit_b_16(const VisionTransformerOptions& o) {
  return detail::build_as<VisionTransformer>(o.weights, [&] {
    return std::make_shared<VisionTransformer>(o.image_size, 16, 12, 12, 768, 3072, o);
  });
}

}  // namespace accel::vision::models
