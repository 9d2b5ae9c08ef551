// The composition of parallel dimensions; see parallel/parallelize.h (Note [apply order]).
#include "parallel/parallelize.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "autograd/ops.h"
#include "core/error.h"
#include "parallel/cp_step.h"
#include "parallel/pp_step.h"
#include "parallel/tp_step.h"

namespace accel::dist {

namespace {

// Per slot of kApplyOrder but the last: the setting sizing its mesh dimension and what it is,
// for the refusal of a dimension > 1 whose step is not built.
struct SlotInfo {
  std::string_view slot, setting, what;
};
constexpr SlotInfo kSlots[] = {
    {"pp", "pp_size", "pipeline parallelism has no registered step"},
    {"tp", "tp_size", "tensor parallelism has no registered step"},
    {"cp", "cp_size", "context parallelism has no registered step"},
};

struct Registry {
  std::mutex mu;
  std::map<std::string, ApplyStepFactory, std::less<>> steps;
};

Registry& registry() {
  // The built-in steps, registered here rather than by static objects (a static library drops
  // object files nothing references).
  static Registry* r = [] {
    auto* x = new Registry;  // never destroyed: steps may be registered from static objects
    x->steps.emplace("pp", [] { return make_pp_step(); });
    x->steps.emplace("tp", [] { return make_tp_step(); });
    x->steps.emplace("cp", [] { return make_cp_step(); });
    return x;
  }();
  return *r;
}

int dim_size(const DeviceMesh& mesh, std::string_view dim) {
  return mesh.has_dim(dim) ? mesh.size(dim) : 1;
}

TpShard tp_shard_of(const Placement& p, int64_t full) {
  TpShard s;
  s.dim = p.dim;
  s.chunks = p.chunks;
  s.unit = p.unit;
  s.full = full;
  return s;
}

}  // namespace

void register_apply_step(std::string_view slot, ApplyStepFactory make) {
  const bool known = std::any_of(std::begin(kSlots), std::end(kSlots),
                                 [&](const SlotInfo& s) { return s.slot == slot; });
  ACCEL_CHECK(known, ValueError, "register_apply_step", "'", slot,
              "' is not a slot a step can be registered for (pp, tp, cp; the data-parallel slot "
              "is the engine's)");
  ACCEL_CHECK(make != nullptr, ValueError, "register_apply_step", "no factory for '", slot, "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  ACCEL_CHECK(r.steps.emplace(std::string(slot), std::move(make)).second, ValueError,
              "register_apply_step", "slot '", slot, "' has a step already");
}

// dp x cp: the cp ranks hold whole replicas of what the model steps cut and partial gradients
// (Note [context-parallel groups] in comm/device_mesh.cc).
std::string_view ParallelPlan::data_parallel_dim() { return "dp_cp"; }

ParallelPlan::ParallelPlan(const DeviceMesh& mesh, ParallelOptions options,
                           std::unique_ptr<ApplyStep> data_parallel)
    : mesh_(mesh), options_(std::move(options)) {
  ACCEL_CHECK(data_parallel != nullptr, ValueError, "parallelize", "no data-parallel step");
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  for (const SlotInfo& s : kSlots) {
    const auto it = r.steps.find(s.slot);
    if (it == r.steps.end()) {
      const int n = dim_size(mesh_, s.slot);
      ACCEL_CHECK(n == 1, ValueError, "parallelize", s.setting, " ", n, ": ", s.what);
      continue;
    }
    std::unique_ptr<ApplyStep> step = it->second();
    ACCEL_CHECK(step != nullptr && step->name() == s.slot, ValueError, "parallelize",
                "the step registered for '", s.slot, "' is ", step ? step->name() : "null");
    if (!step->active(mesh_)) continue;
    if (!step->dim().empty()) cut_dims_.emplace_back(step->dim());
    steps_.push_back(std::move(step));
  }
  steps_.push_back(std::move(data_parallel));
}

ParallelPlan::~ParallelPlan() = default;

std::vector<std::string> registered_model_dims() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<std::string> out;
  for (const SlotInfo& s : kSlots)
    if (const auto it = r.steps.find(s.slot); it != r.steps.end())
      if (const std::unique_ptr<ApplyStep> step = it->second(); step && !step->dim().empty())
        out.emplace_back(step->dim());
  return out;
}

ParallelModel& ParallelPlan::prepare_model(const std::shared_ptr<nn::Module>& model) {
  ACCEL_CHECK(model != nullptr, ValueError, "prepare", "model is null");
  auto pm = std::make_unique<ParallelModel>(model);
  const StepContext ctx{mesh_, options_, steps_.back()->takes_deferred()};
  for (const auto& step : steps_) step->check(*pm, ctx);
  // Recorded first: the engine's prepare may ask for the places of this model's tensors.
  models_.push_back(std::move(pm));
  try {
    for (const auto& step : steps_) step->apply(*models_.back(), ctx);
  } catch (...) {
    models_.pop_back();
    throw;
  }
  return *models_.back();
}

