// The arithmetic of accelerate/memory_estimate.h: what each strategy keeps per rank, and the
// activations of accel's transformer blocks.
#include "accelerate/memory_estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace accel::estimate {

// Note [memory estimate]
// Per rank, in bytes, between two optimizer steps (what stays allocated), for E trainable
// elements on this rank (after the tp split: a tensor with a tp_dim holds 1/tp of that
// dimension, rounded up), S = dp_shard x cp (the group ZeRO shards over; dp_replicate replicas of
// a shard hold the same bytes: HSDP; the cp ranks hold 1 / cp of each sequence's tokens), w = the
// element size of the precision, k = optimizer states per element (AdamW / Adam 2, SGD with
// momentum 1, SGD 0). The rules are those of the code:
//   ddp     parameters E w, gradients E w (with dp > 1 the .grad are views of DDP's bucket
//           buffers), optimizer k E w. 16-bit precisions are autocast here (mixed_precision): the
//           parameters, gradients and optimizer stay fp32, the activations are 16-bit.
//   zero1   parameters E w (every parameter a view of a full flat bucket), gradients E w (the
//           all-reduced bucket buffers stay), optimizer k E w / S.
//   zero2   parameters E w, gradients E w / S (the reduce-scattered slices; the full buckets are
//           released after the sync), optimizer k E w / S.
//   zero3   parameters E w / S (the shards) plus the root unit R w in full (the parameters of
//           no layer: embeddings, final norm, head; it stays gathered between steps, Note [unit
//           lifecycle] in parallel/fsdp.h), gradients E w / S, optimizer k E w / S.
// With bf16 / f16 the ZeRO strategies run param_dtype (Note [zero mixed precision] in
// parallel/zero.cc, docs/fsdp.md): stages 1-2 keep the full 16-bit compute buffers (2 E) and
// this rank's fp32 master slice (4 E / S, `master`); gradients are the 16-bit reduced buffers
// (stage 1: 2 E, stage 2: 2 E / S) plus the fp32 slices the optimizer steps (4 E / S); the
// optimizer is fp32 (4 k E / S). Stage 3 keeps the fp32 master shards (4 E / S), the root unit
// in 16 bits (2 R) and fp32 gradient shards (4 E / S).
// Non-trainable tensors (integer or bool buffers) are held whole by every rank.
// `transient` is what a step adds on top for a moment: the per-parameter gradients backward
// writes before the bucket collectives take them (ddp / zero1 / zero2 with more than one rank:
// E w); under zero3 two gathered layers (the one running and the one prefetched), one layer's
// gradients, the staging buffers of the two reduce-scatters FSDP keeps in flight (one layer
// each, parallel/fsdp.cc issue_reduce) and the root unit's gradient, reduced at the end of
// backward (5 layers + R, in the compute dtype); and the logits' gradient. ZeRO's bucket padding
// (< S elements per 25 MiB bucket) is not counted.
// A world of one process trains without a strategy (Note [one process under ZeRO] in
// accelerate/strategy_zero.cc), except with param_dtype: then stage 1-3's layout applies.
// These are tensor bytes, what Accelerator::memory() counts (tests/accelerate/
// test_memory_estimate.cc: equal within 0.1 %); a caching allocator hands out more (the CPU
// allocator rounds each block up to its size class, up to 25 %; 5-10 % in that test).

// Note [activation estimate]
// The tensors a forward saves for backward, per token, for accel's blocks with the fused
// attention kernel (scaled_dot_product_attention: no T x T scores; attention dropout > 0
// materialises them, which this does not count), counted from the code and checked against the
// bytes a forward adds (examples/models.h Gpt, hf GPT-2 and hf Llama, 2 and 4 layers):
//   GPT, per layer: the block input, ln_1's output, qkv (3C), the attention output in heads and
//     merged (2C), the residual h, ln_2's output, c_fc's output (4C) and GELU's output (4C):
//     17 C, plus 4 LayerNorm statistics and one log-sum-exp per head. Around the stack: the
//     final norm's input and output (2 C), its statistics and the logits (vocab).
//   Llama, per layer: the input, input_layernorm's output, h, post_attention_layernorm's output
//     (4 H), q, k, v as the attention reads them (repeated to every query head), RoPE's copies of
//     q and k, the attention output and its merged copy (7 H; grouped-query attention saves a
//     little less), gate, up, SiLU(gate) and their product (4 I), plus 2 RMSNorm statistics and
//     one log-sum-exp per head. Around the stack: 3 H, a statistic and the logits.
// Under tensor parallelism (no sequence parallelism) the norm inputs and outputs and the
// residuals are replicated and the rest split over tp. Elements are w bytes (f32 4, f64 8, the
// 16-bit precisions 2: autocast or param_dtype computes in 16 bits). With activation
// checkpointing (fsdp_activation_checkpointing: one checkpoint per layer) a layer keeps only its
// input (hidden per token) and backward recomputes one layer at a time: L x hidden + one layer's
// activations + the part around the stack.

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ModelSpec::parameters() const {
  int64_t n = 0;
  for (const TensorSpec& t : tensors)
    if (t.trainable) n += t.numel();
  return n;
}

