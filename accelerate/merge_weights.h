// `accel-run merge-weights` (Accelerate's `accelerate merge-weights`): the model of an accel
// checkpoint saved on any mesh as one safetensors file, or as a sharded set under a size cap with
// transformers' model.safetensors.index.json; and the reverse split of one file into such a set.
// What load_model, transformers' from_pretrained and safetensors.torch.load_file read.
//
//   merge::merge_weights("ckpt", "out/model.safetensors", {});  // one file
//   merge::Options o;
//   o.max_shard_bytes = merge::parse_size("5GB");
//   merge::merge_weights("ckpt/checkpoint_3", "out", o);           // a sharded set
//   merge::split_weights("model.safetensors", "sharded", merge::parse_size("2GB"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accel::merge {

// transformers' names: one file, or shards "model-00001-of-00003.safetensors" and their index
// {"metadata": {"total_size": <bytes of tensor data>}, "weight_map": {"<tensor>": "<file>"}}.
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// A size as transformers' convert_file_size_to_int reads it: a count of bytes, or an integer with
// a unit: KiB / MiB / GiB (powers of 2), KB / MB / GB (powers of 10), case-insensitive, except
// that a lowercase final "b" after K, M or G means bits ("5Gb": 625,000,000 bytes). ValueError
// naming the text otherwise (and for 0).
uint64_t parse_size(const std::string& text);

struct Options {
  uint64_t max_shard_bytes = 0;  // 0: one file; else shards of at most this many tensor bytes
  size_t model = 0;              // the checkpoint's prepared model (save_state's order)
};

struct Written {
  std::string path;                // the file, or the folder holding the set
  std::vector<std::string> files;  // the files written (names in the folder, or the file)
  bool indexed = false;            // a model.safetensors.index.json was written
  size_t tensors = 0;              // entries stored (tied names are metadata, not entries)
  uint64_t total_bytes = 0;        // bytes of tensor data
};

// Note [merge-weights]
// Input: a checkpoint folder (state.json of format 1, read as pieces by
// parallel/checkpoint/legacy.h, or index.json of format 2), or a folder whose `latest` names one,
// resolved as load_state resolves it. Output: the tensors of model `model` under their state-dict
// names (what save_model writes and safetensors.torch.load_file shows), in name order, each read
// whole from the pieces that hold it (a ZeRO-3 span, a tp shard: Region overlaps) and written
// before the next is read: one tensor in memory at a time. Tied names stay metadata entries
// `alias -> kept` in the file holding the kept tensor (Note [tied tensors in files]); every file's
// metadata also says {"format": "pt"} (transformers refuses safetensors metadata without it).
//   * `out` a file name ending in .safetensors (or an existing file) without a cap: that file;
//   * otherwise `out` is a folder: model.safetensors, or, when a cap splits the tensors into more
//     than one shard (transformers' greedy rule in name order: a new shard when the next tensor
//     would pass the cap; a tensor larger than the cap alone), the shards and the index.
// Atomic: a file is written as a temporary and renamed (io::SafetensorsWriter); a folder is
// written in full into a new folder beside it, then swapped in with one rename (the old one, if
// any, deleted after). The folder must be missing, empty, or hold only files this tool writes
// (model.safetensors, the index, model-NNNNN-of-NNNNN.safetensors): anything else, or a link, is
// an IoError naming it, before anything is read.
Written merge_weights(const std::string& checkpoint, const std::string& out, const Options& opts);

// One safetensors file (through a link too: a Hugging Face cache) as a sharded set in the folder
// `out_dir` (as above), its metadata kept: tied aliases in the shard of the tensor they name,
// every other key in every shard.
Written split_weights(const std::string& file, const std::string& out_dir,
                      uint64_t max_shard_bytes);

}  // namespace accel::merge
