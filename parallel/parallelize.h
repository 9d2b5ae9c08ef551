// The composition of parallel dimensions (Note [apply order]): each dimension is an apply step
// that turns a prepared model's parameters into this rank's local tensors and hooks, run in one
// fixed order over the device mesh, and every step records what it cut (the parameter's Layout,
// parallel/placement.h). Everything that depends on how a model is cut along the mesh (the
// checkpoint place of each tensor, exports that un-shard, loads that take this rank's part,
// gradient norms and the replicated-gradient check) is then generic over those records.
//
//   dist::ParallelPlan plan(mesh, {.tp_plan = models::gpt_tp_plan()}, std::move(engine_step));
//   plan.prepare_model(model);   // pp, tp, cp, data parallel: whichever are active
//   plan.unshard(0, "h.0.attn.qkv.weight", local);   // the full tensor, on every rank
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/device_mesh.h"
#include "comm/process_group.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/placement.h"
#include "parallel/tensor_parallel.h"

namespace accel::dist {

// Note [apply order]
// The only order in which parallel dimensions are applied to a model (torchtitan's parallelize):
//   pp             keep this rank's pipeline stage of the model: the layers of its virtual
//                  stages (PipelineModel), every other parameter and buffer dropped (pp_step.cc)
//   tp             cut planned Linear / Embedding parameters over the tp group (tp_step.cc)
//   cp             ring attention over the cp group around the planned attention modules, token
//                  positions mapped to the global ones (cp_step.cc); cuts no parameter: the cp
//                  ranks join the data-parallel engine's group (dp x cp)
//   data_parallel  the data-parallel engine over the ranks holding the same pieces (DDP, ZeRO 1-3,
//                  or a program's own): accelerate/ adapts its dist::Strategy to this slot
// A step sees ordinary local tensors from the steps before it, so every engine composes with every
// model step. A slot without a registered step is inactive, and its mesh dimension must then be 1
// (a ValueError naming the setting otherwise: "pp_size 2: pipeline parallelism has no registered
// step"; every slot has its built-in step today). Adding a dimension is one step registered for its
// slot (docs/parallelism.md, "Adding a parallel dimension").
inline constexpr std::string_view kApplyOrder[] = {"pp", "tp", "cp", "data_parallel"};

// What the steps read besides the mesh (typed: each step its own fields).
struct ParallelOptions {
  TpPlan tp_plan;         // the tp step's plan (AcceleratorConfig::tp_plan)
  CpPlan cp_plan;         // the cp step's plan (AcceleratorConfig::cp_plan)
  PipelinePlan pipeline;  // the pp step's cut and schedule (AcceleratorConfig::pipeline)
};

// A state entry another pipeline stage holds (the pp step dropped it here): its global shape,
// dtype and the pp coordinate holding it.
struct HeldElsewhere {
  Shape shape;
  DType dtype = kFloat32;
  int pp_rank = 0;
};

// One prepared model and the layout of each parameter along the mesh dimensions the model steps
// cut (pp, tp): one MeshStep per such dimension, Stage (pp), Shard(dim, chunks, unit) or
// Replicate (tp). Tensors without an entry are whole and replicated along every one of them.
class ParallelModel {
 public:
  explicit ParallelModel(std::shared_ptr<nn::Module> module) : module_(std::move(module)) {}
  const std::shared_ptr<nn::Module>& module() const { return module_; }
  LayoutTable& layouts() { return layouts_; }
  const LayoutTable& layouts() const { return layouts_; }
  // Whether the ranks of every cut dimension hold parameters of equal local shapes (uneven shards:
  // not; the replicated-gradient check then cannot compare flat spans). Steps clear it.
  bool even_shapes = true;
  // Pipeline parallelism (the pp step): this rank's model chunks in the order of its virtual
  // stages (empty: the model is not pipelined), and the state_dict entries other stages hold.
  std::vector<PipelineChunk> pipeline;
  std::map<std::string, HeldElsewhere> elsewhere;

