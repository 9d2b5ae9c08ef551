// The causal-LM pieces shared by the hf/ decoders (hf/causal_lm.h).
#include "hf/causal_lm.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace accel::hf {

void CausalLM::check_call(const Tensor& ids, const KVCache* cache, const char* op) const {
  const int64_t past = cache ? cache->length() : 0;
  ACCEL_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) >= 1, ShapeError, op,
              "expected input_ids (batch, sequence) with a sequence of at least one token, got ",
              ids.defined() ? ids.shape_str() : std::string("an undefined tensor"));
  ACCEL_CHECK(ids.dtype() == kInt64 || ids.dtype() == kInt32, DTypeError, op,
              "input_ids must be int64 (or int32), got ", ids.dtype());
  const auto limit = max_positions();
  ACCEL_CHECK(!limit || past + ids.size(1) <= *limit, ShapeError, op, "positions [", past, ", ",
              past + ids.size(1), ") do not fit the model's ", *limit,
              " positions (n_positions); shorten the prompt or max_new_tokens");
  if (past == 0) return;
  ACCEL_CHECK(
      cache->keys.size() == size_t(num_layers()) && cache->values.size() == size_t(num_layers()),
      ValueError, op, "the KV cache holds ", cache->keys.size(), " / ", cache->values.size(),
      " layers of keys / values, the model has ", num_layers());
  for (size_t i = 0; i < cache->keys.size(); ++i) {
    const Tensor& k = cache->keys[i];
    const Tensor& v = cache->values[i];
    ACCEL_CHECK(k.defined() && v.defined() && k.dim() == 4 && v.dim() == 4 && k.size(2) == past &&
                    v.size(2) == past && k.size(0) == ids.size(0) && v.size(0) == ids.size(0),
                ValueError, op, "KV cache layer ", i, " holds keys ",
                k.defined() ? k.shape_str() : std::string("(undefined)"), " and values ",
                v.defined() ? v.shape_str() : std::string("(undefined)"), ", expected (",
                ids.size(0), ", heads, ", past, ", head_dim) for a batch of ", ids.size(0));
  }
}

namespace detail {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                        std::optional<double> scale) {
  const int64_t T = q.size(2), S = k.size(2);
  ACCEL_CHECK(S >= T, ShapeError, "hf.attention", "more queries (", T, ") than keys (", S, ")");
  if (S == T) return scaled_dot_product_attention(q, k, v, Tensor(), dropout_p, true, scale);
  if (T == 1) return scaled_dot_product_attention(q, k, v, Tensor(), dropout_p, false, scale);
  // New tokens after a cache: query i is position S - T + i and sees keys up to it (a bool mask,
  // true = takes part).
  Tensor mask = empty({T, S}, TensorOptions(kBool));
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < S; ++j) m[i * S + j] = j <= S - T + i;
  mask = mask.to(q.device());
  return scaled_dot_product_attention(q, k, v, mask, dropout_p, false, scale);
}

Tensor append_past(const std::optional<Tensor>& past, const Tensor& now) {
  if (!past || !past->defined()) return now;
  ACCEL_CHECK(past->dim() == 4 && past->size(0) == now.size(0) && past->size(1) == now.size(1) &&
                  past->size(3) == now.size(3),
              ShapeError, "hf.kv_cache", "cached keys/values ", past->shape_str(),
              " do not fit the new ones ", now.shape_str(),
              " (batch, kv heads and head_dim must agree: one cache per model and batch)");
  return cat({*past, now}, 2);
}

}  // namespace detail

}  // namespace accel::hf
