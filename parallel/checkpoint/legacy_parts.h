// Internal to parallel/checkpoint/legacy*.cc: one folder of a format-1 checkpoint (the checkpoint
// itself, or one tp<t>/ of it) as tensors of tp-local shapes, before the tp parts are joined
// (Note [format-1 checkpoints as pieces] in legacy.h).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/legacy.h"
#include "parallel/checkpoint_records.h"

namespace accel::dist::ckpt::legacy {

// A piece of a tp-local tensor: entry `entry` of data file `file` holds it whole (hi < 0) or the
// elements [lo, hi) of the flattened tensor; entry_numel >= 0: the entry is 1-D of entry_numel
// elements, the piece being its elements [entry_offset, entry_offset + hi - lo) (a ZeRO-1/2
// bucket slice).
struct LocalPiece {
  int64_t file = 0;
  std::string entry;
  int64_t lo = 0, hi = -1;
  int64_t entry_offset = 0, entry_numel = -1;
};

struct LocalTensor {
  DType dtype = kFloat32;
  bool typed = false;  // a ZeRO-3 parameter of no elements has no entry to take a dtype from
  Shape shape;
  bool flat = false;
  std::vector<LocalPiece> pieces;
  // Cut over tp as parameter `param` of model `model` is (model tensors, and optimizer slots of
  // more than 0 dimensions); model < 0: never cut (steps, param groups): tp index 0's is read.
  int64_t model = -1;
  std::string param;
};
using LocalPart = std::map<std::string, LocalTensor>;  // by global name

// The data files of one checkpoint, by path relative to it ("tp1/model.safetensors").
class Files {
 public:
  virtual ~Files() = default;
  virtual int64_t add(const std::string& rel) = 0;
  // Opened never through a link, its header checked (IoError naming it otherwise).
  virtual const io::SafetensorsFile& open(int64_t id) = 0;
  virtual bool exists(const std::string& rel) const = 0;  // never through a link
};

// One folder and the record of the strategy that wrote it.
struct Folder {
  std::string base;                                // "" or "tp<t>/"
  const nlohmann::json* record = nullptr;          // state.json, or its tp.inner
  int64_t world = 1;                               // that strategy's ranks (world_size / T)
  const ckpt_records::FsdpRecord* fsdp = nullptr;  // its ZeRO-3 record, or null
  size_t num_optimizers = 0;
  bool tp = false;                             // one of T > 1 tp folders
  std::string state_path;                      // state.json, for messages
  std::map<std::string, std::string> aliases;  // tied global names of the model: alias -> kept
};

// Adds the optimizer state of `folder` (Note [format-1 checkpoints as pieces]) to `part`, which
// holds its model tensors already.
void add_optimizers(Files& files, const Folder& folder, const LegacyContext& ctx, LocalPart& part);

// The gradients of an accumulation window (a save with sync_gradients false) that `folder` (tp
// index t of T) holds, per rank of its strategy: whole, named by world rank (rank r of the folder
// is world rank r * T + t: tp is the mesh's innermost dimension).
void add_window_grads(Files& files, const Folder& folder, size_t num_models, int64_t T, int64_t t,
                      const LocalPart& model, LocalPart& part);

std::string indexed(const std::string& stem, size_t i);  // "model", "model_1", ...
std::string rank_file(const std::string& stem, size_t i,
                      int64_t rank);  // <stem>[_i]_rank<r>.safetensors

}  // namespace accel::dist::ckpt::legacy
