// Placements and regions (parallel/placement.h, Note [placements]) against brute force: every
// region is checked element by element against an explicit map local offset -> global offset
// built by cutting index tensors, and every overlap against the intersection of two such maps.
#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "accel.h"
#include "parallel/placement.h"
#include "tests/parallel/region_steps.h"

using namespace accel;
using dist::Layout;
using dist::Overlap;
using dist::Placement;
using dist::Region;
using dist::Segment;
using test::Steps;

namespace {

std::vector<int64_t> offsets_from_runs(const Region& r) {
  std::vector<int64_t> out(size_t(r.numel()), -1);
  int64_t expect_local = 0;
  for (const dist::Run& run : r.runs()) {
    CHECK(run.local == expect_local);  // runs cover the piece in order
    for (int64_t k = 0; k < run.n; ++k) out[size_t(run.local + k)] = run.global + k;
    expect_local = run.local + run.n;
  }
  CHECK(expect_local == r.numel());
  return out;
}

// Random cuts of `shape` (a random shape of 0-3 dims when none is given).
Steps random_steps(std::mt19937_64& rng, const Shape* shape = nullptr) {
  std::uniform_int_distribution<int> nd(0, 3), sz(0, 7), pick(0, 99);
  Steps s;
  if (shape) {
    s.global = *shape;
  } else {
    const int dims = nd(rng);
    for (int d = 0; d < dims; ++d) s.global.push_back(sz(rng) + (pick(rng) < 80 ? 1 : 0));
  }
  const int dims = int(s.global.size());
  const int ncuts = dims == 0 ? 0 : pick(rng) % 3;
  Shape box = s.global;
  for (int c = 0; c < ncuts; ++c) {
    const int64_t d = pick(rng) % dims;
    int64_t chunks = 1;
    if (box[size_t(d)] % 3 == 0 && box[size_t(d)] > 0 && pick(rng) < 30) chunks = 3;
    if (box[size_t(d)] % 2 == 0 && box[size_t(d)] > 0 && pick(rng) < 30) chunks = 2;
    const int64_t n = 1 + pick(rng) % 4, i = pick(rng) % n;
    s.cuts.push_back({d, chunks, n, i});
    const int64_t block = box[size_t(d)] / chunks;
    box[size_t(d)] = chunks * dist::shard_chunk(block, n, i).length;
  }
  int64_t numel = 1;
  for (int64_t b : box) numel *= b;
  if (pick(rng) < 40) {
    std::uniform_int_distribution<int64_t> at(0, numel);
    int64_t a = at(rng), b = at(rng);
    s.flat_lo = std::min(a, b);
    s.flat_hi = std::max(a, b);
  }
  return s;
}

}  // namespace

TEST_CASE("shard_chunk is torch.chunk") {
  // torch.arange(n).chunk(k): sizes of the pieces, trailing pieces empty.
  CHECK(dist::shard_chunk(10, 4, 0).length == 3);
  CHECK(dist::shard_chunk(10, 4, 3).length == 1);
  CHECK(dist::shard_chunk(5, 4, 2).begin == 4);
  CHECK(dist::shard_chunk(5, 4, 2).length == 1);
  CHECK(dist::shard_chunk(5, 4, 3).length == 0);  // torch.chunk(5, 4) gives 3 pieces
  CHECK(dist::shard_chunk(0, 3, 1).length == 0);
  for (int64_t size = 0; size <= 17; ++size)
    for (int64_t n = 1; n <= 5; ++n) {
      int64_t covered = 0;
      for (int64_t i = 0; i < n; ++i) {
        const dist::Chunk c = dist::shard_chunk(size, n, i);
        CHECK(c.begin == covered);
        covered += c.length;
      }
      CHECK(covered == size);
    }
  CHECK_THROWS_AS(dist::shard_chunk(4, 2, 2), ValueError);
}

TEST_CASE("regions equal brute force: qkv chunks, uneven shards, flat ranges, scalars") {
  Steps qkv{{12, 4}, {{0, 3, 2, 1}}};  // rows 2-3, 6-7, 10-11
  CHECK(qkv.region().local_shape() == Shape{6, 4});
  CHECK(offsets_from_runs(qkv.region()) == qkv.offsets());
  Steps uneven{{5, 3}, {{0, 1, 4, 2}}};  // torch.chunk(5, 4)[2] = row 4
  CHECK(offsets_from_runs(uneven.region()) == uneven.offsets());
  Steps empty{{5, 3}, {{0, 1, 4, 3}}};
  CHECK(empty.region().numel() == 0);
  CHECK(empty.region().runs().empty());
  Steps zero_flat{{6, 4}, {{1, 1, 2, 0}}, 3, 9};  // tp cols then a ZeRO range
  CHECK(offsets_from_runs(zero_flat.region()) == zero_flat.offsets());
  Steps scalar{{}, {}};
  CHECK(scalar.region().runs().size() == 1);
  // Rows held whole fold into one run: (50257, 768) on tp 4 is one run per rank.
  CHECK(Region::whole({50257, 768}).shard(0, 1, 4, 3).runs().size() == 1);
  CHECK(Region::whole({768, 3072}).shard(1, 1, 4, 1).runs().size() == 768);

  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const Steps s = random_steps(rng);
    INFO("trial " << trial << ", global " << shape_str(s.global));
    const Region r = s.region();
    CHECK(offsets_from_runs(r) == s.offsets());
    // JSON round trip.
    CHECK(Region::from_json(r.to_json(), s.global, "test") == r);
  }
}

