// Samplers and the sharded batch layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>

#include "helpers.h"

using namespace accel;
using namespace accel::data;

namespace {

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  if (int64_t(v.size()) != n) return false;
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i)
    if (v[size_t(i)] != i) return false;
  return true;
}

// Checks the sharded batches of every rank against the epoch order of `sampler`.
void check_sharding(const SamplerPtr& sampler, int64_t batch, int64_t world, bool even, bool split,
                    bool drop_last, int64_t epoch) {
  CAPTURE(batch);
  CAPTURE(world);
  CAPTURE(even);
  CAPTURE(split);
  CAPTURE(drop_last);
  CAPTURE(epoch);
  const std::vector<int64_t> order = sampler->epoch_indices(epoch);
  const int64_t n = int64_t(order.size());
  std::vector<std::vector<BatchPlan>> per_rank;
  int64_t local = 0;
  for (int64_t r = 0; r < world; ++r) {
    ShardOptions s;
    s.rank = r;
    s.world_size = world;
    s.even_batches = even;
    s.split_batches = split;
    BatchSampler bs(sampler, batch, drop_last, s);
    local = bs.local_batch_size();
    per_rank.push_back(bs.batches(epoch));
    CHECK(int64_t(per_rank.back().size()) == bs.num_batches());
  }
  const int64_t g = local * world;
  // Every position of the order covered exactly once by non-padding samples (all of them unless
  // drop_last dropped the partial global batch), each rank's batch a slice of one global step.
  std::map<int64_t, int64_t> count;  // dataset index -> times seen as real sample
  int64_t real = 0;
  for (int64_t r = 0; r < world; ++r) {
    for (const BatchPlan& p : per_rank[size_t(r)]) {
      CHECK(!p.indices.empty());
      CHECK(int64_t(p.indices.size()) <= local);
      CHECK(p.num_padding >= 0);
      CHECK(p.num_padding <= int64_t(p.indices.size()));
      for (size_t k = 0; k + size_t(p.num_padding) < p.indices.size(); ++k) {
        ++count[p.indices[k]];
        ++real;
      }
    }
  }
  const int64_t expect_real = drop_last ? (n / g) * g : n;
  CHECK(real == expect_real);
  // Orders are permutations here (or weighted draws without replacement): each index once.
  for (auto& [i, c] : count) CHECK(c == 1);
  // Rebuild the order: global step s = concatenation of rank blocks.
  std::vector<int64_t> rebuilt;
  size_t max_batches = 0;
  for (auto& v : per_rank) max_batches = std::max(max_batches, v.size());
  for (size_t b = 0; b < max_batches; ++b)
    for (int64_t r = 0; r < world; ++r)
      if (b < per_rank[size_t(r)].size()) {
        const BatchPlan& p = per_rank[size_t(r)][b];
        rebuilt.insert(rebuilt.end(), p.indices.begin(), p.indices.end() - p.num_padding);
      }
  CHECK(rebuilt == std::vector<int64_t>(order.begin(), order.begin() + expect_real));
  if (even || drop_last) {
    for (auto& v : per_rank) CHECK(v.size() == per_rank[0].size());
  }
  // Padding only ever comes from the start of the order, and only with even_batches.
  for (auto& v : per_rank)
    for (const BatchPlan& p : v) {
      if (!even) CHECK(p.num_padding == 0);
      if (p.num_padding) {
        for (size_t k = p.indices.size() - size_t(p.num_padding); k < p.indices.size(); ++k)
          CHECK(std::find(order.begin(), order.end(), p.indices[k]) != order.end());
      }
    }
}

}  // namespace

TEST_CASE("sharding covers every epoch exactly once for world sizes 1..5 and odd sizes") {
  for (int64_t n : {1, 2, 7, 13, 31, 101}) {
    CAPTURE(n);
    std::vector<SamplerPtr> samplers{std::make_shared<SequentialSampler>(n),
                                     std::make_shared<RandomSampler>(n, 1234)};
    std::vector<double> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[size_t(i)] = 1.0 + double(i % 3);
    samplers.push_back(std::make_shared<WeightedRandomSampler>(w, std::max<int64_t>(1, n - 1),
                                                               /*replacement=*/false, 9));
    for (auto& s : samplers)
      for (int64_t world = 1; world <= 5; ++world)
        for (int64_t batch : {1, 3, 4, 10})
          for (bool even : {true, false})
            for (bool drop : {false, true})
              for (bool split : {false, true}) {
                if (split && batch % world != 0) continue;
                for (int64_t epoch : {0, 1})
                  check_sharding(s, batch, world, even, split, drop, epoch);
              }
  }
}

TEST_CASE("sharded global batches equal single-process batches of the global size") {
  auto s = std::make_shared<RandomSampler>(23, 5);
  BatchSampler single(s, 6, false);
  std::vector<BatchPlan> ref = single.batches(3);
  for (int64_t world : {2, 3}) {
    if (6 % world) continue;
    std::vector<std::vector<BatchPlan>> ranks;
    for (int64_t r = 0; r < world; ++r) {
      ShardOptions o;
      o.rank = r;
      o.world_size = world;
      o.split_batches = true;
      o.even_batches = false;
      ranks.push_back(BatchSampler(s, 6, false, o).batches(3));
    }
    for (size_t b = 0; b < ref.size(); ++b) {
      std::vector<int64_t> glued;
      for (auto& v : ranks)
        if (b < v.size()) glued.insert(glued.end(), v[b].indices.begin(), v[b].indices.end());
      CHECK(glued == ref[b].indices);
    }
  }
}

