// Note [cp step]
// Context parallelism as the "cp" slot of kApplyOrder (Note [apply order] in
// parallel/parallelize.h), active when the mesh's cp dimension is > 1. It cuts no parameter: each
// rank of a cp group holds the same model (after the tp step: the same tp pieces) and computes on
// its 2L tokens of every sequence (Note [zig-zag sequence sharding] in context_parallel.h), so its
// gradients are partial sums over the sequence that the data-parallel engine adds, running over
// dp x cp (Note [context-parallel groups] in comm/device_mesh.cc). Per prepared model:
//  - check (before anything changes): the plan (ParallelOptions::cp_plan, AcceleratorConfig::
//    cp_plan) is not empty, has a ring-attention entry, every pattern matches a module, no module
//    is matched twice;
//  - each ring-attention module gets a call wrapper that runs its call inside a
//    ContextAttentionGuard (autograd/context_attention.h): its scaled_dot_product_attention calls
//    become ring_attention over the cp group; attention the ring cannot compute is refused there;
//  - each positions module gets a wrapper mapping its first argument's positions 0..T-1 of this
//    rank's T tokens to their global positions, around the tp step's wrapper when there is one
//    (sequence parallelism then cuts the global positions).
// The token-local layers (embeddings, norms, MLPs, the loss over this rank's tokens) need nothing:
// with every rank holding as many tokens, the mean of the ranks' mean losses is the whole batch's,
// and so is the engine's average of their gradients.
#include "parallel/cp_step.h"

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "autograd/context_attention.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/wrapper_label.h"

namespace accel::dist {

namespace {

constexpr std::string_view kCp = "cp";

// The plan's matches: module name -> (module, style). Every pattern must match; a module matched
// twice is refused.
std::map<std::string, std::pair<nn::Module*, CpStyle>> plan_matches(nn::Module& root,
                                                                    const CpPlan& plan, int cp) {
  std::map<std::string, std::pair<nn::Module*, CpStyle>> out;
  for (const auto& [pattern, style] : plan) {
    bool any = false;
    for (auto& [name, m] : root.named_modules()) {
      if (!module_name_matches(pattern, name)) continue;
      any = true;
      const auto [it, fresh] = out.emplace(name, std::make_pair(m, style));
      ACCEL_CHECK(fresh, ValueError, "prepare", "cp_plan: module '", name,
                  "' is matched by two patterns (", it->second.second.name(), " and '", pattern,
                  "' -> ", style.name(), ")");
    }
    ACCEL_CHECK(any, ValueError, "prepare", "cp_plan: pattern '", pattern, "' (", style.name(),
                ") matches no module of ", root.type_name(), " (cp_size ", cp,
                "; '*' matches one name component: \"blocks.*.attn\")");
  }
  return out;
}

class CpStep final : public ApplyStep {
 public:
  std::string_view name() const override { return kCp; }
  // No parameter is cut along cp: nothing to record (the engine's group spans it).
  bool active(const DeviceMesh& mesh) const override {
    return mesh.has_dim(kCp) && mesh.size(kCp) > 1;
  }

  void check(const ParallelModel& pm, const StepContext& ctx) const override {
    const int cp = ctx.mesh.size(kCp);
    const CpPlan& plan = ctx.options.cp_plan;
    bool attends = false;
    for (const auto& e : plan) attends = attends || e.second.kind == CpStyle::Kind::RingAttention;
    ACCEL_CHECK(attends, ValueError, "prepare", "cp_size ", cp,
                " splits every sequence over its cp group, but AcceleratorConfig::cp_plan ",
                plan.empty() ? "is empty" : "has no ring-attention entry",
                ": name the modules whose attention must see the whole sequence "
                "(dist::cp_ring_attention()) and those taking token positions "
                "(dist::cp_position_ids()); models::gpt_cp_plan() for examples/models.h's Gpt");
    // A module wrapped once already would map its positions twice: the model was prepared.
    for (const auto& [name, entry] : plan_matches(*pm.module(), plan, cp)) {
      const std::string label = nn::call_wrapper_label(*entry.first);
      ACCEL_CHECK(label.find("context-parallel") == std::string::npos, ValueError, "prepare",
                  "module '", name, "' of ", pm.module()->type_name(),
                  " is prepared for context parallelism already (", label,
                  "): prepare each model once");
    }
  }

  void apply(ParallelModel& pm, const StepContext& ctx) override {
    const ProcessGroupPtr& group = ctx.mesh.group(kCp);
    const int cp = group->size(), rank = group->rank();
    for (auto& [name, entry] : plan_matches(*pm.module(), ctx.options.cp_plan, cp)) {
      nn::Module& m = *entry.first;
      const bool had = m.has_call_wrapper();
      const std::string label = "context-parallel " + entry.second.name() + " '" + name + "'";
      if (entry.second.kind == CpStyle::Kind::RingAttention) {
        auto ca = std::make_shared<ContextAttention>();
        ca->what = "context parallelism (cp " + std::to_string(cp) + ") in '" + name + "'";
        ca->attend = [group](const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                             double scale) {
          return ring_attention(q, k, v, causal, scale, group);
        };
        m.wrap_call([ca](nn::Module&, nn::Values& in, const nn::CallFn& call) {
          ContextAttentionGuard scope(ca.get());
          return call(in);
        });
      } else {
        m.wrap_call([rank, cp, label](nn::Module&, nn::Values& in, const nn::CallFn& call) {
          ACCEL_CHECK(!in.empty() && in[0].is_tensor() && in[0].tensor().defined(), ValueError,
                      "prepare", label, ": expected the positions as the first argument, got ",
                      nn::describe_values(in));
          in[0].tensor() = global_positions(in[0].tensor(), rank, cp, label);
          return call(in);
        });
      }
      const std::string inner = had ? nn::call_wrapper_label(m) : std::string();
      nn::set_call_wrapper_label(m, inner.empty() ? label : label + " around " + inner);
    }
  }

 private:
  // The global positions of local positions `p` (values in [0, T), T = p.size(-1)).
  static Tensor global_positions(const Tensor& p, int rank, int cp, const std::string& label) {
    ACCEL_CHECK(p.dtype() == kInt64 || p.dtype() == kInt32, DTypeError, label.c_str(),
                "positions must be int64 or int32, got ", p.dtype());
    ACCEL_CHECK(p.dim() >= 1, ShapeError, label.c_str(),
                "expected positions (..., T) of this rank's T tokens, got ", p.sizes());
    const int64_t T = p.size(-1);
    NoGradGuard ng;
    const Tensor table = cp_positions(T, rank, cp, p.device());
    if (p.numel() == 0) return p;
    const Tensor idx = p.to(kInt64).reshape({-1});
    const int64_t lo = min(idx).item<int64_t>(), hi = max(idx).item<int64_t>();
    ACCEL_CHECK(lo >= 0 && hi < T, ValueError, label.c_str(), "positions must lie in [0, ", T,
                ") for this rank's ", T, " tokens, got [", lo, ", ", hi,
                "]: the module is called with positions of the local tokens (arange(T))");
    return index_select(table, 0, idx).reshape(p.sizes()).to(p.dtype());
  }
};

}  // namespace

std::unique_ptr<ApplyStep> make_cp_step() { return std::make_unique<CpStep>(); }

}  // namespace accel::dist
