// generate() and transformers' logits warpers (hf/generation.h).
#include "hf/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/ops.h"
#include "core/error.h"

namespace accel::hf {

namespace {

constexpr const char* kOp = "hf.generate";

void check_scores(const Tensor& scores, const char* op) {
  ACCEL_CHECK(scores.defined() && scores.dim() == 2 && scores.is_floating_point(), ShapeError, op,
              "expected floating scores (batch, vocab), got ",
              scores.defined() ? scores.shape_str() + " " + std::string(dtype_name(scores.dtype()))
                               : std::string("an undefined tensor"));
}

void check_config(const GenerationConfig& c) {
  ACCEL_CHECK(c.max_new_tokens >= 0, ValueError, kOp, "max_new_tokens must be >= 0, got ",
              c.max_new_tokens);
  if (!c.do_sample) return;  // the warpers apply only when sampling (transformers warns)
  ACCEL_CHECK(c.temperature > 0 && std::isfinite(c.temperature), ValueError, kOp,
              "temperature must be a positive number when sampling, got ", c.temperature);
  ACCEL_CHECK(c.top_k >= 0, ValueError, kOp, "top_k must be >= 0 (0: off), got ", c.top_k);
  ACCEL_CHECK(c.top_p > 0 && c.top_p <= 1, ValueError, kOp, "top_p must be in (0, 1], got ",
              c.top_p);
}

// The device of the model's parameters (the CPU for a model without any).
Device model_device(CausalLM& model) {
  for (const Tensor& p : model.parameters()) return p.device();
  return Device(kCPU);
}

}  // namespace

Tensor temperature_warp(const Tensor& scores, double temperature) {
  check_scores(scores, "hf.temperature_warp");
  ACCEL_CHECK(temperature > 0 && std::isfinite(temperature), ValueError, "hf.temperature_warp",
              "temperature must be a positive number, got ", temperature);
  return temperature == 1.0 ? scores : scores / temperature;
}

Tensor top_k_warp(const Tensor& scores, int64_t top_k, double filter_value,
                  int64_t min_tokens_to_keep) {
  check_scores(scores, "hf.top_k_warp");
  ACCEL_CHECK(top_k > 0, ValueError, "hf.top_k_warp", "top_k must be positive, got ", top_k);
  const int64_t k = std::min(std::max(top_k, min_tokens_to_keep), scores.size(1));
  // transformers: scores < topk(scores, k).values[..., -1, None] are removed.
  const Tensor kth = std::get<0>(topk(scores, k, -1)).narrow(1, k - 1, 1);  // (B, 1)
  return masked_fill(scores, lt(scores, kth), filter_value);
}

Tensor top_p_warp(const Tensor& scores, double top_p, double filter_value,
                  int64_t min_tokens_to_keep) {
  check_scores(scores, "hf.top_p_warp");
  ACCEL_CHECK(top_p > 0 && top_p <= 1, ValueError, "hf.top_p_warp", "top_p must be in (0, 1], got ",
              top_p);
  if (top_p == 1.0) return scores;
  // Per row on the host, in float64 (B x V values: small beside a forward): transformers sorts
  // ascending, takes the cumulative softmax, removes positions whose mass is <= 1 - top_p and
  // keeps the last min_tokens_to_keep.
  const int64_t B = scores.size(0), V = scores.size(1);
  const Tensor s = scores.detach().to(kCPU).to(kFloat64).contiguous();
  const double* v = s.data<double>();
  Tensor remove = zeros({B, V}, TensorOptions(kBool));
  bool* r = remove.data<bool>();
  std::vector<int64_t> order(size_t(V), 0);
  std::vector<double> p(size_t(V), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    const double* row = v + b * V;
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return row[x] < row[y]; });
    const double mx = row[order[size_t(V - 1)]];
    double total = 0;
    for (int64_t j = 0; j < V; ++j) total += (p[size_t(j)] = std::exp(row[order[size_t(j)]] - mx));
    double cum = 0;
    for (int64_t j = 0; j < V; ++j) {
      cum += p[size_t(j)] / total;
      const bool kept_anyway = j >= V - min_tokens_to_keep;
      r[b * V + order[size_t(j)]] = !kept_anyway && cum <= 1.0 - top_p;
    }
  }
  return masked_fill(scores, remove.to(scores.device()), filter_value);
}

Tensor generate(CausalLM& model, const Tensor& input_ids, const GenerationConfig& config) {
  check_config(config);
  ACCEL_CHECK(
      input_ids.defined() && input_ids.dim() == 2 && input_ids.size(1) >= 1 &&
          (input_ids.dtype() == kInt64 || input_ids.dtype() == kInt32),
      ShapeError, kOp, "expected input_ids (batch, sequence) int64 with at least one token, got ",
      input_ids.defined() ? input_ids.shape_str() + " " + std::string(dtype_name(input_ids.dtype()))
                          : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  const Device device = model_device(model);
  Tensor ids = input_ids.to(device).to(kInt64);
  const int64_t B = ids.size(0);
  std::optional<Generator> own;
  Generator* gen = config.generator;
  if (!gen && config.seed) gen = &own.emplace(*config.seed);
  const std::vector<int64_t>& eos = config.eos_token_id;
  const int64_t pad = config.pad_token_id.value_or(eos.empty() ? 0 : eos[0]);
  std::vector<bool> finished(size_t(B), false);

  KVCache cache;
  Tensor logits = config.use_cache ? model.forward(ids, cache) : model.forward(ids);
  for (int64_t step = 0; step < config.max_new_tokens; ++step) {
    // The last position's scores (B, V): 16-bit logits upcast to float32.
    Tensor scores = logits.select(1, logits.size(1) - 1);
    if (scores.dtype() == kFloat16 || scores.dtype() == kBFloat16) scores = scores.to(kFloat32);
    Tensor next;  // (B) int64
    if (config.do_sample) {
      scores = temperature_warp(scores, config.temperature);
      if (config.top_k > 0) scores = top_k_warp(scores, config.top_k);
      scores = top_p_warp(scores, config.top_p);
      next = multinomial(softmax(scores, -1), 1, false, gen).reshape({B});
    } else {
      next = argmax(scores, -1);
    }
    // Finished sequences get pad; a sequence finishes when it produces an eos id.
    std::vector<int64_t> host(size_t(B), 0);
    const Tensor next_cpu = next.to(kCPU).to(kInt64).contiguous();
    std::copy_n(next_cpu.data<int64_t>(), B, host.begin());
    bool all_done = !eos.empty();
    for (int64_t b = 0; b < B; ++b) {
      if (finished[size_t(b)]) host[size_t(b)] = pad;
      if (std::find(eos.begin(), eos.end(), host[size_t(b)]) != eos.end())
        finished[size_t(b)] = true;
      all_done = all_done && finished[size_t(b)];
    }
    const Tensor column = tensor(host, {B, 1}, TensorOptions(kInt64)).to(device);
    ids = cat({ids, column}, 1);
    if (all_done || step + 1 == config.max_new_tokens) break;
    logits = config.use_cache ? model.forward(column, cache) : model.forward(ids);
  }
  return ids;
}

}  // namespace accel::hf