const TensorSpec* ModelSpec::largest() const {
  const TensorSpec* best = nullptr;
  for (const TensorSpec& t : tensors)
    if (!best || t.numel() > best->numel()) best = &t;
  return best;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : out)
    if (c == '-') c = '_';
  return out;
}

int64_t element_size(Precision p) {
  switch (p) {
    case Precision::F64: return 8;
    case Precision::BF16:
    case Precision::F16: return 2;
    case Precision::F32: break;
  }
  return 4;
}

int64_t optimizer_states(Optimizer o) {
  switch (o) {
    case Optimizer::AdamW:
    case Optimizer::Adam: return 2;
    case Optimizer::SgdMomentum: return 1;
    case Optimizer::Sgd: break;
  }
  return 0;
}

// Elements of `t` one tp rank holds.
int64_t local_numel(const TensorSpec& t, int tp) {
  if (tp <= 1 || t.tp_dim < 0 || size_t(t.tp_dim) >= t.shape.size()) return t.numel();
  int64_t n = 1;
  for (size_t d = 0; d < t.shape.size(); ++d)
    n *= int(d) == t.tp_dim ? (t.shape[d] + tp - 1) / tp : t.shape[d];
  return n;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Activation elements per token per layer, and those around the stack (Note [activation
// estimate]), on one tp rank.
struct ActivationCounts {
  int64_t per_layer = 0, outside = 0, checkpoint_per_layer = 0;
};

ActivationCounts activation_counts(const Transformer& a, int tp) {
  ActivationCounts c;
  const int64_t t = std::max(1, tp);
  if (a.kind == Transformer::Kind::Gpt) {
    // Replicated: the block input, ln_1's output, h, ln_2's output. Split: qkv 3C, the attention
    // output in heads and merged 2C, c_fc 4C, GELU 4C.
    const int64_t C = a.hidden;
    c.per_layer = 4 * C + ceil_div(13 * C, t) + 4 + ceil_div(a.heads, t);
    c.outside = 2 * C + 3 + a.vocab;
  } else {
    // Replicated: the input, input_layernorm's output, h, post_attention_layernorm's output.
    // Split: q, k, v as attention reads them (repeated to every head), RoPE's copies of q and k,
    // the attention output and its merged copy (7 H), gate, up, SiLU(gate), their product (4 I).
    const int64_t H = a.hidden, I = a.intermediate;
    c.per_layer = 4 * H + ceil_div(7 * H + 4 * I, t) + 2 + ceil_div(a.heads, t);
    c.outside = 3 * H + 1 + a.vocab;
  }
  c.checkpoint_per_layer = a.hidden;
  return c;
}

}  // namespace

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::Zero1: return "zero1";
    case Strategy::Zero2: return "zero2";
    case Strategy::Zero3: return "zero3";
    case Strategy::Ddp: break;
  }
  return "ddp";
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::BF16: return "bf16";
    case Precision::F16: return "f16";
    case Precision::F64: return "f64";
    case Precision::F32: break;
  }
  return "f32";
}

std::string_view optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::Adam: return "adam";
    case Optimizer::SgdMomentum: return "sgd_momentum";
    case Optimizer::Sgd: return "sgd";
    case Optimizer::AdamW: break;
  }
  return "adamw";
}

std::optional<Strategy> parse_strategy(std::string_view s) {
  const std::string v = lower(s);
  if (v == "ddp" || v == "zero0") return Strategy::Ddp;
  if (v == "zero1") return Strategy::Zero1;
  if (v == "zero2") return Strategy::Zero2;
  if (v == "zero3" || v == "fsdp") return Strategy::Zero3;
  return std::nullopt;
}

std::optional<Precision> parse_precision(std::string_view s) {
  const std::string v = lower(s);
  if (v == "f32" || v == "fp32" || v == "float32" || v == "float") return Precision::F32;
  if (v == "bf16" || v == "bfloat16") return Precision::BF16;
  if (v == "f16" || v == "fp16" || v == "float16" || v == "half") return Precision::F16;
  if (v == "f64" || v == "fp64" || v == "float64" || v == "double") return Precision::F64;
  return std::nullopt;
}

std::optional<Optimizer> parse_optimizer(std::string_view s) {
  const std::string v = lower(s);
  if (v == "adamw") return Optimizer::AdamW;
  if (v == "adam") return Optimizer::Adam;
  if (v == "sgd_momentum" || v == "momentum") return Optimizer::SgdMomentum;
  if (v == "sgd") return Optimizer::Sgd;
  return std::nullopt;
}

