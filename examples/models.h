// The three reference models of shared/WORKLOADS.md, shared by examples/ and bench/:
//   Mlp  784-1024-1024-10, ReLU                              x: (B, 784)       -> (B, 10)
//   Cnn  conv(1->32, 3x3, pad 1), ReLU, maxpool 2,
//        conv(32->64, 3x3, pad 1), ReLU, maxpool 2,
//        flatten, linear 3136->128, ReLU, linear 128->10      x: (B, 1, 28, 28) -> (B, 10)
//   Gpt  byte-level GPT: context 128, 4 layers, 4 heads, d_model 128, pre-LayerNorm, causal
//        self-attention, MLP 4x with GELU (erf), learned position embedding, untied head
//        without bias: exactly 875,264 parameters          idx: (B, T) int64 -> (B, T, 256)
// PyTorch-default initialisation throughout (the layers' own reset_parameters). Header-only so
// that bench/ and examples/ compile the same definitions without a library of their own.
#pragma once

#include <memory>
#include <string>

#include "accel.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace accel::models {

class Mlp : public nn::Module {
 public:
  static constexpr int64_t kIn = 784, kHidden = 1024, kClasses = 10;

  explicit Mlp(Generator* gen = nullptr)
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(kIn, kHidden, true, gen))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(kHidden, kHidden, true, gen))),
        fc3(register_module("fc3", std::make_shared<nn::Linear>(kHidden, kClasses, true, gen))) {}

  // x: (B, 784) -> logits (B, 10)
  Tensor forward(const Tensor& x) override {
    return fc3->forward(relu(fc2->forward(relu(fc1->forward(x)))));
  }

  nn::Child<nn::Linear> fc1, fc2, fc3;
};

class Cnn : public nn::Module {
 public:
  static constexpr int64_t kClasses = 10;
  static constexpr int64_t kFlat = 64 * 7 * 7;  // 3136 after two 2x2 pools of 28x28

  explicit Cnn(Generator* gen = nullptr)
      : conv1(register_module("conv1",
                              std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1, 1, 1, true, gen))),
        conv2(register_module("conv2",
                              std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1, 1, 1, true, gen))),
        fc1(register_module("fc1", std::make_shared<nn::Linear>(kFlat, 128, true, gen))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(128, kClasses, true, gen))) {}

  // x: (B, 1, 28, 28) -> logits (B, 10)
  Tensor forward(const Tensor& x) override {
    Tensor h = max_pool2d(relu(conv1->forward(x)), {2, 2});  // (B, 32, 14, 14)
    h = max_pool2d(relu(conv2->forward(h)), {2, 2});         // (B, 64, 7, 7)
    return fc2->forward(relu(fc1->forward(h.flatten(1))));   // (B, 3136) -> (B, 10)
  }

  nn::Child<nn::Conv2d> conv1, conv2;
  nn::Child<nn::Linear> fc1, fc2;
};

struct GptConfig {
  int64_t vocab = 256;  // bytes
  int64_t context = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t d_model = 128;
  // GPT-2's dropout in training: on the embeddings' sum, the attention weights, the attention
  // output and the MLP output (0: none, the reference workload).
  double dropout = 0.0;
};

// One pre-LayerNorm transformer block: x + attn(ln1(x)), then x + dropout(mlp(ln2(x))).
class GptBlock : public nn::Module {
 public:
  GptBlock(const GptConfig& c, Generator* gen)
      : ln1(register_module("ln1", std::make_shared<nn::LayerNorm>(c.d_model))),
        attn(register_module("attn", std::make_shared<nn::CausalSelfAttention>(
                                         c.d_model, c.heads, true, c.dropout, gen))),
        ln2(register_module("ln2", std::make_shared<nn::LayerNorm>(c.d_model))),
        fc(register_module("fc",
                           std::make_shared<nn::Linear>(c.d_model, 4 * c.d_model, true, gen))),
        fc_out(register_module("fc_out",
                               std::make_shared<nn::Linear>(4 * c.d_model, c.d_model, true, gen))),
        p_drop(c.dropout) {}

  // x: (B, T, C) -> (B, T, C). Children are called through operator() so that tensor-parallel
  // styles (call wrappers, parallel/tensor_parallel.h) apply to them.
  Tensor forward(const Tensor& x) override {
    const Tensor h = x + (*attn)((*ln1)(x));
    // GELU, erf form; dropout draws from the default generator.
    return h + dropout((*fc_out)(gelu((*fc)((*ln2)(h)))), p_drop, is_training());
  }

  nn::Child<nn::LayerNorm> ln1;
  nn::Child<nn::CausalSelfAttention> attn;
  nn::Child<nn::LayerNorm> ln2;
  nn::Child<nn::Linear> fc, fc_out;
  double p_drop;
};

class Gpt : public nn::Module, public dist::PipelineModel {
 public:
  // The parameter count WORKLOADS.md fixes for the default config (checked at construction so
  // that a layer whose parameters change can never silently change the workload).
  static constexpr int64_t kExpectedParameters = 875264;

