// Pipeline parallelism, the runtime (Note [pipeline schedules] in parallel/pipeline.cc): a model
// cut into consecutive chunks over the ranks of a pp group, microbatches flowing through them under
// a schedule (GPipe, 1F1B, interleaved 1F1B), activations and their gradients sent between
// neighbours, the loss on the last stage.
//
//   // rank r of pp holds model chunks r, r + pp, ... (virtual stages chunk * pp + r)
//   std::vector<dist::PipelineChunk> mine = {[&](const Tensor& x) { return stage(x); }};
//   dist::PipelineResult res = dist::pipeline_step(mine, pp_group, inputs, targets,
//       [](const Tensor& out, const Tensor& y) { return models::lm_loss(out, y); },
//       {.schedule = dist::PipelineScheduleKind::OneFOneB, .microbatches = 8});
//   // every parameter of this rank's chunks now holds the gradient of the batch's mean loss
//
// The Accelerator does not drive it yet (issue 38: the pp apply step, its checkpoints): a program
// cuts its model itself and runs its data-parallel engine over the ranks holding the same chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace accel::dist {

// One model chunk: its input activation (the microbatch itself on the first virtual stage) to its
// output activation (the last virtual stage's goes to the loss).
using PipelineChunk = std::function<Tensor(const Tensor&)>;

// A model's forward as a chain of named layers (its pipeline form): layer i's output is layer
// i + 1's input, the first takes the model's input, the last gives its output; running them in
// turn is the forward. What a stage runs is a run of consecutive layers (examples/models.h's Gpt:
// "embed", "blocks.0" ... "blocks.N-1", "head").
struct PipelineLayer {
  std::string name;  // what a split names: "blocks.3"
  PipelineChunk forward;
};
class PipelineModel {
 public:
  virtual ~PipelineModel() = default;
  virtual std::vector<PipelineLayer> pipeline_layers() = 0;
};

// This rank's chunks of `layers` cut into stages x chunks virtual stages (rank r holds virtual
// stages r, r + stages, ...): at `split`, the names of the layers that begin virtual stages 1, 2,
// ... in order (stages x chunks - 1 of them), or, when empty, into runs as even as the layer count
// allows (the first ones one layer longer). ValueError naming the layer or the counts when the
// split is not of consecutive, existing layers or leaves a stage empty.
std::vector<PipelineChunk> pipeline_chunks(const std::vector<PipelineLayer>& layers, int stages,
                                           int rank, int chunks = 1,
                                           const std::vector<std::string>& split = {});

enum class PipelineScheduleKind : uint8_t {
  GPipe,            // every forward, then every backward
  OneFOneB,         // 1F1B: warm-up forwards, then one forward and one backward in turn
  Interleaved1F1B,  // Megatron's interleaved 1F1B over several chunks per rank
};
std::string schedule_name(PipelineScheduleKind kind);  // "gpipe", "1f1b", "interleaved-1f1b"

struct PipelineAction {
  enum class Kind : uint8_t { Forward, Backward };
  Kind kind = Kind::Forward;
  int microbatch = 0;
  int chunk = 0;  // this rank's chunk (virtual stage chunk * stages + rank)
  bool operator==(const PipelineAction&) const = default;
};

// What rank `rank` of `stages` runs, in order, for `microbatches` microbatches of `chunks` model
// chunks per rank. ValueError for sizes < 1, interleaved 1F1B with one chunk, or with a number of
// microbatches that is not a multiple of `stages` (Megatron's rule).
std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, int stages, int rank,
                                              int microbatches, int chunks = 1);

using PipelineLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

struct PipelineOptions {
  PipelineScheduleKind schedule = PipelineScheduleKind::OneFOneB;
  int microbatches = 1;
};

struct PipelineResult {
  double loss = 0;       // the batch's mean loss (the mean of the microbatches'), on every rank
  double step_s = 0;     // this rank's wall time for the step
  double idle_s = 0;     // of which waiting for an activation or a gradient to arrive
  int64_t messages = 0;  // activations and gradients this rank sent
};

// One training step's forward and backward over `inputs` (read on the rank of virtual stage 0,
// pp rank 0) and `targets` (read on the rank of the last virtual stage, pp rank size - 1), each
// cut along dim 0 into `microbatches` equal parts. The loss of each microbatch is divided by the
// number of microbatches, so the gradients accumulated into the chunks' parameters are those of the
// batch's mean loss. Collective over `pp`: every rank passes as many chunks and the same options
// (ValueError naming what differs otherwise). A group of one runs the chunks in turn.
PipelineResult pipeline_step(const std::vector<PipelineChunk>& chunks, const ProcessGroupPtr& pp,
                             const Tensor& inputs, const Tensor& targets, const PipelineLoss& loss,
                             const PipelineOptions& options);

}  // namespace accel::dist
