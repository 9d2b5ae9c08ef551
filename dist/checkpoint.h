// Building blocks of Accelerator::save_state / load_state: durable file writes, the atomic
// commit of a checkpoint directory, the `latest` pointer and total_limit rotation.
//
// Note [atomic checkpoints]
// A checkpoint is written into <parent>/.tmp-<name>/ (rank 0 creates it, every rank writes its
// own files there and fsyncs them, a barrier, rank 0 writes state.json last), then rank 0
// fsyncs the directory and commits it as <parent>/<name>:
//   * <name> does not exist: rename .tmp-<name> -> <name>, fsync <parent>;
//   * <name> exists (re-saving over a checkpoint, perhaps the one `latest` names): swap the two
//     directories in one step with renameat2(RENAME_EXCHANGE), fsync <parent>, then delete
//     .tmp-<name>, which now holds the old checkpoint. <name> is complete, old or new, at
//     every instant, and so is whatever `latest` names;
//   * where the filesystem cannot exchange (EINVAL: NFS, some FUSE): rename <name> ->
//     .tmp-<name>.old, then .tmp-<name> -> <name>. For the instant between the two, <name> is
//     missing, and resolve_checkpoint_dir() loads the complete .tmp-<name>.old instead.
// Only then, and only after every rank has finished (the barrier), is <parent>/latest replaced
// (write latest.tmp, fsync, rename, fsync parent), and only after that are old checkpoints
// deleted by rotation. A process killed at any point therefore leaves `latest` naming a
// complete checkpoint: the interrupted one is either a .tmp- directory (ignored, removed by the
// next save) or complete but not yet `latest`. A directory without state.json is never loaded,
// and `latest` must hold a plain directory name (no '/', not '.' or '..'): a checkpoint root
// only ever points inside itself.
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
// Makes tmp the checkpoint `final` (atomically replacing an existing one), as in the Note.
void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& final_dir);
// <parent>/.tmp-<name>.old: where the non-atomic fallback keeps the old checkpoint meanwhile.
std::string checkpoint_aside_dir(const std::string& final_dir);
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

// Test hook: called with a stage name ("begin", "rank_files", "state", "commit_swap" (inside
// commit_checkpoint_dir, after the new directory took the name, before the old one is
// deleted), "commit", "latest", "rotate") during save_state, so tests can kill a process at a
// precise point. Test-only; nothing in the library sets it.
using CheckpointHook = std::function<void(const std::string& stage)>;
void set_checkpoint_hook(CheckpointHook hook);
void run_checkpoint_hook(const std::string& stage);

}  // namespace accel::dist
