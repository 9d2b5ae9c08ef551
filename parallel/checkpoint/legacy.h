// The model tensors of a format-1 checkpoint (what save_state writes today) as a CheckpointSource:
// the same piece tables a format-2 index holds, built from state.json's records and the files'
// headers, read-only (docs/checkpointing.md, "Format 1 as pieces").
//
//   auto src = ckpt::open_legacy("ckpt/checkpoint_7");   // a folder holding state.json
//   const ckpt::TensorRecord& r = src->tensor("model.0.blocks.0.attn.qkv.weight");
//   Tensor w = empty(r.shape, TensorOptions(r.dtype));
//   src->read("model.0.blocks.0.attn.qkv.weight", Region::whole(r.shape), w);   // the full tensor
#pragma once

#include <memory>
#include <string>

#include "parallel/checkpoint/reader.h"

namespace accel::dist::ckpt {

// Note [format-1 checkpoints as pieces]
// Format 1 keeps a model in one of these layouts (state.json's records say which):
//   plain (one process, DDP, ZeRO-1/2)  model[_i].safetensors: every entry whole, tied names
//                                       once with `alias -> kept` in __metadata__;
//   ZeRO-3 / HSDP ("fsdp" record)       fsdp_model[_i]_rank<s>.safetensors for the S shard ranks
//                                       (HSDP: replica 0's only): entry <name> is the 1-D span
//                                       [lo, hi) of the flattened parameter (the record's spans;
//                                       absent when empty), and model[_i].safetensors the
//                                       replicated part (buffers, frozen parameters), whole;
//   tp ("tp" record)                    tp<t>/ for t < T, each holding one of the above (the
//                                       "inner" record), the parameters of "models[i]" cut
//                                       {dim, chunks} over T (torch.chunk per block), the others
//                                       whole at every t (tp0's are read).
// As pieces of global tensors "model.<i>.<name>": a whole entry is Region::whole(shape), a span
// Region::whole(shape).flat(lo, hi), and under tp both are prefixed with shard(dim, chunks, T, t)
// of the global shape (the tp-local shapes summed along dim, each checked against its part).
// Checks before anything is read (IoError naming the file and, where there is one, the tensor):
// state.json (read without following a link, at most kMaxIndexBytes) is a format-1 object whose
// records pass Note [checkpoint record validation] (parallel/checkpoint_records.h; the tp record
// with the same rules as the strategy's); no entry of the folder or of a tp<t>/ folder is a link,
// the only folders are tp<t>/ of a tp checkpoint and hold regular files only; every data file is
// opened without following a link and its header checked (a truncated file is refused naming it);
// each piece's entry has the dtype of the tensor's other pieces and its region's local shape; no
// tensor comes from two places. Tied aliases: meta()["aliases"] ({"model.0.head.weight":
// "model.0.embed.weight"}), from the files' metadata and state.json's "aliases" record (written
// since ZeRO-3 files keep no names of tied parameters). Pieces carry no CRCs (format 1 has none);
// read() checks coverage and each entry as the format-2 reader does. Optimizer state, gradients
// and the rest of state.json are not pieces here (meta() holds state.json as it is).
std::unique_ptr<CheckpointSource> open_legacy(const std::string& dir);

}  // namespace accel::dist::ckpt
