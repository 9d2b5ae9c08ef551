// generate() for the hf/ models: the KV cache against the full recompute, greedy and sampling,
// determinism with a seed, transformers' temperature / top-k / top-p warpers (their masking
// semantics, and that sampling never leaves the kept set), eos and padding, errors.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "hf/hf.h"
#include "tests/hf/common.h"

using namespace accel;
using accel::test::hf_expected;
using accel::test::hf_fixture;
using accel::test::max_abs_diff;
using accel::test::same_tokens;

namespace {

std::shared_ptr<hf::CausalLM> load64(const std::string& model) {
  return hf::from_pretrained(hf_fixture(model), {.dtype = kFloat64});
}

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  const Tensor x = t.select(0, r).to(kInt64).contiguous();
  return std::vector<int64_t>(x.data<int64_t>(), x.data<int64_t>() + x.numel());
}

Tensor scores_of(std::vector<double> v) {
  const int64_t n = int64_t(v.size());
  return tensor(v, {1, n});
}

// The indices of a (1, V) score row that are not -inf.
std::set<int64_t> kept(const Tensor& scores) {
  std::set<int64_t> out;
  const Tensor s = scores.to(kFloat64).contiguous();
  for (int64_t i = 0; i < s.size(1); ++i)
    if (!std::isinf(s.data<double>()[i])) out.insert(i);
  return out;
}

}  // namespace

TEST_CASE("greedy decoding with the cache equals the full recompute over 30 tokens") {
  // Random transformers-initialised models (from_config), float64; the fixture models also run
  // both paths in test_hf_models.
  for (const std::string name : {"gpt2", "llama", "llama_tied"}) {
    CAPTURE(name);
    Generator g(11);
    auto model = hf::from_config(hf_fixture(name), &g);
    model->to(kFloat64).eval();
    const Tensor ids = randint(0, model->vocab_size(), {3, 4}, TensorOptions(kInt64), &g);
    const Tensor cached = hf::generate(*model, ids, {.max_new_tokens = 30});
    CHECK(cached.sizes() == Shape{3, 34});
    CHECK(same_tokens(cached.narrow(1, 0, 4), ids));
    CHECK(
        same_tokens(cached, hf::generate(*model, ids, {.max_new_tokens = 30, .use_cache = false})));
  }
}

TEST_CASE("sampling: the same seed gives the same tokens, cache or not; another seed others") {
  auto model = load64("llama");
  const Tensor ids = hf_expected("llama.input_ids");
  const hf::GenerationConfig s{
      .max_new_tokens = 12, .do_sample = true, .temperature = 1.5, .top_k = 0, .seed = 7};
  const Tensor a = hf::generate(*model, ids, s);
  CHECK(same_tokens(a, hf::generate(*model, ids, s)));
  hf::GenerationConfig no_cache = s;
  no_cache.use_cache = false;
  CHECK(same_tokens(a, hf::generate(*model, ids, no_cache)));
  hf::GenerationConfig other = s;
  other.seed = 8;
  CHECK(!same_tokens(a, hf::generate(*model, ids, other)));
  // An explicit generator: draws continue from its state.
  Generator gen(7);
  hf::GenerationConfig with_gen = s;
  with_gen.seed.reset();
  with_gen.generator = &gen;
  CHECK(same_tokens(a, hf::generate(*model, ids, with_gen)));
  CHECK(!same_tokens(a, hf::generate(*model, ids, with_gen)));
}

