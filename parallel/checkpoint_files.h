// What the checkpoint readers (format 1's state file: parallel/checkpoint/legacy.h) share with
// the facade's commit protocol (Note [atomic checkpoints] in accelerate/checkpoint.h):
// the name of the state file and a durable fsync.
#pragma once

#include <string>

namespace accel::dist {

constexpr const char* kCheckpointStateFile = "state.json";

// fsync of a regular file or a directory (not through a link); IoError naming it.
void fsync_path(const std::string& path);

}  // namespace accel::dist
