// The parallel dimensions of a run on the mesh (core/parallelism.h's table, Note [parallel
// dimensions]) and the check that every rank was started with the same ones (Note [mesh
// agreement]).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/process_group.h"
#include "core/parallelism.h"
#include "parallel/context_parallel.h"
#include "parallel/tensor_parallel.h"

namespace accel::dist {

// Note [mesh agreement]
// Every rank builds its mesh from its own environment and config. Ranks started with different
// sizes (ACCEL_TP_SIZE exported on one machine only) or different plans (another ZeRO stage, tp
// plan or mixed precision) would build different meshes and call new_group for different rank
// lists in different orders: each would wait the whole collective timeout and then blame
// new_group. So before any subgroup exists the ranks all-gather, over the world group, the values
// that must be equal (the sizes as given, unset included, and fingerprints of the plan) and
// compare them: a difference is a DistError on every rank naming the setting (its variable, flag
// and config key) and which ranks hold which value. One all-gather of a few int64s per
// Accelerator.
struct AgreedValue {
  std::string what;       // "tp_size (ACCEL_TP_SIZE, --tp_size, parallelism_config...)"
  int64_t value = 0;      // a size (-1: unset), a number, or a fingerprint
  bool printable = true;  // false for fingerprints: messages say "differs" without the value
};

// The sizes of `given` (Note [parallel dimensions]), labelled with their settings.
std::vector<AgreedValue> mesh_size_values(const ParallelismConfig& given);
// FNV-1a of `s`, for AgreedValue fingerprints.
uint64_t fingerprint(std::string_view s);
// A fingerprint of a tp plan: patterns, styles and their options in order.
uint64_t plan_fingerprint(const TpPlan& plan);
uint64_t plan_fingerprint(const CpPlan& plan);
// Collective over `world` (a no-op for a world of one or a null group). DistError on every rank
// when some value differs between ranks, naming it and the ranks holding each value.
void check_agreement(const ProcessGroupPtr& world, const char* op,
                     const std::vector<AgreedValue>& values);

}  // namespace accel::dist
