// Deferred parameters materialised by region (Note [deferred regions] in parallel/materialize.cc):
// a model built under nn::DeferredInit gets memory and values only for what this rank keeps of
// each parameter (its tensor-parallel piece, then its ZeRO-3 flat range), streamed from the
// replayed initialisers, so no rank ever holds a whole module or unit of it.
//
//   { nn::DeferredInit d; model = std::make_shared<Gpt>(cfg); }
//   dist::parallelize(model, tp_group, plan);  // records each piece's region, allocates nothing
//   dist::materialize_local(*model);           // each rank allocates its pieces only
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/module.h"
#include "parallel/placement.h"

namespace accel::dist {

// The cut of a deferred parameter's full value that parallelize records for a tp piece
// (nn::Module::set_deferred_part): the elements of `region` of the full value, in the piece's
// shape (region.local_shape()). materialize_regions reads the region back from the record.
struct RegionCut {
  Region region;
  Tensor operator()(const Tensor& full) const;
};

// What a rank keeps of one deferred parameter: the elements of `region` (a Region of the
// parameter's full initial value) written into `dst`, contiguous, region.numel() elements, in
// region order; any dtype and device (rounded as copy_ rounds).
struct RegionTarget {
  Region region;
  Tensor dst;
};
// Asked for each own deferred parameter of a module: `local` is what the parameter holds after
// tensor parallelism (its RegionCut's region, or the whole parameter). nullopt: not wanted now
// (the parameter stays deferred).
using TargetFor = std::function<std::optional<RegionTarget>(
    const std::string& name, const Tensor& parameter, const Region& local)>;

// Fills the targets of `m`'s own deferred parameters from its replayed initialisers
// (nn::Module::stream_own_parameters: values equal eager construction's). Returns the names
// filled; those parameters are left without memory for the caller to point at their values. A
// module with a part cut other than by RegionCut is materialised whole instead
// (materialize_own_parameters): nothing is returned and its parameters hold their values.
// ShapeError when a target's region is not of the parameter's full shape or dst's size is not
// the region's.
std::vector<std::string> materialize_regions(nn::Module& m, const TargetFor& target_for,
                                             Generator* gen = nullptr);

// Every deferred parameter of `model` gets memory for what it holds (its tp piece, or itself)
// and its values, module by module. Peak: the pieces and a chunk (plus one module whole for a
// module whose initialisers do not stream). How DDP, ZeRO-1/2 and plain tp materialise a
// deferred model (ZeRO-3 streams each rank's flat range itself: parallel/fsdp.cc).
void materialize_local(nn::Module& model, Generator* gen = nullptr);

// Collective over `group`: deferred values are drawn on every rank from each module's
// construction-time generator state, with no broadcast, so ranks built from differing states
// would hold pieces of different models. One MIN / MAX all-reduce of a hash per module; a
// ValueError on every rank naming the first module whose state differs (`op` in brackets).
void check_deferred_agreement(nn::Module& model, ProcessGroup& group, const char* op);

}  // namespace accel::dist