TEST_CASE("top_k_warp keeps the k largest scores of each row (ties with the k-th stay)") {
  const Tensor s = tensor(std::vector<double>{0.5, 3.0, -1.0, 2.0, 2.0, 0.1,  //
                                              1.0, 1.0, 1.0, 1.0, 5.0, 0.0},
                          {2, 6});
  const Tensor w = hf::top_k_warp(s, 2);
  CHECK(kept(w.narrow(0, 0, 1)) == std::set<int64_t>{1, 3, 4});  // 3.0, and 2.0 twice
  CHECK(kept(w.narrow(0, 1, 1)) == std::set<int64_t>{0, 1, 2, 3, 4});
  CHECK(max_abs_diff(w.narrow(1, 1, 1), s.narrow(1, 1, 1)) == 0);   // kept scores unchanged
  CHECK(kept(hf::top_k_warp(s.narrow(0, 0, 1), 100)).size() == 6);  // k beyond V: all
  CHECK_THROWS_AS(hf::top_k_warp(s, 0), ValueError);
}

TEST_CASE("top_p_warp keeps the smallest set of largest probabilities reaching top_p") {
  // probabilities 0.5, 0.3, 0.15, 0.05 (in a shuffled order)
  const Tensor s = scores_of({std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)});
  CHECK(kept(hf::top_p_warp(s, 0.7)) == std::set<int64_t>{1, 3});     // 0.5 + 0.3 >= 0.7
  CHECK(kept(hf::top_p_warp(s, 0.9)) == std::set<int64_t>{0, 1, 3});  // + 0.15
  CHECK(kept(hf::top_p_warp(s, 0.4)) == std::set<int64_t>{1});        // 0.5 alone
  CHECK(kept(hf::top_p_warp(s, 0.01)) == std::set<int64_t>{1});       // min_tokens_to_keep 1
  CHECK(kept(hf::top_p_warp(s, 1.0)).size() == 4);
  CHECK(kept(hf::top_p_warp(s, 0.01, -INFINITY, 3)) == std::set<int64_t>{0, 1, 3});
  CHECK_THROWS_AS(hf::top_p_warp(s, 0.0), ValueError);
  CHECK_THROWS_AS(hf::top_p_warp(s, 1.5), ValueError);
  const Tensor t = hf::temperature_warp(s, 2.0);
  CHECK(max_abs_diff(t, s / 2.0) == 0);
  CHECK_THROWS_AS(hf::temperature_warp(s, 0.0), ValueError);
}

TEST_CASE("sampling with top_k / top_p never draws outside the kept set, and draws across it") {
  auto model = load64("gpt2");
  // 400 copies of one prompt: one draw each from the same first-step distribution.
  const Tensor prompt = hf_expected("gpt2.input_ids").narrow(0, 0, 1);
  const Tensor ids = prompt.expand({400, prompt.size(1)}).contiguous();
  const Tensor last = (*model)(prompt).select(1, prompt.size(1) - 1);  // (1, vocab)
  const Tensor flat = hf::temperature_warp(last, 4.0);  // flatter: many tokens plausible
  struct Case {
    int64_t top_k;
    double top_p;
  };
  for (const Case c : {Case{5, 1.0}, Case{0, 0.6}, Case{20, 0.5}}) {
    CAPTURE(c.top_k);
    CAPTURE(c.top_p);
    Tensor allowed_scores = c.top_k > 0 ? hf::top_k_warp(flat, c.top_k) : flat;
    allowed_scores = hf::top_p_warp(allowed_scores, c.top_p);
    const std::set<int64_t> allowed = kept(allowed_scores);
    REQUIRE(allowed.size() >= 2);
    REQUIRE(allowed.size() < 97);
    const Tensor out = hf::generate(*model, ids,
                                    {.max_new_tokens = 1,
                                     .do_sample = true,
                                     .temperature = 4.0,
                                     .top_k = c.top_k,
                                     .top_p = c.top_p,
                                     .seed = 3});
    const std::vector<int64_t> drawn = row(out.select(1, out.size(1) - 1).unsqueeze(0), 0);
    std::set<int64_t> seen(drawn.begin(), drawn.end());
    for (int64_t t : seen) CHECK(allowed.count(t) == 1);
    CHECK(seen.size() >= 2);  // not a degenerate distribution
  }
}