TEST_CASE("even_batches padding: counts and wrap-around") {
  // 10 samples, 3 ranks, batch 2: steps of 6; tail 4 -> ceil(4/3)=2 each, 2 padded on rank 2.
  auto s = std::make_shared<SequentialSampler>(10);
  std::vector<int64_t> pads;
  for (int64_t r = 0; r < 3; ++r) {
    ShardOptions o;
    o.rank = r;
    o.world_size = 3;
    auto b = BatchSampler(s, 2, false, o).batches(0);
    REQUIRE(b.size() == 2);
    pads.push_back(b[1].num_padding);
    if (r == 2) CHECK(b[1].indices == std::vector<int64_t>{0, 1});
    if (r == 1) CHECK(b[1].indices == std::vector<int64_t>{8, 9});
  }
  CHECK(pads == std::vector<int64_t>{0, 0, 2});
  // Fewer samples than ranks: wrapping repeats the order as often as needed.
  auto tiny = std::make_shared<SequentialSampler>(1);
  ShardOptions o;
  o.rank = 3;
  o.world_size = 4;
  auto b = BatchSampler(tiny, 2, false, o).batches(0);
  REQUIRE(b.size() == 1);
  CHECK(b[0].indices == std::vector<int64_t>{0});
  CHECK(b[0].num_padding == 1);
  // Without even_batches the same rank has nothing.
  o.even_batches = false;
  CHECK(BatchSampler(tiny, 2, false, o).num_batches() == 0);
}

TEST_CASE("RandomSampler: seeded permutations, new each epoch") {
  RandomSampler s(50, 42);
  auto e0 = s.epoch_indices(0), e1 = s.epoch_indices(1);
  CHECK(is_permutation_of_range(e0, 50));
  CHECK(is_permutation_of_range(e1, 50));
  CHECK(e0 != e1);
  CHECK(RandomSampler(50, 42).epoch_indices(1) == e1);
  CHECK(RandomSampler(50, 43).epoch_indices(1) != e1);
  s.set_epoch(1);
  CHECK(s.indices() == e1);
  RandomSampler t(50, 0);
  t.load_state_dict(s.state_dict());
  CHECK(t.epoch_indices(0) == e0);
  RandomSampler rep(5, 1, true, 1000);
  auto d = rep.epoch_indices(0);
  CHECK(d.size() == 1000);
  for (auto i : d) CHECK((i >= 0 && i < 5));
  CHECK_THROWS_AS(RandomSampler(5, 1, false, 4), ValueError);
}

TEST_CASE("WeightedRandomSampler with and without replacement") {
  WeightedRandomSampler with({1.0, 0.0, 3.0}, 40000, true, 3);
  auto d = with.epoch_indices(0);
  int64_t c[3] = {0, 0, 0};
  for (auto i : d) ++c[i];
  CHECK(c[1] == 0);
  CHECK(double(c[2]) / double(c[0]) == doctest::Approx(3.0).epsilon(0.06));
  CHECK(with.epoch_indices(0) == d);
  CHECK(with.epoch_indices(1) != d);

  WeightedRandomSampler without({5.0, 0.0, 1.0, 1.0}, 3, false, 3);
  auto w = without.epoch_indices(0);
  std::sort(w.begin(), w.end());
  CHECK(w == std::vector<int64_t>{0, 2, 3});
  // Heavier items come first more often.
  int64_t first0 = 0;
  for (int64_t e = 0; e < 400; ++e) first0 += without.epoch_indices(e)[0] == 0;
  CHECK(first0 > 250);  // expected 5/7 of 400 = 286
  CHECK_THROWS_AS(WeightedRandomSampler({1.0, 0.0}, 2, false), ValueError);
  CHECK_THROWS_AS(WeightedRandomSampler({1.0, -1.0}, 1), ValueError);
  CHECK_THROWS_AS(WeightedRandomSampler({0.0, 0.0}, 1), ValueError);
}

TEST_CASE("BatchSampler and ShardOptions reject bad configurations") {
  auto s = std::make_shared<SequentialSampler>(10);
  ShardOptions o;
  o.world_size = 4;
  o.split_batches = true;
  CHECK_THROWS_AS(BatchSampler(s, 6, false, o), ValueError);
  o.split_batches = false;
  o.rank = 4;
  CHECK_THROWS_AS(BatchSampler(s, 6, false, o), ValueError);
  CHECK_THROWS_AS(BatchSampler(s, 0), ValueError);
  CHECK_THROWS_AS(BatchSampler(nullptr, 1), ValueError);

  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "3", 1);
  ShardOptions e = ShardOptions::from_env();
  CHECK(e.rank == 2);
  CHECK(e.world_size == 3);
  setenv("RANK", "x", 1);
  CHECK_THROWS_AS(ShardOptions::from_env(), ValueError);
  setenv("RANK", "3", 1);
  CHECK_THROWS_AS(ShardOptions::from_env(), ValueError);
  unsetenv("WORLD_SIZE");
  CHECK_THROWS_AS(ShardOptions::from_env(), ValueError);
  unsetenv("RANK");
  CHECK(ShardOptions::from_env().world_size == 1);
}

TEST_CASE("StateDict JSON round trip") {
  StateDict s{{"epoch", "3"}, {"sampler.seed", "18446744073709551615"}};
  CHECK(state_from_json(state_to_json(s)) == s);
  CHECK_THROWS_AS(state_from_json("[1]"), ValueError);
  CHECK_THROWS_AS(state_from_json("{\"a\": 1}"), ValueError);
  CHECK_THROWS_AS(state_from_json("{"), ValueError);
}
