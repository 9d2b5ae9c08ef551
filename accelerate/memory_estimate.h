// How much memory training a model takes per rank, before running it: Accelerate's
// `accelerate estimate-memory`, for accel's strategies and mesh (`accel-run estimate-memory`,
// docs/launcher.md). A model is a list of tensor shapes: from a safetensors file or a sharded
// index (headers only), from a built-in transformer config (gpt2 ... llama-70b), or from a live
// module. Per dtype and per strategy the estimate gives the bytes one rank holds between steps
// (parameters, gradients, optimizer state: Note [memory estimate]) and the activations of a
// batch, with and without activation checkpointing (Note [activation estimate]).
//
//   auto model = estimate::builtin_model("llama-7b");
//   estimate::Setup s;                    // AdamW, f32, DDP over one process
//   s.strategy = estimate::Strategy::Zero3;
//   s.world = 8;
//   estimate::Estimate e = estimate::estimate(model, s);   // e.state_bytes() per rank
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/parallelism.h"

namespace accel::nn {
class Module;
}

namespace accel::estimate {

// One stored tensor of the model.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool trainable = true;  // floating parameter (false: an integer or bool buffer, held whole)
  // Under tensor parallelism: the dimension split over the tp ranks (-1: every tp rank holds it
  // whole). Built-in models know their plan (examples/models.h gpt_tp_plan, the hf tp plans);
  // for a file, 2-D and larger tensors count as split, 1-D ones as replicated (Note [memory
  // estimate]).
  int tp_dim = -1;
  // The transformer layer (ZeRO-3 unit) the tensor belongs to: "h.3.", "layers.3.", "blocks.3."
  // in its name; -1 outside the layers (the root unit: embeddings, final norm, head).
  int64_t layer = -1;
  int64_t numel() const;
};

// The shape of a GPT-2 or Llama stack, which the activations are counted for.
struct Transformer {
  enum class Kind { Gpt, Llama };
  Kind kind = Kind::Gpt;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, vocab = 0;
  int64_t positions = 0;  // context length (GPT: position embedding rows)
};

struct ModelSpec {
  std::string name;  // "gpt2", a file's path
  std::vector<TensorSpec> tensors;
  std::optional<Transformer> arch;  // unknown for a file without a recognised layout
  std::string stored_dtype;         // "F32", "BF16", mixed: "F32+BF16"; built-in: ""

  int64_t parameters() const;  // trainable elements
  const TensorSpec* largest() const;
};

// Built-in models: gpt2 (124M), gpt2-medium (355M), gpt2-large (774M), gpt2-xl (1.5B) with
// GPT-2's shapes (tied lm_head); llama-7b, llama-13b, llama-70b (grouped-query attention);
// and shapes given in place: "gpt:layers=10,hidden=640,heads=10,vocab=256,positions=64" (tied=0
// for an untied head: examples/models.h Gpt) and
// "llama:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=100". ValueError naming the
// known names otherwise.
ModelSpec builtin_model(std::string_view name);
// Names builtin_model knows (without the in-place forms).
std::vector<std::string> builtin_model_names();
// The GPT of examples/models.h / hf GPT-2, and the Llama of hf/llama.h, with `tied` heads.
ModelSpec gpt_model(const Transformer& t, bool tied, std::string name);
ModelSpec llama_model(const Transformer& t, bool tied, std::string name);
// The tensors of a safetensors file, an index (model.safetensors.index.json) or a folder holding
// either, from the headers alone (io::SafetensorsCheckpoint); tied aliases count once. A GPT-2 or
// Llama layout (transformers' names) is recognised for the activations.
ModelSpec model_from_safetensors(const std::string& path);
// The parameters of `module` (trainable: requires_grad) and its buffers.
ModelSpec model_from_module(const nn::Module& module, std::string name);

enum class Strategy { Ddp, Zero1, Zero2, Zero3 };
enum class Precision { F32, BF16, F16, F64 };
enum class Optimizer { AdamW, Adam, SgdMomentum, Sgd };

std::string_view strategy_name(Strategy s);    // ddp, zero1, zero2, zero3
std::string_view precision_name(Precision p);  // f32, bf16, f16, f64
std::string_view optimizer_name(Optimizer o);  // adamw, adam, sgd_momentum, sgd
// Parsers of those names (and the usual other spellings: fsdp, float32, fp16, bfloat16, ...).
std::optional<Strategy> parse_strategy(std::string_view s);
std::optional<Precision> parse_precision(std::string_view s);
std::optional<Optimizer> parse_optimizer(std::string_view s);

struct Setup {
  Precision precision = Precision::F32;
  Strategy strategy = Strategy::Ddp;
  Optimizer optimizer = Optimizer::AdamW;
  int world = 1;
  ParallelismConfig mesh;  // sizes left unset are inferred (Note [mesh sizes])
  int64_t batch = 1;       // sequences per rank and step
  int64_t sequence = 0;    // tokens per sequence; 0: the model's context (else 1024)
};

// Bytes per rank. Note [memory estimate].
struct Estimate {
  MeshSizes mesh;
  int64_t params = 0;     // model parameters (16-bit compute copies included) and buffers
  int64_t master = 0;     // fp32 master copies of 16-bit parameters (ZeRO param_dtype)
  int64_t grads = 0;      // gradients held between steps (master-dtype shards included)
  int64_t optimizer = 0;  // optimizer state
  int64_t transient = 0;  // what backward and the step add on top: unreduced gradients,
                          // gathered ZeRO-3 units
  int64_t activations_per_token = 0;  // 0 when the model's layout is unknown
  int64_t activations = 0;            // batch x sequence tokens
  int64_t activations_checkpointed = 0;
  int64_t tokens = 0;  // batch x sequence

  int64_t state() const { return params + master + grads + optimizer; }
  int64_t peak() const { return state() + transient + activations; }
  int64_t peak_checkpointed() const { return state() + transient + activations_checkpointed; }
};

// ValueError for a mesh that does not fit `world`, in the library's words (every strategy
// composes with tp: Note [apply order] in parallel/parallelize.h).
Estimate estimate(const ModelSpec& model, const Setup& setup);

// "124.4M" (decimal), "1.49 GiB" (binary units).
std::string human_count(int64_t n);
std::string human_bytes(int64_t bytes);

}  // namespace accel::estimate