TEST_CASE("eos: a finished sequence is padded and generation stops when all are finished") {
  auto model = load64("llama");
  const Tensor ids = hf_expected("llama.input_ids");
  const Tensor greedy = hf_expected("llama.greedy");  // 8 greedy tokens after 7
  const std::vector<int64_t> r0 = row(greedy, 0), r1 = row(greedy, 1);
  // Where a row first produces `tok` among its new tokens (positions 7..14), or 15.
  auto first_at = [](const std::vector<int64_t>& r, int64_t tok) {
    size_t k = 7;
    while (k < r.size() && r[k] != tok) ++k;
    return k;
  };
  // An eos that row 0 produces first at position j >= 8 (after at least one new token).
  size_t j = 8;
  while (j < r0.size() && first_at(r0, r0[j]) != j) ++j;
  REQUIRE(j < r0.size());
  const int64_t eos = r0[j];
  const size_t first1 = first_at(r1, eos);
  const Tensor out =
      hf::generate(*model, ids, {.max_new_tokens = 8, .eos_token_id = {eos}, .pad_token_id = 0});
  const std::vector<int64_t> o0 = row(out, 0);
  for (size_t i = 0; i < o0.size(); ++i) CHECK(o0[i] == (i <= j ? r0[i] : 0));
  // Stopped as soon as both had finished (at most the 8 new tokens).
  CHECK(out.size(1) == int64_t(std::min<size_t>(std::max(j, first1) + 1, 15)));
  // One row: the output ends at its eos; the pad defaults to the eos id.
  const Tensor one =
      hf::generate(*model, ids.narrow(0, 0, 1), {.max_new_tokens = 8, .eos_token_id = {eos}});
  CHECK(one.size(1) == int64_t(j + 1));
  CHECK(row(one, 0).back() == eos);
  // Several eos ids: the earliest one met ends the row (here the first new token).
  const Tensor two = hf::generate(*model, ids.narrow(0, 0, 1),
                                  {.max_new_tokens = 8, .eos_token_id = {eos, r0[7]}});
  CHECK(two.size(1) == 8);
  CHECK(same_tokens(hf::generate(*model, ids, {.max_new_tokens = 0}), ids));
}

TEST_CASE("generate refuses a bad config or bad ids") {
  auto model = load64("llama_tied");
  const Tensor ids = hf_expected("llama_tied.input_ids");
  CHECK_THROWS_WITH_AS(hf::generate(*model, ids, {.max_new_tokens = -1}),
                       doctest::Contains("max_new_tokens must be >= 0"), ValueError);
  CHECK_THROWS_WITH_AS(hf::generate(*model, ids, {.do_sample = true, .temperature = 0.0}),
                       doctest::Contains("temperature must be a positive number"), ValueError);
  CHECK_THROWS_WITH_AS(hf::generate(*model, ids, {.do_sample = true, .top_p = 0.0}),
                       doctest::Contains("top_p must be in (0, 1]"), ValueError);
  CHECK_THROWS_WITH_AS(hf::generate(*model, ids, {.do_sample = true, .top_k = -2}),
                       doctest::Contains("top_k must be >= 0"), ValueError);
  CHECK_THROWS_WITH_AS(hf::generate(*model, zeros({2, 3})), doctest::Contains("int64"), ShapeError);
  CHECK_THROWS_WITH_AS(hf::generate(*model, zeros({3}, TensorOptions(kInt64))),
                       doctest::Contains("expected input_ids (batch, sequence)"), ShapeError);
  // GPT-2's 64 positions: a prompt of 60 and 10 new tokens run out.
  auto gpt2 = load64("gpt2");
  CHECK_THROWS_WITH_AS(
      hf::generate(*gpt2, zeros({1, 60}, TensorOptions(kInt64)), {.max_new_tokens = 10}),
      doctest::Contains("do not fit the model's 64 positions"), ShapeError);
}