Estimate estimate(const ModelSpec& model, const Setup& s) {
  Estimate e;
  std::string why;  // Note [mesh sizes] in core/parallelism.h
  const std::optional<MeshSizes> mesh = infer_mesh_sizes(s.mesh, s.world, &why);
  ACCEL_CHECK(
      mesh.has_value(), ValueError, "estimate_memory",
      "the parallelism sizes (--dp_replicate_size, --dp_shard_size, --cp_size, --tp_size) do "
      "not fit ",
      s.world, " processes: ", why);
  e.mesh = *mesh;
  ACCEL_CHECK(s.batch >= 1 && s.sequence >= 0, ValueError, "estimate_memory",
              "batch must be >= 1 and sequence >= 0, got ", s.batch, " and ", s.sequence);

  const int tp = mesh->tp;
  int64_t E = 0, buffers = 0;
  for (const TensorSpec& t : model.tensors) {
    if (t.trainable) {
      E += local_numel(t, tp);
    } else {
      buffers += local_numel(t, tp);  // counted at the precision's size below (an upper bound
                                      // for integer buffers of 1 byte)
    }
  }
  // Context parallelism: the cp ranks join the engine's groups (ZeRO shards over dp_shard x cp,
  // Note [context-parallel groups] in comm/device_mesh.cc) and each holds 1 / cp of every
  // sequence's tokens (ring attention keeps O(T / cp) per rank).
  const int64_t cp = mesh->cp;
  const int64_t S = int64_t(mesh->dp_shard) * cp, dp = S * mesh->dp_replicate;
  const int64_t w = element_size(s.precision), k = optimizer_states(s.optimizer);
  const bool half = s.precision == Precision::BF16 || s.precision == Precision::F16;
  Strategy strategy = s.strategy;
  // One process: no strategy unless param_dtype makes ZeRO run alone (Note [memory estimate]).
  if (dp == 1 && !(half && strategy != Strategy::Ddp)) strategy = Strategy::Ddp;
  const int64_t bw = half && strategy == Strategy::Ddp ? 4 : w;  // DDP: autocast keeps fp32
  e.params = buffers * bw;
  switch (strategy) {
    case Strategy::Ddp:
      e.params += E * bw;
      e.grads = E * bw;
      e.optimizer = k * E * bw;
      e.transient = dp > 1 ? E * bw : 0;
      break;
    case Strategy::Zero1:
    case Strategy::Zero2: {
      const bool two = strategy == Strategy::Zero2;
      e.params += E * w;
      if (half) {
        e.master = ceil_div(E, S) * 4;
        e.grads = (two ? ceil_div(E, S) : E) * w + ceil_div(E, S) * 4;
        e.optimizer = k * ceil_div(E, S) * 4;
      } else {
        e.grads = (two ? ceil_div(E, S) : E) * w;
        e.optimizer = k * ceil_div(E, S) * w;
      }
      e.transient = dp > 1 ? E * w : 0;
      break;
    }
    case Strategy::Zero3: {
      const int64_t master = half ? 4 : w;
      if (half) {
        e.master = ceil_div(E, S) * master;
      } else {
        e.params += ceil_div(E, S) * master;
      }
      e.grads = ceil_div(E, S) * master;
      e.optimizer = k * ceil_div(E, S) * master;
      // The root unit (everything outside the layers) stays gathered in the compute dtype.
      std::vector<int64_t> layers;
      int64_t root = 0;
      for (const TensorSpec& t : model.tensors) {
        if (!t.trainable) continue;
        if (t.layer < 0) {
          root += local_numel(t, tp);
          continue;
        }
        if (size_t(t.layer) >= layers.size()) layers.resize(size_t(t.layer) + 1, 0);
        layers[size_t(t.layer)] += local_numel(t, tp);
      }
      // The root unit stays gathered between steps (Note [unit lifecycle] in parallel/fsdp.h).
      const int64_t layer = layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end());
      e.params += root * w;
      // Note [memory estimate]: 2 gathered layers, one layer's gradients, 2 staging buffers of
      // reduce-scatters in flight, the root's gradient.
      e.transient = (5 * layer + root) * w;
      break;
    }
  }

  // Activations (Note [activation estimate]).
  int64_t seq = s.sequence;
  if (seq == 0) seq = model.arch && model.arch->positions > 0 ? model.arch->positions : 1024;
  e.tokens = s.batch * ceil_div(seq, cp);
  if (model.arch) {
    const ActivationCounts c = activation_counts(*model.arch, tp);
    const int64_t aw = w;
    e.activations_per_token = (c.per_layer * model.arch->layers + c.outside) * aw;
    e.activations = e.activations_per_token * e.tokens;
    e.activations_checkpointed =
        (c.checkpoint_per_layer * model.arch->layers + c.per_layer + c.outside) * aw * e.tokens;
    e.transient += model.arch->vocab * aw * e.tokens;  // the logits' gradient in backward
  }
  return e;
}

std::string human_count(int64_t n) {
  char buf[32];
  const double v = double(n);
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  }
  return buf;
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

}  // namespace accel::estimate
