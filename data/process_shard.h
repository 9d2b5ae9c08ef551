// Which shard of the data this process reads, as the Accelerator's mesh says (Note [process data
// shard]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "data/sampler.h"

namespace accel::data {

// Note [process data shard]
// A loader built without rank / world_size shards over RANK / WORLD_SIZE: right when every rank
// reads different data, wrong when the ranks form a mesh in which several ranks must read the
// same batches (the tp peers of one data-parallel index). The Accelerator records here which
// shard of the data this process reads (its dp coordinate and size, and a description of the
// mesh) when that differs from the world; a loader that took RANK / WORLD_SIZE checks it when an
// epoch starts and raises a ValueError naming both instead of feeding tp peers different batches.
// A loader given rank / world_size explicitly is the caller's choice and is not checked.
struct ProcessDataShard {
  int64_t rank = 0;
  int64_t size = 1;
  std::string source;           // "the Accelerator's mesh has dp size 2 of world 4 (tp 2)"
  const void* owner = nullptr;  // who set it (clear_process_data_shard)
};
// Set the process's data shard (thread-safe); clear_process_data_shard(owner) clears it when
// `owner` set it last.
void set_process_data_shard(ProcessDataShard shard);
void clear_process_data_shard(const void* owner);
std::optional<ProcessDataShard> process_data_shard();
// ValueError from `op` when `s` (taken from RANK / WORLD_SIZE) is not the process data shard.
void check_env_shard(const ShardOptions& s, const char* op);

}  // namespace accel::data
