// dist::DeviceMesh (comm/device_mesh.h) as a layout, in one process: which world ranks form each
// group for several meshes of 8 ranks on 2 machines of 4, rank <-> coordinates, flattened
// dimensions, placement warnings, the group factory protocol; and the inference of unset sizes
// (core/parallelism.h, Note [mesh sizes]).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "comm/device_mesh.h"
#include "core/parallelism.h"

using accel::MeshSizes;
using accel::ParallelismConfig;
using accel::dist::DeviceMesh;
using accel::dist::MeshDim;
using Groups = std::vector<std::vector<int>>;

namespace {

// The mesh of `sizes` as rank `rank` of machines of `local` processes sees it.
DeviceMesh mesh_of(const MeshSizes& sizes, int rank = 0, int local = 4) {
  return accel::dist::parallelism_mesh(sizes, rank, local);
}

// Every rank's view agrees with the groups: coordinates round-trip, each dimension's groups
// partition the world, a rank's group holds it at the index of its coordinate.
void check_consistent(const MeshSizes& sizes, int local) {
  const int world = int(sizes.product());
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const DeviceMesh m = mesh_of(sizes, r, local);
    const std::vector<int> c = m.coordinates(r);
    REQUIRE(c.size() == 5);
    CHECK(m.rank_at(c) == r);
    for (const char* dim :
         {"pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "dp_cp_tp"}) {
      CAPTURE(dim);
      const std::vector<int> g = m.group_ranks(dim);
      CHECK(int(g.size()) == m.size(dim));
      CHECK(std::is_sorted(g.begin(), g.end()));
      const auto at = std::find(g.begin(), g.end(), r);
      REQUIRE(at != g.end());
      CHECK(int(at - g.begin()) == m.coordinate(dim));
      std::set<int> seen;
      for (const auto& group : m.groups(dim))
        for (int x : group) CHECK(seen.insert(x).second);
      CHECK(int(seen.size()) == world);
    }
  }
}

}  // namespace

TEST_CASE("mesh layout: world 8 on 2 machines of 4, groups of every dimension") {
  struct Case {
    MeshSizes sizes;
    Groups replicate, shard, tp, dp;
  };
  const std::vector<Case> cases = {
      // HSDP x TP: tp pairs inside a machine, dp_shard inside a machine, replicas across.
      {{2, 2, 2},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}}},
      // Today's ZeRO: one shard group over the world.
      {{1, 8, 1},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}}},
      // HSDP: shard inside each machine, replicate across the two.
      {{2, 4, 1},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}}},
      // TP 4 fills a machine; dp_shard across the machines.
      {{1, 2, 4},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
      // Replicas of 2-rank shard groups.
      {{4, 2, 1},
       {{0, 2, 4, 6}, {1, 3, 5, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}}},
  };
  for (const Case& c : cases) {
    const DeviceMesh m = mesh_of(c.sizes, 5);
    CAPTURE(m.describe());
    CHECK(m.world_size() == 8);
    CHECK(m.groups("dp_replicate") == c.replicate);
    CHECK(m.groups("dp_shard") == c.shard);
    CHECK(m.groups("tp") == c.tp);
    CHECK(m.groups("dp") == c.dp);
    CHECK(m.size("dp") == c.sizes.dp_replicate * c.sizes.dp_shard);
    // None of these needlessly crosses a machine (Note [mesh placement]).
    CHECK(m.placement_warnings().empty());
    check_consistent(c.sizes, 4);
  }
}

TEST_CASE("mesh layout: rank <-> coordinates, this rank's groups") {
  const DeviceMesh m = mesh_of({2, 2, 2}, 5);
  CHECK(m.describe() == "pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 2");
  CHECK(m.rank() == 5);
  CHECK(m.coordinates(5) == std::vector<int>{0, 1, 0, 0, 1});
  CHECK(m.rank_at({0, 1, 0, 0, 1}) == 5);
  CHECK(m.rank_at({0, 0, 1, 0, 1}) == 3);
  CHECK(m.coordinate("dp_replicate") == 1);
  CHECK(m.coordinate("dp_shard") == 0);
  CHECK(m.coordinate("tp") == 1);
  CHECK(m.coordinate("dp") == 2);  // (replicate 1, shard 0) row-major over 2 x 2
  CHECK(m.group_ranks("tp") == std::vector<int>{4, 5});
  CHECK(m.group_ranks("dp_shard") == std::vector<int>{5, 7});
  CHECK(m.group_ranks("dp_replicate") == std::vector<int>{1, 5});
  CHECK(m.group_ranks("dp") == std::vector<int>{1, 3, 5, 7});
  CHECK(m.group_ranks("tp", 2) == std::vector<int>{2, 3});
  // Odd sizes: world 12 = 3 x 2 x 2, tp innermost.
  const DeviceMesh odd = mesh_of({3, 2, 2}, 11, 12);
  CHECK(odd.coordinates(11) == std::vector<int>{0, 2, 1, 0, 1});
  CHECK(odd.group_ranks("dp_replicate") == std::vector<int>{3, 7, 11});
  check_consistent({3, 2, 2}, 12);
  check_consistent({1, 3, 4}, 4);
}