 private:
  std::shared_ptr<nn::Module> module_;
  LayoutTable layouts_;
};

// What a step is applied with.
struct StepContext {
  const DeviceMesh& mesh;  // with groups
  const ParallelOptions& options;
  // The data-parallel step takes models built under nn::DeferredInit as they are and materialises
  // them itself (ZeRO-3: unit by unit); otherwise the model steps materialise their pieces.
  bool engine_takes_deferred = false;
};

class ApplyStep {
 public:
  virtual ~ApplyStep() = default;
  virtual std::string_view name() const = 0;  // its slot in kApplyOrder
  // The mesh dimension whose layouts it records (empty for the data-parallel step, whose engine
  // states its own layouts to the checkpoint).
  virtual std::string_view dim() const { return {}; }
  virtual bool active(const DeviceMesh& mesh) const = 0;
  // Everything checked before anything changes, identically on every rank (no collective).
  virtual void check(const ParallelModel& model, const StepContext& ctx) const {
    (void)model;
    (void)ctx;
  }
  // Turns this dimension's placements into local tensors and hooks; records the layouts.
  virtual void apply(ParallelModel& model, const StepContext& ctx) = 0;
  // The data-parallel step: whether its engine takes deferred models (StepContext).
  virtual bool takes_deferred() const { return false; }
};

using ApplyStepFactory = std::function<std::unique_ptr<ApplyStep>()>;
// Registers the step of `slot` (one of kApplyOrder but the last; the built-in: tp). ValueError for
// another slot or one registered already.
void register_apply_step(std::string_view slot, ApplyStepFactory make);

// The mesh dimension of every registered model step, active or not ({"pp", "tp"}): what a
// checkpoint saved inside an accumulation window must agree on with the mesh that resumes it.
std::vector<std::string> registered_model_dims();

class ParallelPlan {
 public:
  // The registered steps in kApplyOrder, `data_parallel` last. ValueError when a slot without a
  // step has a mesh dimension of size > 1 (naming its setting).
  ParallelPlan(const DeviceMesh& mesh, ParallelOptions options,
               std::unique_ptr<ApplyStep> data_parallel);
  ~ParallelPlan();

  // Runs every active step's check, then every active step's apply, in kApplyOrder; the model's
  // record is models().back() afterwards (nothing is recorded when a step throws).
  ParallelModel& prepare_model(const std::shared_ptr<nn::Module>& model);
  const std::vector<std::unique_ptr<ParallelModel>>& models() const { return models_; }
  const DeviceMesh& mesh() const { return mesh_; }

  // The mesh dimensions the active model steps record layouts along ({"pp", "tp"} at pp_size and
  // tp_size > 1; pp's are Stage placements: Note [pp step]); empty: every rank holds whole
  // models and the data-parallel engine alone decides everything.
  const std::vector<std::string>& cut_dims() const { return cut_dims_; }
  bool cuts_models() const { return !cut_dims_.empty(); }
  // The data-parallel dimension: the ranks holding the same pieces of every model ("dp").
  static std::string_view data_parallel_dim();

  // ---- generic over the recorded layouts (model index m in prepare order; names as
  // state_dict() names them) ----
  // nullptr: the tensor is whole and replicated along every cut dimension.
  const Layout* layout(size_t m, const std::string& name) const;
  // Where the tensor of local shape `local` lies in its global tensor (Note [format-2 strategy
  // seam] in accelerate/strategy.h): its region, whether this rank is its primary holder, whether
  // it is at coordinate 0 along every cut dimension (`lead`). ValueError when the recorded cut of
  // its global shape does not give `local`.
  TensorPlace place(size_t m, const std::string& name, const Shape& local) const;
  // Its global shape, given its local one.
  Shape full_shape(size_t m, const std::string& name, const Shape& local) const;
  // The global tensor from every rank's piece (collective over each Shard step's group, in
  // reverse order; uneven pieces padded): `local` itself when the tensor is not cut.
  Tensor unshard(size_t m, const std::string& name, const Tensor& local) const;
  // This rank's piece of the global tensor `full` (ShapeError naming the tensor when its shape
  // cannot be cut as recorded).
  Tensor part(size_t m, const std::string& name, const Tensor& full) const;
  // Whether state entry `name` of model m is held by another pipeline stage (dropped here).
  bool held_elsewhere(size_t m, const std::string& name) const;
  // The ranks of the cut dimensions holding the same piece, and whether this rank is the one at
  // coordinate 0 along each dimension that replicates it.
  int64_t holders(size_t m, const std::string& name) const;
  bool primary(size_t m, const std::string& name) const;
  // The cut dimensions along which `name` is replicated (Note [replicated gradient check]).
  std::vector<std::string> replicated_dims(size_t m, const std::string& name) const;
  // Every model's ranks hold equal local shapes along every cut dimension.
  bool even_shapes() const;

 private:
  const DeviceMesh& mesh_;
  ParallelOptions options_;
  std::vector<std::unique_ptr<ApplyStep>> steps_;  // active, in kApplyOrder; the engine last
  std::vector<std::string> cut_dims_;
  std::vector<std::unique_ptr<ParallelModel>> models_;
};

}  // namespace accel::dist