  explicit Gpt(GptConfig c = {}, Generator* gen = nullptr)
      : config(c),
        tok(register_module("tok", std::make_shared<nn::Embedding>(c.vocab, c.d_model, gen))),
        pos(register_module("pos", std::make_shared<nn::Embedding>(c.context, c.d_model, gen))),
        blocks(register_module("blocks", std::make_shared<nn::ModuleList>())),
        ln_f(register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model))),
        head(
            register_module("head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false, gen))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(std::make_shared<GptBlock>(c, gen));
    positions_ = arange(c.context);
    const bool is_reference =
        c.vocab == 256 && c.context == 128 && c.layers == 4 && c.heads == 4 && c.d_model == 128;
    ACCEL_CHECK(!is_reference || num_parameters() == kExpectedParameters, ValueError, "Gpt",
                "the reference GPT must have ", kExpectedParameters, " parameters, got ",
                num_parameters());
  }

  // idx: (B, T) int64 bytes, T <= context -> logits (B, T, vocab)
  Tensor forward(const Tensor& idx) override {
    Tensor x = embed(idx);
    for (const auto& b : *blocks) x = b->forward(x);
    return logits(x);
  }

  // The forward's pieces, its pipeline form's layers (parallel/pipeline.h): "embed" (token and
  // position embeddings, (B, T) -> (B, T, C)), "blocks.i", "head" (ln_f and the head, -> logits).
  Tensor embed(const Tensor& idx) {
    ACCEL_CHECK(idx.dim() == 2 && idx.size(1) >= 1 && idx.size(1) <= config.context, ShapeError,
                "Gpt", "expected indices (B, T) with 1 <= T <= ", config.context, ", got ",
                idx.sizes());
    const int64_t T = idx.size(1);
    if (positions_.device() != idx.device()) positions_ = positions_.to(idx.device());
    // (B, T, C) + (T, C): the position embedding broadcasts over the batch.
    const Tensor x = (*tok)(idx) + (*pos)(positions_.narrow(0, 0, T));
    return dropout(x, config.dropout, is_training());
  }
  Tensor logits(const Tensor& x) { return (*head)((*ln_f)(x)); }
  std::vector<dist::PipelineLayer> pipeline_layers() override {
    std::vector<dist::PipelineLayer> out = {
        {"embed", [this](const Tensor& idx) { return embed(idx); }, {"tok", "pos"}}};
    for (size_t i = 0; i < blocks->size(); ++i) {
      out.push_back({"blocks." + std::to_string(i),
                     [this, i](const Tensor& x) { return (*blocks)[i]->forward(x); }});
    }
    out.push_back({"head", [this](const Tensor& x) { return logits(x); }, {"ln_f", "head"}});
    return out;
  }

  GptConfig config;
  nn::Child<nn::Embedding> tok, pos;
  nn::Child<nn::ModuleList> blocks;
  nn::Child<nn::LayerNorm> ln_f;
  nn::Child<nn::Linear> head;

 private:
  Tensor positions_;  // arange(context), int64
};

// The Megatron-LM tensor-parallel plan of Gpt (dist::parallelize; docs/parallelism.md): the
// token embedding vocabulary-parallel, each attention's heads split (qkv colwise by heads, proj
// rowwise), the MLP's fc colwise and fc_out rowwise, the head colwise. With sequence_parallel
// the LayerNorms and residuals run on (B, T / tp, C) chunks (T divisible by tp), the position
// embedding on its chunk of positions. With loss_parallel the head's output stays sharded,
// (B, T, vocab / tp), for dist::vocab_parallel_cross_entropy; otherwise it is gathered and
// lm_loss applies as in one process.
struct GptTpOptions {
  bool sequence_parallel = false;
  bool loss_parallel = false;
};
inline dist::TpPlan gpt_tp_plan(GptTpOptions o = {}) {
  const bool sp = o.sequence_parallel;
  const dist::TpStyle region = sp ? dist::sequence() : dist::replicate();
  return {
      {"tok", dist::vocab_embedding({.sequence_parallel = sp})},
      {"pos", sp ? dist::sequence(/*shard_input_dim=*/0) : dist::replicate()},
      {"blocks.*.ln1", region},
      {"blocks.*.attn.qkv", dist::colwise({.chunks = 3, .sequence_parallel = sp})},
      {"blocks.*.attn.proj", dist::rowwise({.sequence_parallel = sp})},
      {"blocks.*.ln2", region},
      {"blocks.*.fc", dist::colwise({.sequence_parallel = sp})},
      {"blocks.*.fc_out", dist::rowwise({.sequence_parallel = sp})},
      {"ln_f", region},
      {"head", dist::colwise({.gather_output = !o.loss_parallel, .sequence_parallel = sp})},
  };
}

// The context-parallel plan of Gpt (AcceleratorConfig::cp_plan, parallel/context_parallel.h):
// each block's causal self-attention runs as ring attention over the cp group, and the position
// embedding takes the global positions of this rank's tokens.
inline dist::CpPlan gpt_cp_plan() {
  return {{"blocks.*.attn", dist::cp_ring_attention()}, {"pos", dist::cp_position_ids()}};
}

// lm_loss of local logits (B, T, vocab / tp) from gpt_tp_plan({.loss_parallel = true}).
inline Tensor lm_loss_parallel(const Tensor& local_logits, const Tensor& targets,
                               const dist::ProcessGroupPtr& tp) {
  return dist::vocab_parallel_cross_entropy(local_logits.reshape({-1, local_logits.size(-1)}),
                                            targets.reshape({-1}), tp);
}

// Mean cross-entropy of next-byte logits (B, T, V) against targets (B, T), in nats per byte.
inline Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t V = logits.size(-1);
  return cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
}

}  // namespace accel::models