// Note [context-parallel groups] in comm/device_mesh.cc: the engine's groups take the cp ranks in.
TEST_CASE("mesh with cp: dp_cp and dp_shard_cp span the cp ranks, dp does not") {
  MeshSizes sizes;
  sizes.dp_replicate = 2;
  sizes.dp_shard = 2;
  sizes.cp = 2;
  const DeviceMesh m = mesh_of(sizes, 5, 8);
  CHECK(m.describe() == "pp 1 x dp_replicate 2 x dp_shard 2 x cp 2 x tp 1");
  CHECK(m.coordinates(5) == std::vector<int>{0, 1, 0, 1, 0});
  CHECK(m.group_ranks("cp") == std::vector<int>{4, 5});
  CHECK(m.group_ranks("dp") == std::vector<int>{1, 3, 5, 7});
  CHECK(m.group_ranks("dp_shard_cp") == std::vector<int>{4, 5, 6, 7});
  CHECK(m.group_ranks("dp_cp") == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  check_consistent(sizes, 8);
}

// pp is the outermost dimension: the ranks of one stage are a contiguous block, dp_cp_tp.
TEST_CASE("mesh with pp: stages are the outermost blocks, dp_cp_tp is one stage's ranks") {
  MeshSizes sizes;
  sizes.pp = 2;
  sizes.dp_shard = 2;
  sizes.tp = 2;
  const DeviceMesh m = mesh_of(sizes, 5, 8);
  CHECK(m.describe() == "pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2");
  CHECK(m.coordinates(5) == std::vector<int>{1, 0, 0, 0, 1});
  CHECK(m.group_ranks("pp") == std::vector<int>{1, 5});
  CHECK(m.group_ranks("dp") == std::vector<int>{5, 7});
  CHECK(m.group_ranks("dp_cp_tp") == std::vector<int>{4, 5, 6, 7});
  check_consistent(sizes, 8);
}

TEST_CASE("mesh flatten: torch's mesh[dims]._flatten(), named or joined") {
  DeviceMesh m = mesh_of({2, 2, 2}, 6);
  m.flatten({"dp_shard", "tp"});
  CHECK(m.has_dim("dp_shard_tp"));
  CHECK(m.size("dp_shard_tp") == 4);
  CHECK(m.groups("dp_shard_tp") == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(m.coordinate("dp_shard_tp") == 2);      // rank 6: shard 1, tp 0
  m.flatten({"dp_replicate", "tp"}, "rep_tp");  // need not be adjacent
  CHECK(m.groups("rep_tp") == Groups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(m.dims().size() == 5);  // flattened dimensions are not among dims()
  auto fails = [&](const std::vector<std::string>& dims, const std::string& name,
                   const char* want) {
    CAPTURE(want);
    CHECK_THROWS_WITH_AS(m.flatten(dims, name), doctest::Contains(want), accel::ValueError);
  };
  fails({"tp", "dp_shard"}, "x", "out of mesh order");
  fails({"tp", "tp"}, "x", "given twice");
  fails({"ep"}, "x", "has no dimension 'ep'");
  fails({"dp"}, "x", "flattened dimensions cannot be flattened again");
  fails({"dp_shard", "tp"}, "", "has a dimension 'dp_shard_tp' already");
  fails({"tp"}, "Bad Name", "lower-case letters");
  fails({}, "x", "no dimensions");
}

TEST_CASE("mesh: bad input is a ValueError naming the dimension, rank or size") {
  using accel::ValueError;
  CHECK_THROWS_WITH_AS(DeviceMesh({}, 0, 1), doctest::Contains("at least one dimension"),
                       ValueError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 0}}, 0, 1), doctest::Contains("'a' has size 0"),
                       ValueError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 2}, {"a", 2}}, 0, 1),
                       doctest::Contains("'a' is given twice"), ValueError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 2}, {"b", 2}}, 4, 1),
                       doctest::Contains("rank 4 is not in the mesh a 2 x b 2 of 4 ranks"),
                       ValueError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 2}}, 0, 0), doctest::Contains("local_world_size 0"),
                       ValueError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 1 << 16}, {"b", 1 << 16}}, 0, 1),
                       doctest::Contains("more than 2^30 ranks"), ValueError);
  const DeviceMesh m({{"a", 2}, {"b", 3}}, 1, 6);
  CHECK_THROWS_WITH_AS(m.size("c"), doctest::Contains("has no dimension 'c' (it has a, b)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(m.coordinates(6), doctest::Contains("rank 6"), ValueError);
  CHECK_THROWS_WITH_AS(m.rank_at({0, 3}), doctest::Contains("coordinate 3 along 'b'"), ValueError);
  CHECK_THROWS_WITH_AS(m.rank_at({0}), doctest::Contains("got 1 coordinates"), ValueError);
  CHECK_FALSE(m.has_groups());
  CHECK_THROWS_WITH_AS(m.group("a"), doctest::Contains("layout only"), ValueError);
}

TEST_CASE("mesh placement: groups that need not span machines are warned about, not refused") {
  // dp_shard 4 on machines of 2, with 2 replicas: each shard group crosses a machine boundary,
  // where replicas across machines and shard groups inside would not.
  const DeviceMesh a = mesh_of({2, 4, 1}, 0, 2);
  REQUIRE(a.placement_warnings().size() == 1);
  const std::string wa = a.placement_warnings()[0];
  CHECK_MESSAGE(wa.find("the dp_shard groups") != std::string::npos, wa);
  CHECK_MESSAGE(wa.find("ranks {0,1,2,3} on machines 0 to 1") != std::string::npos, wa);
  CHECK_MESSAGE(wa.find("of 2 processes (LOCAL_WORLD_SIZE)") != std::string::npos, wa);
  // tp 3 on machines of 4 (world 12): the group {3,4,5} straddles machines 0 and 1.
  const DeviceMesh b = mesh_of({1, 4, 3}, 0, 4);
  REQUIRE(b.placement_warnings().size() == 1);
  const std::string wb = b.placement_warnings()[0];
  CHECK_MESSAGE(wb.find("the tp groups") != std::string::npos, wb);
  CHECK_MESSAGE(wb.find("ranks {3,4,5} on machines 0 to 1") != std::string::npos, wb);
  // Both at once: dp_shard 2 x cp 1 x tp 4 on machines of 2 with 2 replicas.
  CHECK(mesh_of({2, 2, 4}, 0, 2).placement_warnings().size() == 2);
  // Nothing outside to swap with: tp 8 over two machines, or ZeRO over all of them.
  CHECK(mesh_of({1, 1, 8}, 0, 4).placement_warnings().empty());
  CHECK(mesh_of({1, 8, 1}, 0, 2).placement_warnings().empty());
  // One machine: nothing crosses.
  CHECK(mesh_of({2, 2, 3}, 0, 12).placement_warnings().empty());
}

namespace {

// A process group that only knows its rank and size (the factory's result).
struct FakeGroup : accel::dist::ProcessGroup {
  std::vector<int> ranks;
  FakeGroup(int rank, std::vector<int> r)
      : ProcessGroup(rank, int(r.size())), ranks(std::move(r)) {}
  std::string_view backend() const override { return "fake"; }
  using WorkPtr = accel::dist::WorkPtr;
  using Tensor = accel::Tensor;
  WorkPtr all_reduce_async(const Tensor&, accel::dist::ReduceOp) override { return nullptr; }
  WorkPtr broadcast_async(const Tensor&, int) override { return nullptr; }
  WorkPtr all_gather_async(const Tensor&, const Tensor&) override { return nullptr; }
  WorkPtr reduce_scatter_async(const Tensor&, const Tensor&, accel::dist::ReduceOp) override {
    return nullptr;
  }
  WorkPtr barrier_async() override { return nullptr; }
  WorkPtr send_async(const Tensor&, int, int) override { return nullptr; }
  WorkPtr recv_async(const Tensor&, int, int) override { return nullptr; }
  uint64_t next_seq() const override { return 0; }
};

}  // namespace

TEST_CASE("mesh groups: the factory sees every group of every dimension in order") {
  const int me = 5;
  Groups calls;
  auto factory = [&](const std::vector<int>& ranks) -> accel::dist::ProcessGroupPtr {
    calls.push_back(ranks);
    const auto at = std::find(ranks.begin(), ranks.end(), me);
    if (at == ranks.end()) return nullptr;  // a members-only factory
    return std::make_shared<FakeGroup>(int(at - ranks.begin()), ranks);
  };
  DeviceMesh m = accel::dist::parallelism_mesh({2, 2, 2}, me, 4, factory);
  CHECK(m.has_groups());
  // pp, dp_replicate, dp_shard, cp, tp, then the flattened dp and dp_cp_tp (the world at pp 1),
  // each group in order, on every rank alike; dp_shard_cp and dp_cp span the ranks of dp_shard
  // and dp at cp 1 and share their groups.
  Groups want;
  for (const char* dim : {"pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_cp_tp"})
    for (const auto& g : m.groups(dim)) want.push_back(g);
  CHECK(calls == want);
  CHECK(calls.size() == 8 + 4 + 4 + 8 + 4 + 2 + 1);
  CHECK(m.group("dp_shard_cp") == m.group("dp_shard"));
  CHECK(m.group("dp_cp") == m.group("dp"));
  for (const char* dim : {"dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp"}) {
    CAPTURE(dim);
    const auto* g = dynamic_cast<const FakeGroup*>(m.group(dim).get());
    REQUIRE(g != nullptr);
    CHECK(g->ranks == m.group_ranks(dim));
    CHECK(g->rank() == m.coordinate(dim));
  }
  calls.clear();
  m.flatten({"dp_shard", "tp"}, "shard_tp");
  CHECK(calls == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(dynamic_cast<const FakeGroup*>(m.group("shard_tp").get())->ranks ==
        std::vector<int>{4, 5, 6, 7});

  // A factory that returns no group, or the wrong one, for this rank's group is a DistError.
  using accel::DistError;
  auto none = [](const std::vector<int>&) -> accel::dist::ProcessGroupPtr { return nullptr; };
  CHECK_THROWS_WITH_AS(accel::dist::parallelism_mesh({1, 2, 1}, 1, 2, none),
                       doctest::Contains("returned no group for pp ranks {1}"), DistError);
  auto wrong_size = [](const std::vector<int>& ranks) -> accel::dist::ProcessGroupPtr {
    return std::make_shared<FakeGroup>(0, std::vector<int>(ranks.size() + 1, 0));
  };
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 2}}, 0, 2, wrong_size),
                       doctest::Contains("expected size 2, rank 0"), DistError);
  CHECK_THROWS_WITH_AS(DeviceMesh({{"a", 2}}, 0, 2, accel::dist::GroupFactory{}),
                       doctest::Contains("factory is empty"), accel::ValueError);
}

