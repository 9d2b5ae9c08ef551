// IterableDataset + IterableDataLoader: exactly-once sharding over ranks x workers, order,
// randomness, epochs and errors (Note [iterable sharding] in data/iterable.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>

#include "data/iterable.h"

using namespace accel;
using namespace accel::data;

namespace {

// Stream of examples {value = offset + p, draw} for positions p < n. `draw` is the first number
// of sample_generator(), to check per-example randomness.
struct Counting final : IterableDataset {
  int64_t n;
  mutable std::atomic<int64_t> nexts{0}, skips{0}, opens{0};
  explicit Counting(int64_t n_) : n(n_) {}
  std::unique_ptr<SampleStream> iter(int64_t epoch) const override {
    opens++;
    struct S final : SampleStream {
      const Counting* ds;
      int64_t epoch, p = 0;
      bool next(Example& out) override {
        if (p >= ds->n) return false;
        ds->nexts++;
        Generator g = sample_generator();
        out = Example({scalar_tensor(epoch * 1000 + p, TensorOptions(kInt64)),
                       scalar_tensor(int64_t(g.next_u64() % 1000000), TensorOptions(kInt64))},
                      {"value", "draw"});
        ++p;
        return true;
      }
      bool skip() override {
        if (p >= ds->n) return false;
        ds->skips++;
        ++p;
        return true;
      }
    };
    auto s = std::make_unique<S>();
    s->ds = this;
    s->epoch = epoch;
    return s;
  }
};

struct Seen {
  std::vector<int64_t> values, indices, draws;
  std::vector<int64_t> batch_sizes;
};

Seen run(const std::shared_ptr<const IterableDataset>& ds, int64_t rank, int64_t world, int workers,
         int64_t batch, bool drop_last = false, int64_t epoch = 0) {
  DataLoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.rank = rank;
  o.world_size = world;
  o.drop_last = drop_last;
  o.seed = 7;
  IterableDataLoader loader(ds, o);
  loader.set_epoch(epoch);
  Seen s;
  int64_t k = 0;
  for (auto& b : loader) {
    CHECK(b.index == k++);
    CHECK(b.epoch == epoch);
    const auto v = b["value"].to_vector<int64_t>();
    s.values.insert(s.values.end(), v.begin(), v.end());
    if (b.data.index_of("draw") >= 0) {
      const auto d = b["draw"].to_vector<int64_t>();
      s.draws.insert(s.draws.end(), d.begin(), d.end());
    }
    s.indices.insert(s.indices.end(), b.indices.begin(), b.indices.end());
    s.batch_sizes.push_back(b.size());
  }
  CHECK(loader.epoch() == epoch + 1);
  return s;
}

}  // namespace

