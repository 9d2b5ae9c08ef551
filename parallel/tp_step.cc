// Note [tp step]
// Tensor parallelism as the "tp" slot of kApplyOrder (Note [apply order] in
// parallel/parallelize.h), active when the mesh's tp dimension is > 1. For each prepared model:
//  - check: the plan (ParallelOptions::tp_plan, AcceleratorConfig::tp_plan) is not empty;
//  - every rank of the tp group cuts its shards from the same full values: tp rank 0's, broadcast
//    over tp, as DDP starts every replica from rank 0's (a model built with another seed on some
//    rank would otherwise be a mix of several initialisations). A deferred parameter has no value
//    yet: every rank materialises its own piece from the same replayed generator (Note [deferred
//    parts] in nn/module.cc), so the tp ranks' generators must agree (check_deferred_seeds);
//  - dist::parallelize(model, tp group, plan): the parameters become this rank's tp shards
//    (ordinary tensors of the local shapes), and each parameter's layout along "tp" is recorded
//    (Shard(dim, chunks, unit) of its full length, or Replicate);
//  - whether the tp peers hold equal local shapes (uneven shards: not), for the replicated-gradient
//    check of flat spans;
//  - a deferred model is materialised here (each rank's pieces, one module at a time) unless the
//    data-parallel engine takes deferred models itself (ZeRO-3: each module's tp piece, then its
//    shard of that).
// The data-parallel step then wraps the model as it would any other. The ranks of one tp group are
// in different dp groups, so its collectives never mix tp shards.
#include "parallel/tp_step.h"

#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include "autograd/ops.h"
#include "core/env_contract.h"
#include "core/error.h"
#include "core/generator.h"
#include "parallel/materialize.h"

namespace accel::dist {

namespace {

constexpr std::string_view kTp = "tp";

class TpStep final : public ApplyStep {
 public:
  std::string_view name() const override { return kTp; }
  std::string_view dim() const override { return kTp; }
  bool active(const DeviceMesh& mesh) const override {
    return mesh.has_dim(kTp) && mesh.size(kTp) > 1;
  }

  void check(const ParallelModel&, const StepContext& ctx) const override {
    ACCEL_CHECK(!ctx.options.tp_plan.empty(), ValueError, "prepare", "tp_size ", ctx.mesh.size(kTp),
                " splits every prepared model over its tp group, but AcceleratorConfig::tp_plan "
                "is empty: give the module-name patterns and their styles "
                "(parallel/tensor_parallel.h; models::gpt_tp_plan() for examples/models.h's Gpt)");
  }

  void apply(ParallelModel& pm, const StepContext& ctx) override {
    const ProcessGroupPtr& tp = ctx.mesh.group(kTp);
    nn::Module& model = *pm.module();
    {
      NoGradGuard ng;
      for (auto& [name, p] : model.named_parameters()) {
        if (nn::is_deferred(p)) continue;
        Tensor t = p.contiguous();
        tp->broadcast(t, 0);
        if (!t.is_same(p)) p.copy_(t);
      }
    }
    if (nn::is_deferred(model)) check_deferred_seeds(model, *tp);
    parallelize(pm.module(), tp,
                pm.elsewhere.empty() ? ctx.options.tp_plan : stage_plan(pm, ctx.options.tp_plan));
    record_layouts(pm, tp->size(), tp->rank());
    if (!local_shapes_agree(model, *tp)) pm.even_shapes = false;
    // A deferred model the engine does not take: each parameter streams its tp piece
    // (parallel/materialize.h: the peak is the pieces plus a chunk).
    if (!ctx.engine_takes_deferred && nn::is_deferred(model)) materialize_local(model);
  }

 private:
  // Under pipeline parallelism (Note [pp step]): the plan for this stage, the modules it matches
  // by their exact names, but those whose parameters and buffers another stage holds (this rank
  // never runs them).
  static TpPlan stage_plan(const ParallelModel& pm, const TpPlan& plan) {
    TpPlan out;
    for (auto& [name, m] : pm.module()->named_modules()) {
      const std::string pre = name + ".";
      bool dropped = false;
      for (const auto& [entry, where] : pm.elsewhere) dropped = dropped || entry.rfind(pre, 0) == 0;
      if (dropped && m->named_parameters().empty() && m->named_buffers().empty()) continue;
      for (const auto& [pattern, style] : plan)
        if (module_name_matches(pattern, name)) {
          out.emplace_back(name, style);
          break;
        }
    }
    return out;
  }

  static void record_layouts(ParallelModel& pm, int size, int rank) {
    const std::map<std::string, TpShard> shards = tp_shards(*pm.module());
    for (auto& [name, p] : pm.module()->named_parameters()) {
      const auto it = shards.find(name);
      Shape global = p.sizes();
      Placement placement = Placement::replicate();
      if (it != shards.end() && size_t(it->second.dim) < global.size()) {
        const TpShard& s = it->second;
        // The global length comes from the plan (uneven pieces: not size x the local one).
        global[size_t(s.dim)] = s.full > 0 ? s.full : global[size_t(s.dim)] * size;
        placement = Placement::shard(s.dim, s.chunks, s.unit);
      }
      Layout l = Layout::whole(global, p.dtype());
      l.then(std::string(kTp), placement, size, rank);
      pm.layouts().extend(name, p, std::move(l));  // after the pp step's Stage
    }
    pm.layouts().aliases = pm.module()->tied_aliases();
  }

  // A deferred model's pieces are drawn on each rank from its own generator (no broadcast): the
  // tp peers must have built it from one state, or the pieces would be of different models. The
  // default generator's state after construction stands for the construction's: one MIN / MAX
  // all-reduce over tp of a hash of it; a ValueError on every rank otherwise.
  static void check_deferred_seeds(nn::Module& model, ProcessGroup& tp) {
    Device dev = kCPU;
    for (const Tensor& p : model.parameters()) dev = p.device();
    std::string state;
    {
      Generator& gen = default_generator();
      std::lock_guard<std::mutex> lk(gen.mutex());
      state = gen.state();
    }
    const double h = double(std::hash<std::string>{}(state) >> 11);  // exact in a double
    Tensor lo = full({1}, h, TensorOptions(kFloat64, dev)), hi = lo.clone();
    tp.all_reduce(lo, ReduceOp::Min);
    tp.all_reduce(hi, ReduceOp::Max);
    ACCEL_CHECK(lo.item<double>() == hi.item<double>(), ValueError, "prepare",
                "a model built under nn::DeferredInit is materialised piece by piece on each tp "
                "rank from its own default generator, but the tp ranks' generators differ after "
                "construction: seed every rank alike before building it (manual_seed or "
                "Accelerator::set_seed without device_specific)");
  }

  // Whether the tp peers' parameters have the same local shapes (uneven tp shards: not). One
  // MIN / MAX all-reduce over tp of a fingerprint of the shapes.
  static bool local_shapes_agree(nn::Module& model, ProcessGroup& tp) {
    double h = 0;
    int64_t i = 0;
    Device dev = kCPU;
    for (const Tensor& p : model.parameters()) {
      h += double(p.numel()) * double(++i % 1021 + 1);
      dev = p.device();
    }
    Tensor lo = full({1}, h, TensorOptions(kFloat64, dev)), hi = lo.clone();
    tp.all_reduce(lo, ReduceOp::Min);
    tp.all_reduce(hi, ReduceOp::Max);
    return lo.item<double>() == hi.item<double>();
  }
};

}  // namespace

std::unique_ptr<ApplyStep> make_tp_step() { return std::make_unique<TpStep>(); }

}  // namespace accel::dist