TEST_CASE("mesh sizes: unset sizes are inferred, wrong products name every size and the world") {
  struct Case {
    ParallelismConfig p;
    int world;
    MeshSizes want;
  };
  const std::vector<Case> ok = {
      {{}, 8, {1, 8, 1}},         // no mesh asked for: dp_shard is the world
      {{1, 1, 1}, 8, {1, 8, 1}},  // Accelerate's all-ones: the same
      {{std::nullopt, 1, std::nullopt}, 4, {1, 4, 1}},
      {{std::nullopt, std::nullopt, 2}, 8, {1, 4, 2}},  // dp_shard fills the rest
      {{2, std::nullopt, std::nullopt}, 8, {2, 4, 1}},
      {{2, std::nullopt, 2}, 8, {2, 2, 2}},
      {{2, 2, 2}, 8, {2, 2, 2}},
      {{std::nullopt, 4, 2}, 8, {1, 4, 2}},  // dp_replicate defaults to 1
      {{8, std::nullopt, std::nullopt}, 8, {8, 1, 1}},
      {{}, 1, {1, 1, 1}},
  };
  for (const Case& c : ok) {
    CAPTURE(accel::describe_sizes(c.p));
    CAPTURE(c.world);
    std::string why;
    const auto got = accel::infer_mesh_sizes(c.p, c.world, &why);
    REQUIRE_MESSAGE(got.has_value(), why);
    CHECK(*got == c.want);
  }
  struct Bad {
    ParallelismConfig p;
    int world;
    std::vector<std::string> said;
  };
  const std::vector<Bad> bad = {
      {{2, 2, 2},
       4,
       {"dp_replicate_size 2, dp_shard_size 2, cp_size unset, tp_size 2",
        "= 8 is not the world size 4"}},
      {{std::nullopt, 4, std::nullopt},
       8,
       {"dp_replicate_size unset, dp_shard_size 4, cp_size unset, tp_size unset",
        "= 4 is not the world size 8"}},
      {{3, std::nullopt, std::nullopt},
       8,
       {"dp_replicate_size 3, dp_shard_size unset, cp_size unset, tp_size unset", "world size 8",
        "dp_replicate_size x cp_size x tp_size = 3 does not divide it"}},
      {{2, std::nullopt, 3}, 8, {"tp_size 3", "= 6 does not divide it"}},
      {{0, std::nullopt, std::nullopt}, 8, {"must be >= 1", "dp_replicate_size 0"}},
      {{std::nullopt, std::nullopt, -2}, 8, {"must be >= 1", "tp_size -2"}},
      {{1 << 20, 1 << 20, 1 << 20}, 8, {"exceeds the world size 8"}},
      {{}, 0, {"world size must be >= 1"}},
  };
  for (const Bad& b : bad) {
    CAPTURE(accel::describe_sizes(b.p));
    std::string why;
    CHECK_FALSE(accel::infer_mesh_sizes(b.p, b.world, &why).has_value());
    for (const std::string& s : b.said) CHECK_MESSAGE(why.find(s) != std::string::npos, why);
  }
}
