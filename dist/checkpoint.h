// Building blocks of Accelerator::save_state / load_state: durable file writes, the atomic
// commit of a checkpoint directory, the `latest` pointer and total_limit rotation.
//
// Note [atomic checkpoints]
// A checkpoint is written into <parent>/.tmp-<name>/ (rank 0 creates it, every rank writes its
// own files there and fsyncs them, a barrier, rank 0 writes state.json last), then rank 0
// fsyncs the directory, renames it to <parent>/<name> and fsyncs <parent>. Only then, and
// only after every rank has finished (the barrier), is <parent>/latest replaced (write
// latest.tmp, fsync, rename, fsync parent), and only after that are old checkpoints deleted
// by rotation. A process killed at any point therefore leaves `latest` naming a complete
// checkpoint: the interrupted one is either a .tmp- directory (ignored, removed by the next
// save) or complete but not yet `latest`. A directory without state.json is never loaded.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace accel::dist {

constexpr const char* kCheckpointStateFile = "state.json";
constexpr const char* kLatestFile = "latest";
constexpr const char* kCheckpointPrefix = "checkpoint_";

// Writes `data` to path via path.tmp + fsync + rename + fsync of the directory.
void write_file_durable(const std::string& path, const std::string& data);
// Whole file; IoError naming the file when it cannot be read.
std::string read_file(const std::string& path);
void fsync_path(const std::string& path);  // a file or a directory

std::string checkpoint_tmp_dir(const std::string& final_dir);
// Removes a stale temp dir and creates it empty (rank 0).
void begin_checkpoint_dir(const std::string& tmp_dir);
// Renames tmp -> final (replacing an existing `final`), fsyncing as in the Note.
void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& final_dir);
// <parent>/latest := name.
void write_latest(const std::string& parent, const std::string& name);
std::optional<std::string> read_latest(const std::string& parent);
// A directory holding state.json is a checkpoint; a directory holding `latest` resolves to the
// checkpoint it names. IoError otherwise (naming what was looked for).
std::string resolve_checkpoint_dir(const std::string& dir);
// checkpoint_<N> directories in `parent`, sorted by N.
std::vector<std::string> list_checkpoints(const std::string& parent);
// Deletes the oldest checkpoint_<N> dirs of `parent` until `total_limit` remain, never `keep`.
void rotate_checkpoints(const std::string& parent, int total_limit, const std::string& keep);

// Test hook: called with a stage name ("begin", "rank_files", "state", "commit", "latest",
// "rotate") during save_state, so tests can kill a process at a precise point.
using CheckpointHook = std::function<void(const std::string& stage)>;
void set_checkpoint_hook(CheckpointHook hook);
void run_checkpoint_hook(const std::string& stage);

}  // namespace accel::dist
