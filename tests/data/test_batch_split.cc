// data::split_global_batch (data/batch_split.h): the per-rank batch and accumulation that keep a
// global batch at any world size (accel-run's elastic membership restarts at another world).
#include <doctest/doctest.h>

#include "core/error.h"
#include "data/batch_split.h"

using namespace accel;

TEST_CASE("split_global_batch keeps the global batch at every world size that divides it") {
  for (int64_t world : {1, 2, 3, 4, 6, 12}) {
    for (int64_t cap : {1, 2, 3, 4, 5, 12, 100}) {
      CAPTURE(world);
      CAPTURE(cap);
      const data::BatchSplit s = data::split_global_batch(12, world, cap);
      CHECK(s.per_rank * s.accumulation * s.world == 12);
      CHECK(s.per_rank <= cap);
      CHECK(s.loader_batch() == s.per_rank * world);
      // The largest per-rank batch that fits: no larger divisor of 12 / world is <= cap.
      for (int64_t b = s.per_rank + 1; b <= 12 / world; ++b)
        CHECK(((12 / world) % b != 0 || b > cap));
    }
  }
  const data::BatchSplit two = data::split_global_batch(12, 2, 4);
  CHECK((two.per_rank == 3 && two.accumulation == 2));
  CHECK(two.describe() == "per-rank batch 3 x accumulation 2 x world 2 = global batch 12");
  const data::BatchSplit three = data::split_global_batch(12, 3, 4);
  CHECK((three.per_rank == 4 && three.accumulation == 1));
  // A prime quotient above the cap: one sample per rank and micro-step.
  const data::BatchSplit prime = data::split_global_batch(14, 2, 3);
  CHECK((prime.per_rank == 1 && prime.accumulation == 7));
}

TEST_CASE("split_global_batch refuses a world that does not divide the global batch") {
  CHECK_THROWS_WITH_AS(data::split_global_batch(12, 5, 12),
                       doctest::Contains("world size 5 does not divide the global batch 12"),
                       ValueError);
  CHECK_THROWS_WITH_AS(data::split_global_batch(12, 0, 4), doctest::Contains("at least 1"),
                       ValueError);
  CHECK_THROWS_WITH_AS(data::split_global_batch(12, 2, 0), doctest::Contains("at least 1"),
                       ValueError);
}
