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
// only ever points inside itself. Every file and folder of the protocol is created, renamed and
// removed relative to opened folders, as Note [safe file access] in core/file_io.h says: a link
// planted at `latest.tmp` or in a checkpoint folder redirects nothing.
//
// Note [what save_state replaces]
// save_state(dir) replaces the folder dir as a whole: whatever it held is deleted. So on every
// rank, before anything is written, it refuses (IoError naming the folder and what is in it)
// unless dir, and the .tmp-<name> and .tmp-<name>.old folders the protocol uses beside it, are
//   * missing or empty, or
//   * a checkpoint folder of accel's: it holds the marker file .accel_checkpoint (which
//     begin_checkpoint_dir() writes first into every new checkpoint) or a state.json of accel's
//     (a JSON object with "format" and "step"), and nothing but regular files accel writes into
//     a checkpoint: those listed in state.json's "files" (the manifest rank 0 writes; a
//     tensor-parallel run's tp<t>/ folders, each holding only files the manifest lists as
//     "tp<t>/<file>" in format 1: parallel/checkpoint/legacy.h), or, for a
//     checkpoint of an earlier version without a manifest, files named as accel names them
//     (model*, optimizer*, scheduler* .safetensors, grads*, zero_*, fsdp_* _rank<r>.safetensors,
//     loader*[_rank<r>].json, rng_rank<r>.txt, custom_*_rank<r>.json, and their temporaries). An
//     unfinished save (the marker and no state.json) may hold any regular files.
// A user's notes.txt, a logs/ folder or a link inside makes it refuse, and so does a link at dir
// itself (the swap would replace the link, not the folder it names). Rotation (total_limit)
// deletes only checkpoint_<N> folders that pass the same test.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "parallel/checkpoint_files.h"  // kCheckpointStateFile, fsync_path

namespace accel::dist {

constexpr const char* kLatestFile = "latest";
constexpr const char* kCheckpointPrefix = "checkpoint_";
// Written first into every checkpoint folder (Note [what save_state replaces]).
constexpr const char* kCheckpointMarker = ".accel_checkpoint";
// The most load_state reads of one metadata file (Note [safe file access] in core/file_io.h):
// state.json, loader positions and registered objects; the RNG state; `latest`.
constexpr uint64_t kMaxCheckpointFileBytes = uint64_t(64) << 20;
constexpr uint64_t kMaxRngFileBytes = uint64_t(1) << 20;
constexpr uint64_t kMaxLatestBytes = 4096;

// Writes `data` to path atomically and durably: a unique temporary in the same folder, fsync,
// rename over path, fsync of the folder (file_io::AtomicFile).
void write_file_durable(const std::string& path, const std::string& data);
// Whole file of at most max_bytes; IoError naming the file when it cannot be read, is a link, a
// FIFO, a device or larger than that.
std::string read_file(const std::string& path, uint64_t max_bytes = kMaxCheckpointFileBytes);

// Why save_state must not replace the folder `dir`, or nothing when it may (Note [what
// save_state replaces]).
std::optional<std::string> replace_refusal(const std::string& dir);
// IoError unless save_state may replace final_dir and use its temporary folders.
void check_save_target(const std::string& final_dir);

std::string checkpoint_tmp_dir(const std::string& final_dir);
// Creates the parent when missing, removes a stale temp dir and creates it holding only the
// marker (rank 0).
void begin_checkpoint_dir(const std::string& tmp_dir);
// IoError naming the first symbolic link among `dir`'s entries and its tp<t>/ folders' entries:
// accel never writes a link into a checkpoint, and the safetensors reader follows links (for
// Hugging Face caches), so a load refuses a checkpoint holding one before reading anything.
void refuse_checkpoint_links(const std::string& dir, const char* op);
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
// Deletes the oldest checkpoint_<N> dirs of `parent` until `total_limit` remain, never `keep`
// and never a folder replace_refusal() objects to.
void rotate_checkpoints(const std::string& parent, int total_limit, const std::string& keep);

// Test hook: called with a stage name ("begin", "rank_files", "state", "commit_swap" (inside
// commit_checkpoint_dir, after the new directory took the name, before the old one is
// deleted), "commit", "latest", "rotate") during save_state, so tests can kill a process at a
// precise point. Test-only; nothing in the library sets it.
using CheckpointHook = std::function<void(const std::string& stage)>;
void set_checkpoint_hook(CheckpointHook hook);
void run_checkpoint_hook(const std::string& stage);

}  // namespace accel::dist