// Note [uneven tp shards]: an attention projection is cut by whole heads (unit = head_dim):
// qkv of 5 heads of 8 rows (120, 40) over tp 4 keeps heads 0-1, 2-3, 4 and none of each block.
TEST_CASE("regions cut in whole units: heads of a packed qkv over tp 4") {
  const Shape qkv{120, 40};
  const int64_t want_heads[4] = {2, 2, 1, 0}, first_head[4] = {0, 2, 4, 5};
  for (int64_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    const Region reg = Region::whole(qkv).shard(0, 3, 4, r, 8);
    CHECK(reg.local_shape() == Shape{3 * 8 * want_heads[r], 40});
    std::vector<Segment> rows;
    for (int64_t b = 0; b < 3 && want_heads[r] > 0; ++b)
      rows.push_back({b * 8 * want_heads[r], b * 40 + first_head[r] * 8, 8 * want_heads[r]});
    CHECK(reg.segments()[0] == rows);
    // Through a layout: Placement::shard carries the unit.
    Layout l = Layout::whole(qkv, kFloat64).then("tp", Placement::shard(0, 3, 8), 4, int(r));
    CHECK(l.region == reg);
  }
  CHECK(Placement::shard(0, 3, 8).str() == "Shard(0, chunks=3, unit=8)");
  // A block that is not whole units is refused.
  CHECK_THROWS_AS(Region::whole({120, 40}).shard(0, 3, 4, 0, 16), ShapeError);
}

TEST_CASE("overlaps equal brute-force intersections, ascending in dst") {
  std::mt19937_64 rng(11);
  int nonempty = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Steps a = random_steps(rng);
    const Steps b = random_steps(rng, &a.global);  // another piece of the same tensor
    INFO("trial " << trial);
    const std::vector<int64_t> ga = a.offsets(), gb = b.offsets();
    std::map<int64_t, int64_t> where_a;  // global -> local in a
    for (size_t k = 0; k < ga.size(); ++k) where_a[ga[k]] = int64_t(k);
    std::vector<std::pair<int64_t, int64_t>> expect;  // (src, dst)
    for (size_t k = 0; k < gb.size(); ++k) {
      auto it = where_a.find(gb[k]);
      if (it != where_a.end()) expect.emplace_back(it->second, int64_t(k));
    }
    std::vector<std::pair<int64_t, int64_t>> got;
    int64_t last_dst = -1;
    for (const Overlap& o : dist::overlap(a.region(), b.region())) {
      CHECK(o.n > 0);
      CHECK(o.dst > last_dst);
      for (int64_t k = 0; k < o.n; ++k) got.emplace_back(o.src + k, o.dst + k);
      last_dst = o.dst + o.n - 1;
    }
    CHECK(got == expect);
    nonempty += !expect.empty();
  }
  CHECK(nonempty > 100);
  CHECK_THROWS_AS(dist::overlap(Region::whole({2, 3}), Region::whole({3, 2})), ShapeError);
}

TEST_CASE("layouts: steps, primary holder, holders") {
  dist::Layout l = dist::Layout::whole({96, 32}, kFloat64);
  l.then("tp", dist::Placement::shard(0, 3), 2, 1)
      .then("dp_shard", dist::Placement::flat(), 2, 0, 0, 768)
      .then("dp_replicate", dist::Placement::replicate(), 2, 1);
  CHECK(l.region.local_shape() == Shape{768});
  CHECK(!l.primary());  // replica 1 holds a copy; replica 0 writes it
  CHECK(l.holders() == 2);
  CHECK(l.str() == "tp: Shard(0, chunks=3), dp_shard: Flat, dp_replicate: Replicate");
  dist::LayoutTable table;
  Tensor t = zeros({768}, kFloat64);
  table.set("w", t, l);
  CHECK(table.find(t) == &table.at("w"));
  CHECK_THROWS_AS(table.set("w", t, l), ValueError);
  CHECK_THROWS_AS(table.at("v"), IndexError);
}

TEST_CASE("hostile region records are refused by name") {
  const Shape g{4, 6};
  auto bad = [&](const char* text) {
    try {
      Region::from_json(nlohmann::json::parse(text), g, "model.0.w piece 1");
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(bad(R"({"dims": [[[0, 0, 4]]]})").find("2 dimensions") == std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 0, 4]]]})").find("has 1 dimensions") != std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 0, 5]], [[0, 0, 6]]]})").find("inside size 4") != std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 2, 2], [2, 0, 2]], [[0, 0, 6]]]})").find("ascending") !=
        std::string::npos);
  CHECK(bad(R"({"dims": [[[1, 0, 2]], [[0, 0, 6]]]})").find("dense") != std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 0, 4]], [[0, 0, 6]]], "flat": [3, 30]})").find("outside a box") !=
        std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 0, "4"]], [[0, 0, 6]]]})").find("non-integer") != std::string::npos);
  CHECK(bad(R"([1, 2])").find("\"dims\"") != std::string::npos);
  CHECK(bad(R"({"dims": [[[0, 0, 4]], [[0, 0, 6]]]})").empty());
  CHECK(bad(R"({"dims": [[[0, 0, 9223372036854775807]], [[0, 0, 6]]]})").find("inside size") !=
        std::string::npos);
}
