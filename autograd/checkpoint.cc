#include "autograd/checkpoint.h"

#include <mutex>
#include <string>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/sharded_random.h"

namespace accel::autograd {

namespace {

const char* const kOp = "checkpoint";

thread_local int t_recompute_depth = 0;  // checkpoint_recomputing()

class RecomputeScope {
 public:
  RecomputeScope() { ++t_recompute_depth; }
  ~RecomputeScope() { --t_recompute_depth; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

Generator::Snapshot rng_state() {
  Generator& g = default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  return g.snapshot();
}

void set_rng_state(const Generator::Snapshot& s) {
  Generator& g = default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  g.restore(s);
}

// Puts the default generator back to the state it had at construction, also on an exception.
class RngRestore {
 public:
  RngRestore() : saved_(rng_state()) {}
  ~RngRestore() { set_rng_state(saved_); }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  Generator::Snapshot saved_;
};

struct SavedInput {
  Tensor value;  // detached alias (no history; keeps the storage alive)
  bool requires_grad = false;
  uint32_t version = 0;
};

struct SavedOutput {
  Shape sizes;
  DType dtype = kFloat32;
};

// Note [activation checkpointing] in autograd/checkpoint.h.
class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs, const Generator::Snapshot& rng,
                 ShardedRegion region, bool autocast_on, DType autocast_dt)
      : Node(uint32_t(outputs.size())),
        fn_(std::move(fn)),
        rng_(rng),
        region_(std::move(region)),
        autocast_on_(autocast_on),
        autocast_dtype_(autocast_dt) {
    inputs_.reserve(inputs.size());
    for (const Tensor& x : inputs) {
      SavedInput s;
      if (x.defined()) {
        s.value = x.detach();
        s.requires_grad = x.requires_grad();
        s.version = x.storage()->version();
      }
      inputs_.push_back(std::move(s));
    }
    outputs_.reserve(outputs.size());
    for (const Tensor& o : outputs) outputs_.push_back({o.sizes(), o.dtype()});
  }

  const char* name() const override { return kOp; }
  void release() override {
    fn_ = nullptr;
    inputs_.clear();
    released_ = true;
  }
  bool released() const override { return released_; }

  Grads apply(Grads&& grads) override {
    if (released_) throw_released(kOp);
    check_versions();
    // Under create_graph (Note [double backward] in autograd/engine.h) the recompute runs on
    // stand-ins of the inputs (Note [stand-ins]): the gradients it returns then record a graph
    // that reaches the inputs' history, as torch's non-reentrant checkpoint does.
    const bool create_graph = creating_graph();
    std::vector<Tensor> xs, stand_ins;
    xs.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const SavedInput& s = inputs_[i];
      Tensor x = s.value.defined() ? s.value.detach() : Tensor();
      if (s.requires_grad && create_graph) {
        x = stand_in(x, next_edges_[i]);
        stand_ins.push_back(x);
      } else if (s.requires_grad) {
        x.requires_grad_(true);
      }
      xs.push_back(std::move(x));
    }
    std::vector<Tensor> outs;
    {
      RngRestore rng_now;  // the recompute must not shift the run's random stream
      set_rng_state(rng_);
      // The tensor-parallel layout the forward's random ops saw (Note [dropout under tensor
      // parallelism] in parallel/tp_random.cc), put back after.
      ShardedRegionGuard region(region_);
      EnableGradGuard grad_on;
      AutocastGuard autocast(autocast_on_, autocast_dtype_);
      RecomputeScope recomputing;
      outs = fn_(xs);
    }
    ACCEL_CHECK(outs.size() == outputs_.size(), ValueError, kOp, "the recomputed forward returned ",
                outs.size(), " tensors, the forward returned ", outputs_.size(),
                " (fn must compute the same thing every time it runs)");
    std::vector<Tensor> roots, root_grads;
    bool any_requires_grad = false;
    for (size_t j = 0; j < outs.size(); ++j) {
      const Tensor& o = outs[j];
      ACCEL_CHECK(o.defined(), ValueError, kOp,
                  "the recomputed forward returned an undefined tensor", " as output ", j);
      ACCEL_CHECK(o.sizes() == outputs_[j].sizes && o.dtype() == outputs_[j].dtype, ValueError, kOp,
                  "recomputed output ", j, " is ", o.dtype(), " ", o.sizes(), ", the forward gave ",
                  outputs_[j].dtype, " ", outputs_[j].sizes,
                  " (fn must compute the same thing every time it runs)");
      if (!o.requires_grad()) continue;
      any_requires_grad = true;
      if (j < grads.size() && grads[j].defined()) {
        roots.push_back(o);
        root_grads.push_back(std::move(grads[j]));
      }
    }
    ACCEL_CHECK(any_requires_grad, ValueError, kOp, "none of the ", outs.size(),
                " recomputed outputs depends on an input or a parameter that requires grad (fn "
                "returned tensors that depend on nothing differentiable; output 0 is ",
                outs.empty() ? Shape{} : outs[0].sizes(), ")");
    if (create_graph) {
      // Parameters' .grad accumulate (with history) as in the plain recompute; the inputs'
      // gradients are what reaches their stand-ins.
      Grads result(xs.size());
      if (roots.empty()) return result;
      std::vector<Edge> edges;
      for (const Tensor& r : roots) edges.push_back(gradient_edge(r));
      Grads got = grad_from_edges(edges, std::move(root_grads), stand_ins, /*retain_graph=*/true,
                                  /*create_graph=*/true, /*accumulate_leaves=*/true);
      for (size_t i = 0, k = 0; i < xs.size(); ++i)
        if (inputs_[i].requires_grad) result[i] = std::move(got[k++]);
      return result;
    }
    if (!roots.empty()) run_backward(roots, root_grads, /*retain_graph=*/false);
    Grads result(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      if (inputs_[i].requires_grad) result[i] = xs[i].grad();
    }
    return result;
  }

