// Note [pp step]
// Pipeline parallelism as the "pp" slot of kApplyOrder (Note [apply order] in
// parallel/parallelize.h), active when the mesh's pp dimension is > 1. A model pipelines through
// its pipeline form (dist::PipelineModel: its forward as a chain of named layers, each naming the
// modules it uses); ParallelOptions::pipeline (AcceleratorConfig::pipeline) cuts the layers into
// pp x chunks virtual stages, pp rank r holding virtual stages r, r + pp, ...
// (parallel/pipeline.h). Per prepared model:
//  - check (before anything changes, alike on every rank): the model has a pipeline form; the cut
//    and the schedule are valid for the sizes; every layer's modules exist; every parameter and
//    buffer belongs to a layer (a model the layers do not cover is refused by name, as it would
//    train only part of itself), and one tensor used by layers of two pp ranks (weights tied
//    across stages) is refused;
//  - apply: every parameter and buffer of the other ranks' layers is dropped (its storage freed,
//    its module's entry set to None, as torchtitan deletes the other stages' layers), so the
//    later steps and the engine see only this stage; the dropped entries' global shapes are kept
//    (ParallelModel::elsewhere: whole-model exports gather them, checkpoint loads expect them
//    absent); each kept entry's layout is Stage along pp (held by this pp coordinate only: weight
//    1 in gradient norms, written by this stage); ParallelModel::pipeline holds this rank's
//    chunks; a direct call of the model is refused (its forward would need the dropped layers):
//    Accelerator::forward_backward runs the stages.
// The parameters of one stage stay as the user built them on that rank: every rank builds the
// whole model from the same seed, so the stage equals the one-process model's layers. A model
// built under nn::DeferredInit materialises only the stage's tensors (with tp: tp's pieces of
// them; under ZeRO-3: the engine's shards).
#include "parallel/pp_step.h"

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "autograd/ops.h"
#include "core/error.h"
#include "nn/wrapper_label.h"
#include "parallel/materialize.h"

namespace accel::dist {

namespace {

constexpr std::string_view kPp = "pp";

bool owns(const std::string& module_pattern, const std::string& module) {
  if (module_pattern.empty()) return module.empty();
  return module == module_pattern || module.rfind(module_pattern + ".", 0) == 0;
}

// One parameter or buffer entry of a module: its full name, the module holding it and its name
// there (tied tensors: one entry per name).
struct Entry {
  std::string full, module, local;
  bool parameter = true;
  Tensor t;
};

std::vector<Entry> entries_of(nn::Module& root) {
  std::vector<Entry> out;
  for (auto& [mname, m] : root.named_modules()) {
    const std::string pre = mname.empty() ? "" : mname + ".";
    for (auto& [n, t] : m->named_parameters(false)) out.push_back({pre + n, mname, n, true, t});
    for (auto& [n, t] : m->named_buffers(false)) out.push_back({pre + n, mname, n, false, t});
  }
  return out;
}

struct Cut {
  std::vector<PipelineLayer> layers;
  std::vector<int> stage_of;           // virtual stage per layer
  std::map<std::string, int> rank_of;  // entry full name -> pp rank holding it
};

Cut cut_of(nn::Module& model, const PipelinePlan& plan, int pp) {
  const char* op = "prepare";
  auto* form = dynamic_cast<PipelineModel*>(&model);
  ACCEL_CHECK(form != nullptr, ValueError, op, "pp_size ", pp, " splits every prepared model into ",
              "pipeline stages, but ", model.type_name(),
              " has no pipeline form: derive it from dist::PipelineModel and list its forward's "
              "layers in pipeline_layers() (parallel/pipeline.h; examples/models.h's Gpt)");
  Cut c;
  c.layers = form->pipeline_layers();
  try {
    c.stage_of = pipeline_stage_of(c.layers, pp, plan.chunks, plan.split);
    (void)pipeline_schedule(plan.schedule, pp, 0, plan.microbatches, plan.chunks);
  } catch (const ValueError& e) {
    ACCEL_THROW(ValueError, op, "pp_size ", pp, ", AcceleratorConfig::pipeline, ",
                model.type_name(), ": ", e.what());
  }
  std::set<std::string> modules;
  for (auto& [n, m] : model.named_modules()) modules.insert(n);
  // Each layer's modules: PipelineLayer::modules, or the module named as the layer.
  std::vector<std::vector<std::string>> layer_modules;
  for (const PipelineLayer& l : c.layers) {
    layer_modules.push_back(l.modules.empty() ? std::vector{l.name} : l.modules);
    for (const std::string& mod : layer_modules.back())
      ACCEL_CHECK(modules.count(mod) != 0, ValueError, op, "pipeline layer '", l.name, "' of ",
                  model.type_name(), " names module '", mod, "', which the model does not have");
  }
  std::unordered_map<const TensorImpl*, std::pair<int, std::string>> by_tensor;
  for (const Entry& e : entries_of(model)) {
    int rank = -1;
    std::string layer;
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const PipelineLayer& l = c.layers[i];
      for (const std::string& mod : layer_modules[i]) {
        if (!owns(mod, e.module)) continue;
        const int r = c.stage_of[i] % pp;
        ACCEL_CHECK(rank < 0 || rank == r, ValueError, op, "'", e.full, "' of ", model.type_name(),
                    " is used by pipeline layers '", layer, "' (pp rank ", rank, ") and '", l.name,
                    "' (pp rank ", r, "): a tensor lives on one stage");
        rank = r;
        layer = l.name;
      }
    }
    ACCEL_CHECK(rank >= 0, ValueError, op, "pp_size ", pp, ": '", e.full, "' of ",
                model.type_name(),
                " belongs to no pipeline layer, so no stage would hold it: the layers of "
                "pipeline_layers() must cover the model (PipelineLayer::modules)");
    if (!e.t.defined()) continue;
    const auto [it, fresh] = by_tensor.emplace(e.t.impl(), std::make_pair(rank, e.full));
    ACCEL_CHECK(fresh || it->second.first == rank, ValueError, op, "'", e.full, "' of ",
                model.type_name(), " is tied to '", it->second.second, "', but pipeline stages ",
                it->second.first, " and ", rank,
                " hold them: tied tensors must be used on one stage");
    c.rank_of[e.full] = rank;
  }
  return c;
}

class PpStep final : public ApplyStep {
 public:
  std::string_view name() const override { return kPp; }
  std::string_view dim() const override { return kPp; }
  bool active(const DeviceMesh& mesh) const override {
    return mesh.has_dim(kPp) && mesh.size(kPp) > 1;
  }