TEST_CASE("IterableDataLoader: 2 ranks x 2 workers see every example exactly once") {
  for (int64_t n : {0, 1, 3, 103}) {
    INFO("n = ", n);
    auto ds = std::make_shared<Counting>(n);
    std::vector<int64_t> all;
    std::map<int64_t, int64_t> draw_of;
    for (int64_t rank = 0; rank < 2; ++rank) {
      Seen s = run(ds, rank, 2, 2, 4);
      CHECK(s.values == s.indices);  // Batch::indices are stream positions
      for (size_t i = 0; i < s.values.size(); ++i) draw_of[s.values[i]] = s.draws[i];
      all.insert(all.end(), s.values.begin(), s.values.end());
      for (int64_t bs : s.batch_sizes) CHECK(bs <= 4);
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expect(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = i;
    CHECK(all == expect);  // none lost, none repeated
    // The same example draws the same numbers with 1 rank x 0 workers (per-example seeding).
    Seen one = run(ds, 0, 1, 0, 5);
    CHECK(one.values == expect);  // one shard: the stream in order
    for (size_t i = 0; i < one.values.size(); ++i) CHECK(draw_of[one.values[i]] == one.draws[i]);
  }
}

TEST_CASE("IterableDataLoader: round-robin order is deterministic; shards skip, not decode") {
  auto ds = std::make_shared<Counting>(50);
  Seen a = run(ds, 1, 2, 2, 3);
  ds->nexts = 0;
  ds->skips = 0;
  ds->opens = 0;
  Seen b = run(ds, 1, 2, 2, 3);
  CHECK(a.values == b.values);
  CHECK(ds->opens.load() == 2);  // one stream per worker
  // Only this rank's examples were produced: positions 2 and 3 mod 4 below 50, 12 + 12.
  CHECK(ds->nexts.load() == 24);
  CHECK(ds->skips.load() > 0);
  // Rank 1 is shards 2 and 3 of 4: positions 2, 6, 10 (worker 0) then 3, 7, 11 (worker 1), ...
  REQUIRE(a.values.size() >= 6);
  CHECK(std::vector<int64_t>(a.values.begin(), a.values.begin() + 6) ==
        std::vector<int64_t>{2, 6, 10, 3, 7, 11});
  // drop_last drops each worker's short tail: 50 / 4 shards -> 13, 13, 12, 12 -> 12 kept each.
  Seen d = run(ds, 0, 2, 2, 4, /*drop_last=*/true);
  for (int64_t bs : d.batch_sizes) CHECK(bs == 4);
  CHECK(d.values.size() == 24);
}

TEST_CASE("IterableDataLoader: epochs reach iter(epoch); self-sharding datasets") {
  auto ds = std::make_shared<Counting>(10);
  Seen e2 = run(ds, 0, 1, 2, 4, false, /*epoch=*/2);
  std::sort(e2.values.begin(), e2.values.end());
  CHECK(e2.values.front() == 2000);
  CHECK(e2.values.back() == 2009);
  // A torch-style dataset that reads get_worker_info() and yields only its own share.
  std::atomic<int> null_info{0};
  auto self = make_iterable(
      [&](int64_t) {
        const WorkerInfo* w = get_worker_info();
        if (!w) null_info++;
        const int64_t shard = w ? w->shard() : 0, n = w ? w->num_shards() : 1;
        auto i = std::make_shared<int64_t>(shard);
        return make_stream([i, n](Example& out) {
          if (*i >= 30) return false;
          out = Example({scalar_tensor(*i, TensorOptions(kInt64))}, {"value"});
          *i += n;
          return true;
        });
      },
      /*shards_itself=*/true);
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 2; ++rank) {
    Seen s = run(self, rank, 2, 2, 4);
    all.insert(all.end(), s.values.begin(), s.values.end());
  }
  std::sort(all.begin(), all.end());
  CHECK(all.size() == 30);
  CHECK(std::unique(all.begin(), all.end()) == all.end());
  CHECK(null_info.load() == 0);
  CHECK(get_worker_info() == nullptr);  // only set inside the loader's calls
}

TEST_CASE("IterableDataLoader: a stream error reaches the loop; bad options are ValueErrors") {
  auto failing = make_iterable([](int64_t) {
    auto i = std::make_shared<int64_t>(0);
    return make_stream([i](Example& out) {
      if (*i == 13) throw IoError("[stream] record 13 is corrupt");
      out = Example({scalar_tensor((*i)++, TensorOptions(kInt64))});
      return true;
    });
  });
  DataLoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 2;
  o.rank = 0;
  o.world_size = 1;
  IterableDataLoader loader(failing, o);
  CHECK_THROWS_WITH_AS(
      [&] {
        for (auto& b : loader) (void)b;
      }(),
      doctest::Contains("record 13"), IoError);
  o.shuffle = true;
  CHECK_THROWS_AS(IterableDataLoader(failing, o), ValueError);
  o.shuffle = false;
  o.rank = 2;
  o.world_size = 2;
  CHECK_THROWS_AS(IterableDataLoader(failing, o), ValueError);
}
