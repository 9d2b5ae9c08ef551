// How a fixed global (effective) batch is spread over a world of any size: the per-rank batch and
// the gradient accumulation steps, for a job whose world changes between restarts (accel-run's
// elastic membership, docs/launcher.md "Elastic membership") and must keep training at the same
// effective batch. With the loader's batch = per_rank * world and split_batches, each optimizer
// step then sees the same global batch of samples in the same order at every world size.
#pragma once

#include <cstdint>
#include <string>

namespace accel::data {

struct BatchSplit {
  int64_t global_batch = 1;
  int64_t world = 1;
  int64_t per_rank = 1;      // samples per rank and micro-step
  int64_t accumulation = 1;  // micro-steps per optimizer step
  // per_rank * world: the prepared loader's batch with split_batches (one micro-step of all ranks).
  int64_t loader_batch() const { return per_rank * world; }
  // "per-rank batch 4 x accumulation 1 x world 3 = global batch 12", for the log.
  std::string describe() const;
};

// The largest per-rank batch <= max_per_rank (and the fewest accumulation steps) with
// per_rank * accumulation * world == global_batch. ValueError naming the sizes when world does
// not divide global_batch (no split keeps the effective batch: choose a global batch that every
// world size of the job divides, e.g. 12 for 2 or 3 machines) or an argument is below 1.
BatchSplit split_global_batch(int64_t global_batch, int64_t world, int64_t max_per_rank);

}  // namespace accel::data
