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
// The Accelerator drives it at pp_size > 1 (Note [pp step] in parallel/pp_step.cc): prepare keeps
// this rank's layers of a model that has a pipeline form (PipelineModel), and
// Accelerator::forward_backward runs this step over the prepared stages.
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
  // The modules (names as named_modules() gives them) whose parameters and buffers the layer
  // uses; empty: the module called `name`. A pipelined model keeps on each rank only the
  // parameters of its layers (Note [pp step] in parallel/pp_step.cc).
  std::vector<std::string> modules = {};
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
// The virtual stage of every layer under the same cut (what pipeline_chunks runs); the same
// ValueErrors.
std::vector<int> pipeline_stage_of(const std::vector<PipelineLayer>& layers, int stages,
                                   int chunks = 1, const std::vector<std::string>& split = {});

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
  // Called before each backward this rank runs, `last` for its final one (the Accelerator turns
  // the engine's gradient sync on there).
  std::function<void(bool last)> before_backward = {};
  // What each microbatch's loss (already divided by the microbatches) becomes before its backward
  // (the Accelerator: divided by the accumulation steps, scaled under fp16); the reported loss is
  // the unscaled one. Empty: as it is.
  std::function<Tensor(const Tensor&)> backward_loss = {};
};

// How the Accelerator pipelines a model at pp_size > 1 (AcceleratorConfig::pipeline): its layers
// cut into pp_size x chunks virtual stages (at `split`, or evenly), and the schedule and the
// microbatches of every Accelerator::forward_backward.
struct PipelinePlan {
  PipelineScheduleKind schedule = PipelineScheduleKind::OneFOneB;
  int microbatches = 1;
  int chunks = 1;                  // virtual stages per rank (interleaved 1F1B: >= 2)
  std::vector<std::string> split;  // the layers beginning virtual stages 1, 2, ...; empty: even
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
