// Text generation for the hf/ causal language models: transformers' generate() for greedy search
// and sampling, with a KV cache (docs/hf.md).
//
//   auto model = hf::from_pretrained("weights/");
//   Tensor out = hf::generate(*model, prompt_ids, {.max_new_tokens = 32, .do_sample = true,
//                                                  .temperature = 0.8, .top_p = 0.95, .seed = 1});
//   // out: (B, T + n) int64, the prompt followed by the new tokens (n <= max_new_tokens)
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "hf/causal_lm.h"

namespace accel::hf {

// transformers' GenerationConfig fields that generate() reads, with its defaults.
struct GenerationConfig {
  int64_t max_new_tokens = 20;
  // false: greedy (argmax); true: sampling from softmax(scores) after the warpers below, which
  // apply only when sampling, in transformers' order: temperature, top_k, top_p.
  bool do_sample = false;
  double temperature = 1.0;  // > 0; scores / temperature
  int64_t top_k = 50;        // 0: off; else only the top_k scores of each row stay
  double top_p = 1.0;        // in (0, 1]; 1: off; else the smallest nucleus of mass >= top_p
  // A sequence that produced one of these is finished: its later tokens are pad_token_id (unset:
  // the first eos id, as transformers does), and generation stops once all are finished.
  std::vector<int64_t> eos_token_id{};
  std::optional<int64_t> pad_token_id{};
  // Incremental decoding through a KVCache (one token per step); false recomputes the whole
  // sequence every step (the same tokens, slower: the cache is tested against it).
  bool use_cache = true;
  // The draws: `generator` when set, else a Generator seeded with `seed`, else the default
  // generator. The same seed gives the same samples (on every rank of a tp or ZeRO-3 group).
  std::optional<uint64_t> seed{};
  Generator* generator = nullptr;
};

// input_ids (B, T) int64 -> (B, T + n) int64 on the model's device: the prompt followed by n new
// tokens, n = max_new_tokens unless every sequence finished earlier (eos_token_id). Runs without
// gradient, in the model's current mode (from_pretrained returns it in eval mode; call
// model.eval() after training, as in PyTorch). Scores are the last position's logits in the
// model's dtype (16-bit upcast to float32). Every rank of a tensor-parallel or ZeRO-3 model must
// call it alike (the forwards are collective). ValueError for a bad config, ShapeError for bad
// ids or a sequence longer than the model's positions.
Tensor generate(CausalLM& model, const Tensor& input_ids, const GenerationConfig& config = {});

// transformers' logits warpers on scores (B, V), each returning new scores:
// TemperatureLogitsWarper: scores / temperature.
Tensor temperature_warp(const Tensor& scores, double temperature);
// TopKLogitsWarper: scores below the k-th largest of their row become filter_value
// (k = max(top_k, min_tokens_to_keep), at most V; ties with the k-th stay).
Tensor top_k_warp(const Tensor& scores, int64_t top_k,
                  double filter_value = -std::numeric_limits<double>::infinity(),
                  int64_t min_tokens_to_keep = 1);
// TopPLogitsWarper: sorting each row ascending, the scores whose cumulative softmax mass is
// <= 1 - top_p become filter_value (the min_tokens_to_keep largest always stay): what stays is
// the smallest set of largest scores whose mass reaches top_p.
Tensor top_p_warp(const Tensor& scores, double top_p,
                  double filter_value = -std::numeric_limits<double>::infinity(),
                  int64_t min_tokens_to_keep = 1);

}  // namespace accel::hf
