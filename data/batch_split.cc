#include "data/batch_split.h"

#include "core/error.h"

namespace accel::data {

std::string BatchSplit::describe() const {
  return "per-rank batch " + std::to_string(per_rank) + " x accumulation " +
         std::to_string(accumulation) + " x world " + std::to_string(world) + " = global batch " +
         std::to_string(global_batch);
}

BatchSplit split_global_batch(int64_t global_batch, int64_t world, int64_t max_per_rank) {
  ACCEL_CHECK(global_batch >= 1 && world >= 1 && max_per_rank >= 1, ValueError,
              "split_global_batch", "global batch ", global_batch, ", world ", world,
              " and max_per_rank ", max_per_rank, " must all be at least 1");
  ACCEL_CHECK(global_batch % world == 0, ValueError, "split_global_batch", "world size ", world,
              " does not divide the global batch ", global_batch,
              ": no per-rank batch and accumulation keep it (choose a global batch that every "
              "world size of the job divides)");
  const int64_t per_world = global_batch / world;
  BatchSplit s{global_batch, world, 1, per_world};
  // The fewest micro-steps whose per-rank batch fits.
  for (int64_t a = 1; a <= per_world; ++a) {
    if (per_world % a == 0 && per_world / a <= max_per_rank) {
      s.per_rank = per_world / a;
      s.accumulation = a;
      break;
    }
  }
  return s;
}

}  // namespace accel::data