 private:
  void check_versions() const {
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const SavedInput& s = inputs_[i];
      if (!s.value.defined()) continue;
      ACCEL_CHECK(s.value.storage()->version() == s.version, ValueError, kOp, "input ", i,
                  " of shape ", s.value.sizes(),
                  " was modified in place after the checkpointed forward (version ", s.version,
                  " -> ", s.value.storage()->version(),
                  "); the recompute would see other values. Clone it before modifying it");
    }
  }

  CheckpointFn fn_;
  std::vector<SavedInput> inputs_;
  std::vector<SavedOutput> outputs_;
  Generator::Snapshot rng_;
  ShardedRegion region_;
  bool autocast_on_;
  DType autocast_dtype_;
  bool released_ = false;
};

// Every mode checks the outputs, so a bad fn fails the same way with and without grad.
std::vector<Tensor> call_checked(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> outs = fn(inputs);
  for (size_t j = 0; j < outs.size(); ++j) {
    ACCEL_CHECK(outs[j].defined(), ValueError, kOp, "fn returned an undefined tensor as output ", j,
                " of ", outs.size());
  }
  return outs;
}

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  ACCEL_CHECK(bool(fn), ValueError, kOp, "fn is empty");
  if (!grad_enabled()) return call_checked(fn, inputs);
  const bool inputs_need_grad = needs_grad(inputs);
  // Forward-time state the recompute re-applies (Note [activation checkpointing]).
  const Generator::Snapshot rng = rng_state();
  ShardedRegion region = sharded_region();
  const bool autocast_on = autocast_enabled();
  const DType autocast_dt = autocast_dtype();
  std::vector<Tensor> outs;
  if (inputs_need_grad) {
    NoGradGuard no_grad;
    outs = call_checked(fn, inputs);
  } else {
    outs = call_checked(fn, inputs);  // probe: does a parameter inside fn require grad?
  }
  // Which outputs get the node as grad_fn: every floating output when an input requires grad,
  // else those the probe found requiring grad.
  std::vector<bool> attach(outs.size(), false);
  bool any = false;
  for (size_t j = 0; j < outs.size(); ++j) {
    attach[j] = inputs_need_grad ? is_floating(outs[j].dtype()) : outs[j].requires_grad();
    any = any || attach[j];
  }
  if (!any) return outs;
  auto node = std::make_shared<CheckpointNode>(fn, inputs, outs, rng, std::move(region),
                                               autocast_on, autocast_dt);
  std::vector<Tensor*> out_ptrs(outs.size(), nullptr);
  for (size_t j = 0; j < outs.size(); ++j) {
    // A detached alias: fn may return an input or a parameter, whose own history must stay.
    // In the probe case this also drops the graph fn recorded, and with it the activations.
    if (attach[j]) {
      outs[j] = outs[j].detach();
      out_ptrs[j] = &outs[j];
    }
  }
  set_history(node, inputs, out_ptrs);
  return outs;
}

bool checkpoint_recomputing() { return t_recompute_depth > 0; }

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  ACCEL_CHECK(bool(fn), ValueError, kOp, "fn is empty");
  std::vector<Tensor> outs = checkpoint(
      [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {input});
  return outs[0];
}

}  // namespace accel::autograd
