// Vision Transformer (torchvision.models.vision_transformer, torchvision 0.14): vit_b_16 with
// torchvision's `conv_proj`, `class_token`, `encoder` (pos_embedding, layers.encoder_layer_<i>
// with ln_1, self_attention (nn::MultiheadAttention, batch first), ln_2, mlp.0 / mlp.3; ln) and
// `heads.head`, parameter names and initialisation, so a torchvision state dict loads strictly.
// image_size is a constructor argument as in torchvision (224 by default; any multiple of the
// patch size, which sets the length of pos_embedding).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/attention.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "vision/ops/misc.h"

namespace accel::vision::models {

// torchvision's MLPBlock(in_dim, mlp_dim, dropout): MLP(in_dim, [mlp_dim, in_dim], GELU,
// inplace=None, dropout): 0 Linear, 1 GELU, 2 Dropout, 3 Linear, 4 Dropout; Linear weights
// Xavier-uniform, biases N(0, 1e-6).
class MLPBlock : public ops::MLP {
 public:
  MLPBlock(int64_t in_dim, int64_t mlp_dim, double dropout);
};

// torchvision's EncoderBlock: x + dropout(self_attention(ln_1(x))), then + mlp(ln_2(.)).
// x (N, S, hidden_dim).
class EncoderBlock : public nn::Module {
 public:
  EncoderBlock(int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim, double dropout,
               double attention_dropout, ops::NormLayer norm_layer = ops::layer_norm(1e-6));
  Tensor forward(const Tensor& x) override;
  int64_t num_heads;
  nn::Child<nn::Module> ln_1;
  nn::Child<nn::MultiheadAttention> self_attention;
  nn::Child<nn::Dropout> dropout;
  nn::Child<nn::Module> ln_2;
  nn::Child<MLPBlock> mlp;
};

// torchvision's Encoder: ln(layers(dropout(x + pos_embedding))); pos_embedding (1, seq_length,
// hidden_dim) starts N(0, 0.02); layers named encoder_layer_0, encoder_layer_1, ...
class Encoder : public nn::Module {
 public:
  Encoder(int64_t seq_length, int64_t num_layers, int64_t num_heads, int64_t hidden_dim,
          int64_t mlp_dim, double dropout, double attention_dropout,
          ops::NormLayer norm_layer = ops::layer_norm(1e-6));
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;
  nn::Parameter pos_embedding;
  nn::Child<nn::Dropout> dropout;
  nn::Child<nn::Sequential> layers;
  nn::Child<nn::Module> ln;
};

struct VisionTransformerOptions {
  std::string weights = {};  // vision/models/weights.h; empty: none
  int64_t num_classes = 1000;
  int64_t image_size = 224;
  double dropout = 0.0;
  double attention_dropout = 0.0;
  // Set: heads are pre_logits Linear(hidden, representation_size), act Tanh, head.
  std::optional<int64_t> representation_size = std::nullopt;
};

// torchvision.models.VisionTransformer(image_size, patch_size, num_layers, num_heads, hidden_dim,
// mlp_dim, dropout, attention_dropout, num_classes, representation_size, norm_layer) (no
// conv_stem_configs). x (N, 3, image_size, image_size) -> (N, num_classes): patches by a
// patch_size-strided convolution, the class token prepended, the encoder, the class token's
// output through `heads`.
class VisionTransformer : public nn::Module {
 public:
  VisionTransformer(int64_t image_size, int64_t patch_size, int64_t num_layers, int64_t num_heads,
                    int64_t hidden_dim, int64_t mlp_dim,
                    const VisionTransformerOptions& options = {},
                    ops::NormLayer norm_layer = ops::layer_norm(1e-6));
  Tensor forward(const Tensor& x) override;
  void reset_parameters(Generator* gen = nullptr) override;  // class_token = 0

  int64_t image_size, patch_size, hidden_dim, mlp_dim, seq_length;
  nn::Child<nn::Conv2d> conv_proj;
  nn::Parameter class_token;  // (1, 1, hidden_dim)
  nn::Child<Encoder> encoder;
  nn::Child<nn::Sequential> heads;  // heads.head (and heads.pre_logits, heads.act)
};

// patch 16, 12 layers, 12 heads, hidden 768, MLP 3072.
std::shared_ptr<VisionTransformer> vit_b_16(const VisionTransformerOptions& options = {});

}  // namespace accel::vision::models