const Layout* ParallelPlan::layout(size_t m, const std::string& name) const {
  if (m >= models_.size()) return nullptr;
  const LayoutTable& t = models_[m]->layouts();
  // By the name the step recorded (named_parameters()'); tied aliases are not looked up, as the
  // engines name every tensor by its first name.
  return t.contains(name) ? &t.at(name) : nullptr;
}

TensorPlace ParallelPlan::place(size_t m, const std::string& name, const Shape& local) const {
  TensorPlace p;
  const Layout* l = layout(m, name);
  // Coordinate 0 along every cut dimension but those of a pipeline Stage: the stage holding the
  // tensor is its only holder along pp.
  p.lead = true;
  for (const std::string& d : cut_dims_) {
    bool staged = false;
    if (l)
      for (const MeshStep& s : l->steps)
        staged = staged || (s.dim == d && s.placement.kind == Placement::Kind::Stage);
    p.lead = p.lead && (staged || mesh_.coordinate(d) == 0);
  }
  if (!l || l->global_shape.size() != local.size()) {
    p.region = Region::whole(local);
    p.primary = p.lead;
    for (const std::string& d : cut_dims_)
      p.layout += (p.layout.empty() ? "" : ", ") + d + ": Replicate";
    return p;
  }
  p.region = l->region;
  ACCEL_CHECK(p.region.local_shape() == local, ValueError, "checkpoint", "the piece of '", name,
              "' has shape ", local, ", its recorded cut (", l->str(), ") of ", l->global_shape,
              " gives ", p.region.local_shape());
  p.primary = l->primary();
  p.layout = l->str();
  return p;
}

Shape ParallelPlan::full_shape(size_t m, const std::string& name, const Shape& local) const {
  const Layout* l = layout(m, name);
  return l && l->global_shape.size() == local.size() ? l->global_shape : local;
}

Tensor ParallelPlan::unshard(size_t m, const std::string& name, const Tensor& local) const {
  const Layout* l = layout(m, name);
  if (!l) return local;
  // The regions before each step: step i cuts the box of regions[i] along its dim.
  std::vector<Region> before{Region::whole(l->global_shape)};
  for (const MeshStep& s : l->steps)
    before.push_back(s.placement.kind == Placement::Kind::Shard
                         ? before.back().shard(s.placement.dim, s.placement.chunks, s.size,
                                               s.coordinate, s.placement.unit)
                         : before.back());
  Tensor t = local;
  NoGradGuard ng;
  for (size_t i = l->steps.size(); i-- > 0;) {
    const MeshStep& s = l->steps[i];
    if (s.placement.kind != Placement::Kind::Shard) continue;
    const int64_t full = before[i].box_shape()[size_t(s.placement.dim)];
    t = tp_gather(t.contiguous(), tp_shard_of(s.placement, full), mesh_.group(s.dim)).contiguous();
  }
  return t;
}

Tensor ParallelPlan::part(size_t m, const std::string& name, const Tensor& full) const {
  const Layout* l = layout(m, name);
  if (!l) return full;
  Tensor t = full;
  for (const MeshStep& s : l->steps) {
    if (s.placement.kind != Placement::Kind::Shard) continue;
    const Placement& p = s.placement;
    ACCEL_CHECK(p.dim >= 0 && p.dim < t.dim() && t.size(p.dim) % (int64_t(p.chunks) * p.unit) == 0,
                ShapeError, "load_model", "parameter '", name, "' of shape ", t.shape_str(),
                " cannot be split along dim ", p.dim, " into ", p.chunks, " block(s) of units of ",
                p.unit, " over ", s.size, " ", s.dim, " ranks");
    if (s.size > 1) t = tp_piece(t, tp_shard_of(p, t.size(p.dim)), s.coordinate, s.size);
  }
  return t;
}

bool ParallelPlan::held_elsewhere(size_t m, const std::string& name) const {
  return m < models_.size() && models_[m]->elsewhere.count(name) != 0;
}

int64_t ParallelPlan::holders(size_t m, const std::string& name) const {
  if (const Layout* l = layout(m, name)) return l->holders();
  int64_t n = 1;
  for (const std::string& d : cut_dims_) n *= mesh_.size(d);
  return n;
}

bool ParallelPlan::primary(size_t m, const std::string& name) const {
  if (const Layout* l = layout(m, name)) return l->primary();
  for (const std::string& d : cut_dims_)
    if (mesh_.coordinate(d) != 0) return false;
  return true;
}

std::vector<std::string> ParallelPlan::replicated_dims(size_t m, const std::string& name) const {
  const Layout* l = layout(m, name);
  if (!l) return cut_dims_;
  std::vector<std::string> out;
  for (const MeshStep& s : l->steps)
    if (s.placement.kind == Placement::Kind::Replicate) out.push_back(s.dim);
  return out;
}

bool ParallelPlan::even_shapes() const {
  for (const auto& pm : models_)
    if (!pm->even_shapes) return false;
  return true;
}

}  // namespace accel::dist
