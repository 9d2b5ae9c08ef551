// The records a format-1 state.json keeps about sharded checkpoint state, parsed and checked
// before anything is computed from them: the ZeRO-1/2 bucket layouts and the ZeRO-3 spans record
// (Note [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h, their one reader). No
// tensors, no file I/O: tests/fuzz/fuzz_ckpt_records.cc runs the
// same code on arbitrary bytes.
//
// Note [checkpoint record validation]
// state.json comes from a file that may be truncated, edited or hostile. Every number in it is
// later a divisor, a size or an offset (a bucket of N elements over W ranks is read in slices of
// N / W; a span [lo, hi) of rank q is copied to [lo, hi) of the parameter), so each is checked
// here, before any arithmetic, against the invariants the writer guarantees:
//   ZeRO-1/2 layout, per bucket [used, numel]: 1 <= used <= numel <= kMaxRecordElements,
//     numel a multiple of the saved world size W and numel - used < W (the padding the writer
//     adds), so every rank's slice numel / W is at least 1; "stage" 1, 2 or 3;
//   ZeRO-3 record: "world" equal to state.json's world_size; per parameter a unique non-empty
//     name, a shape of at most kMaxRecordRank non-negative sizes whose product does not
//     overflow, exactly W spans [lo, hi] with 0 <= lo <= hi <= numel, and the non-empty spans,
//     sorted, tile [0, numel) exactly: no overlap (two ranks claiming an element: one of them
//     would be read and the other silently dropped) and no gap (an element no rank holds would
//     be left uninitialised); optimizer keys "<model>:<name>" naming saved parameters, unique
//     within an optimizer.
// A violation is an IoError naming the file and the field ("zero[0].buckets[3]",
// "fsdp.models[0].params[2].spans"). What the records say about the files (each slice's size and
// dtype) is checked when the file is read; what they say about the model (shapes, bucket sizes)
// is compared with this run's by the strategy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace accel::dist::ckpt_records {

// Bounds of what a record may declare (far above any real model, far below overflow).
constexpr int64_t kMaxRecordWorld = int64_t(1) << 20;
constexpr int64_t kMaxRecordElements = int64_t(1) << 50;
constexpr size_t kMaxRecordRank = 64;

struct ZeroBucketRecord {
  int64_t used = 0;   // elements holding parameters
  int64_t numel = 0;  // padded to a multiple of the saved world size
};
struct ZeroLayoutRecord {
  int stage = 1;
  std::vector<ZeroBucketRecord> buckets;
};

// The "zero" entry of a state.json object: empty when absent, else one entry per optimizer (null
// for an optimizer that is not ZeRO's). `saved_world` is state.json's world_size.
std::vector<std::optional<ZeroLayoutRecord>> parse_zero_record(const nlohmann::json& state,
                                                               size_t num_optimizers,
                                                               int64_t saved_world,
                                                               const std::string& file);

struct FsdpParamRecord {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<std::pair<int64_t, int64_t>> spans;  // per saved rank: [lo, hi)
};
struct FsdpKeyRecord {
  size_t model = 0;
  std::string name;
};
struct FsdpRecord {
  int64_t world = 1;      // ranks that wrote shards (an HSDP run: its shard group's size)
  int64_t replicate = 1;  // HSDP: replicas of each shard (world x replicate ranks ran)
  std::vector<std::vector<FsdpParamRecord>> models;      // saved order
  std::vector<std::vector<std::string>> optimizer_keys;  // "<model>:<name>" per parameter
  std::vector<std::vector<FsdpKeyRecord>> optimizers;    // the same, parsed
};

// The "fsdp" entry of state.json (`rec`); `saved_world` is state.json's world_size.
FsdpRecord parse_fsdp_record(const nlohmann::json& rec, int64_t saved_world,
                             const std::string& file);

}  // namespace accel::dist::ckpt_records