  void check(const ParallelModel& pm, const StepContext& ctx) const override {
    nn::Module& model = *pm.module();
    const int pp = ctx.mesh.size(kPp);
    const std::string label = nn::call_wrapper_label(model);
    ACCEL_CHECK(label.find("pipeline") == std::string::npos, ValueError, "prepare",
                model.type_name(), " is prepared for pipeline parallelism already (", label,
                "): prepare each model once");
    (void)cut_of(model, ctx.options.pipeline, pp);
  }

  void apply(ParallelModel& pm, const StepContext& ctx) override {
    nn::Module& model = *pm.module();
    const int pp = ctx.mesh.size(kPp), rank = ctx.mesh.coordinate(kPp);
    const PipelinePlan& plan = ctx.options.pipeline;
    Cut c = cut_of(model, plan, pp);
    pm.pipeline = pipeline_chunks(c.layers, pp, rank, plan.chunks, plan.split);
    const std::map<std::string, std::string> aliases = model.tied_aliases();
    std::map<std::string, nn::Module*> modules;
    for (auto& [n, m] : model.named_modules()) modules[n] = m;
    const io::TensorDict saved = model.state_handles();  // parameters and persistent buffers
    {
      NoGradGuard ng;
      for (Entry& e : entries_of(model)) {
        const int owner = c.rank_of.count(e.full) ? c.rank_of.at(e.full) : rank;
        if (owner == rank) continue;
        if (e.t.defined()) {
          if (!aliases.count(e.full) && saved.count(e.full))
            pm.elsewhere[e.full] = {e.t.sizes(), e.t.dtype(), owner};
          // Frees the storage for every handle (an optimizer built before prepare holds one).
          if (e.t.numel() > 0)
            nn::assign_tensor_data(e.t, empty({0}, TensorOptions(e.t.dtype(), e.t.device())));
        }
        nn::Module& m = *modules.at(e.module);
        if (e.parameter)
          m.set_parameter(e.local, Tensor());
        else
          m.register_buffer(e.local, Tensor());
      }
    }
    // A deferred model: the stage's tensors get their values here (each its piece of the
    // one-process init, Note [deferred parts] in nn/module.cc), unless a later step does it for
    // its own pieces (tp) or the engine takes deferred models (ZeRO-3).
    const bool tp = ctx.mesh.has_dim("tp") && ctx.mesh.size("tp") > 1;
    if (!ctx.engine_takes_deferred && !tp && nn::is_deferred(model)) materialize_local(model);
    for (const auto& [name, t] : model.state_handles()) {
      if (aliases.count(name)) continue;
      Layout l = Layout::whole(t.sizes(), t.dtype());
      l.then(std::string(kPp), Placement::stage(), pp, rank);
      pm.layouts().set(name, t, std::move(l));
    }
    pm.layouts().aliases = model.tied_aliases();
    const std::string what = "pipeline stage " + std::to_string(rank) + " of " +
                             std::to_string(pp) + " (" + std::to_string(plan.chunks) +
                             " chunk(s) per rank)";
    const std::string type = model.type_name();
    const bool had = model.has_call_wrapper();
    model.wrap_call(
        [what, type, pp](nn::Module&, nn::Values&, const nn::CallFn&) -> std::vector<Tensor> {
          ACCEL_THROW(ValueError, "forward", type, " is split into pipeline stages (pp_size ", pp,
                      "; this rank holds ", what,
                      "): its forward needs layers other ranks hold. Run a training step with "
                      "Accelerator::forward_backward(model, inputs, targets, loss)");
        });
    const std::string inner = had ? nn::call_wrapper_label(model) : std::string();
    nn::set_call_wrapper_label(model, inner.empty() ? what : what + " around " + inner);
  }
};

}  // namespace

std::unique_ptr<ApplyStep> make_pp_step() { return std::make_unique<PpStep>(); }

}  // namespace accel::dist
