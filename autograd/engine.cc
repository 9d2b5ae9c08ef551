#include "autograd/engine.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <queue>
#include <unordered_map>

#include "autograd/ops.h"

namespace accel::autograd {

namespace {
// Per thread, like PyTorch: a graph is built by one thread, and only the relative order within
// one backward matters (Note [backward order]). An atomic counter cost ~8 % of a small op.
thread_local uint64_t t_next_sequence_nr __attribute__((tls_model("initial-exec"))) = 0;
}  // namespace

uint64_t current_sequence_nr() { return t_next_sequence_nr; }

Node::Node(uint32_t num_outputs) : num_outputs_(num_outputs), sequence_nr_(t_next_sequence_nr++) {}
Node::~Node() = default;

void Node::add_pre_hook(uint32_t output_nr, GradHook hook) {
  if (!hooks_) hooks_ = std::make_unique<Hooks>();
  hooks_->pre.emplace_back(output_nr, std::move(hook));
}

void Node::add_retained_grad(uint32_t output_nr, std::shared_ptr<Tensor> slot) {
  if (!hooks_) hooks_ = std::make_unique<Hooks>();
  hooks_->retained.emplace_back(output_nr, std::move(slot));
}

void Node::remove_retained_grad(const std::shared_ptr<Tensor>& slot) {
  if (!hooks_) return;
  std::erase_if(hooks_->retained, [&](const RetainedSlot& r) { return r.second == slot; });
}

namespace {
thread_local const Node* t_current_node = nullptr;
thread_local const std::shared_ptr<Node>* t_current_owner = nullptr;
// Saved outputs unpacked with history (Note [saved tensors and double backward]): a deque, so a
// reference handed out stays valid while later ones are added.
thread_local std::deque<Tensor> t_kept;
}  // namespace

const Node* current_node() { return t_current_node; }
const std::shared_ptr<Node>* current_node_owner() { return t_current_owner; }
CurrentNodeScope::CurrentNodeScope(const Node* n, const std::shared_ptr<Node>* owner)
    : prev_(t_current_node), prev_owner_(t_current_owner), prev_kept_(t_kept.size()) {
  t_current_node = n;
  t_current_owner = owner;
}
CurrentNodeScope::~CurrentNodeScope() {
  t_current_node = prev_;
  t_current_owner = prev_owner_;
  while (t_kept.size() > prev_kept_) t_kept.pop_back();
}
const Tensor& keep_for_current_node(Tensor t) {
  t_kept.push_back(std::move(t));
  return t_kept.back();
}

void throw_released(const char* name) {
  ACCEL_THROW(ValueError, "backward", "trying to backward through the graph a second time (node ",
              name,
              "); its saved tensors were freed. Pass retain_graph=true to the first backward");
}

// ---------------- AccumulateGrad ----------------

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node(1), leaf_(std::move(leaf)) {}

Grads AccumulateGrad::apply(Grads&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& meta = leaf_.autograd_meta();
  for (auto& hook : meta.hooks) {
    Tensor r = hook(g);
    if (r.defined()) g = r;
  }
  ACCEL_CHECK(g.sizes() == leaf_.sizes(), ShapeError, "backward", "gradient of shape ", g.sizes(),
              " for a leaf of shape ", leaf_.sizes());
  if (grad_enabled()) [[unlikely]] {
    // create_graph (Note [double backward] in engine.h): .grad keeps the gradient's history, as
    // torch's: a differentiable copy first (never an alias of a tensor the caller can see), then
    // out-of-place sums.
    if (g.dtype() != leaf_.dtype()) g = g.to(leaf_.dtype());
    meta.grad = meta.grad.defined() ? add(meta.grad, g) : g.clone();
  } else if (!meta.grad.defined()) {
    // Take ownership when nobody else holds the buffer, else copy: .grad must never alias a
    // tensor the user can see, since accumulation later writes into it.
    if (g.impl()->use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
        g.dtype() == leaf_.dtype()) {
      meta.grad = g.detach();
    } else {
      meta.grad = empty(leaf_.sizes(), TensorOptions(leaf_.dtype(), leaf_.device()));
      meta.grad.copy_(g);
    }
  } else {
    meta.grad.add_(g);
  }
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf_);
  return {};
}

// ---------------- graph construction ----------------

namespace {
// gradient_edge(t) written into `e` (empty on entry): set_history fills the node's edge slots in
// place instead of moving a returned Edge in (a 16-byte reload of two 8-byte stores stalls).
void set_gradient_edge(Edge& e, const Tensor& t) {
  if (t.impl()->view_base_) [[unlikely]] {
    // Note [views and in-place autograd]: the view's history, regenerated if stale.
    if (const std::shared_ptr<Node>& fn = view_grad_fn(t)) {
      e.fn = fn;
      e.input_nr = t.autograd_meta_if()->output_nr;
      return;
    }
  }
  AutogradMeta* m = t.autograd_meta_if();
  if (!m || !m->requires_grad) return;
  if (m->grad_fn) {
    e.fn = m->grad_fn;
    e.input_nr = m->output_nr;
    return;
  }
  e.fn = m->grad_accumulator.lock();
  if (!e.fn) {
    e.fn = make_node<AccumulateGrad>(t);
    m->grad_accumulator = e.fn;
  }
  e.input_nr = 0;
}
}  // namespace

Edge gradient_edge(const Tensor& t) {
  Edge e;
  set_gradient_edge(e, t);
  return e;
}

namespace {
void attach_output(const std::shared_ptr<Node>& node, Tensor* out, uint32_t nr) {
  if (!out || !out->defined()) return;
  // An op that records its own node on a view it made (of a buffer of its own) returns a plain
  // tensor: the node is its whole history (Note [views and in-place autograd]).
  if (out->impl()->view_base_) [[unlikely]]
    out->impl()->view_base_.reset();
  AutogradMeta& m = out->autograd_meta();
  m.requires_grad = true;
  m.grad_fn = node;
  m.output_nr = nr;
}
}  // namespace

void set_history(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
                 std::initializer_list<Tensor*> outputs) {
  auto& edges = node->mutable_next_edges();
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    edges.push_back(Edge{});
    if (t && t->defined()) set_gradient_edge(edges[edges.size() - 1], *t);
  }
  uint32_t nr = 0;
  for (Tensor* o : outputs) attach_output(node, o, nr++);
}

void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs) {
  auto& edges = node->mutable_next_edges();
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    edges.push_back(Edge{});
    if (t.defined()) set_gradient_edge(edges[edges.size() - 1], t);
  }
  uint32_t nr = 0;
  for (Tensor* o : outputs) attach_output(node, o, nr++);
}

bool needs_grad(const std::vector<Tensor>& xs) {
  if (!grad_enabled()) return false;
  for (const Tensor& x : xs)
    if (x.defined() && x.requires_grad()) return true;
  return false;
}

// ---------------- op registry ----------------

namespace {
std::vector<const char*>& op_list() {
  static std::vector<const char*> ops;
  return ops;
}
}  // namespace
OpRegistrar::OpRegistrar(const char* name) { op_list().push_back(name); }
const std::vector<const char*>& differentiable_ops() { return op_list(); }

Tensor grad_or_zeros(const Tensor& g, const Tensor& like) {
  return g.defined() ? g : zeros(like.sizes(), TensorOptions(like.dtype(), like.device()));
}

// ---------------- engine ----------------

namespace {

void accumulate_into(Tensor& slot, Tensor g) {
  if (!g.defined()) return;
  slot = slot.defined() ? add(slot, g) : std::move(g);
}

// Sets grad mode for one backward: off, or on with create_graph (Note [double backward]).
class GradModeScope {
 public:
  explicit GradModeScope(bool on) : prev_(grad_enabled()) { set_grad_enabled(on); }
  ~GradModeScope() { set_grad_enabled(prev_); }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool prev_;
};

struct NodeTask {
  Node* node;
  size_t owner;  // index of the node's owning pointer in execute()'s `keep`
  bool operator<(const NodeTask& o) const { return node->sequence_nr() < o.node->sequence_nr(); }
};

// Runs the graph. When `capture` is set, gradients arriving at the nodes in it (leaves'
// AccumulateGrad or stand-ins' nodes) are stored there instead of running the node, and nothing
// past them runs (autograd::grad, grad_from_edges); the AccumulateGrad of every other leaf is
// then skipped unless accumulate_leaves.
void execute(const std::vector<Edge>& roots, std::vector<Tensor> root_grads, bool retain_graph,
             bool create_graph, std::unordered_map<Node*, Tensor>* capture,
             bool accumulate_leaves) {
  GradModeScope grad_mode(create_graph);
  // 1. dependencies
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : roots) {
    if (e.fn && !seen[e.fn.get()]) {
      seen[e.fn.get()] = true;
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (capture && capture->count(n)) continue;  // nothing past a captured node runs
    for (const Edge& e : n->next_edges()) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }
  // 2. input buffers: gradients for each output slot of each node
  std::unordered_map<Node*, Grads> buffers;
  auto buffer_for = [&](Node* n) -> Grads& {
    Grads& b = buffers[n];
    if (b.empty()) b.resize(n->num_outputs());
    return b;
  };
  std::priority_queue<NodeTask> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].fn) continue;
    accumulate_into(buffer_for(roots[i].fn.get())[roots[i].input_nr], std::move(root_grads[i]));
  }
  // Keep nodes alive while running even if the user dropped the graph's tensors; a node's entry
  // is also its owning pointer for saved outputs under create_graph (current_node_owner()).
  std::vector<std::shared_ptr<Node>> keep;
  for (const Edge& e : roots) {
    Node* n = e.fn.get();
    if (n && deps[n] == 0 && seen[n]) {
      keep.push_back(e.fn);
      ready.push({n, keep.size() - 1});
      seen[n] = false;  // queued once
    }
  }

  while (!ready.empty()) {
    const NodeTask task = ready.top();
    Node* n = task.node;
    ready.pop();
    Grads in = std::move(buffer_for(n));
    buffers.erase(n);
    if (const Node::Hooks* hooks = n->hooks()) {
      for (auto& [nr, hook] : hooks->pre) {
        if (nr < in.size() && in[nr].defined()) {
          Tensor r = hook(in[nr]);
          if (r.defined()) in[nr] = r;
        }
      }
      for (const auto& [nr, slot] : hooks->retained) {  // retain_grad(), after the hooks
        if (nr >= in.size() || !in[nr].defined()) continue;
        if (create_graph) {
          // The retained gradient keeps its history (torch's), so sums are out of place.
          *slot = slot->defined() ? add(*slot, in[nr]) : in[nr].clone();
        } else if (slot->defined()) {
          slot->add_(in[nr]);
        } else {
          *slot = empty(in[nr].sizes(), TensorOptions(in[nr].dtype(), in[nr].device()));
          slot->copy_(in[nr]);
        }
      }
    }
    Grads out;
    if (capture) {
      auto it = capture->find(n);
      if (it != capture->end()) {
        accumulate_into(it->second, in[0]);
        continue;
      }
      // autograd::grad must not touch .grad of leaves outside the requested inputs.
      if (!accumulate_leaves && dynamic_cast<AccumulateGrad*>(n)) continue;
    }
    bool all_undefined = true;
    for (const Tensor& g : in) all_undefined = all_undefined && !g.defined();
    if (!all_undefined) {
      // Note [saved tensors]: names the node in version errors; its owner is the grad_fn of
      // saved outputs under create_graph.
      CurrentNodeScope running(n, &keep[task.owner]);
      out = n->apply(std::move(in));
    }
    if (!retain_graph) n->release();
    const auto& edges = n->next_edges();
    ACCEL_CHECK(out.empty() || out.size() == edges.size(), Error, "backward", "node ", n->name(),
                " returned ", out.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.fn) continue;
      Node* next = e.fn.get();
      if (!out.empty() && out[i].defined()) {
        accumulate_into(buffer_for(next)[e.input_nr], std::move(out[i]));
      }
      if (--deps[next] == 0) {
        keep.push_back(e.fn);
        ready.push({next, keep.size() - 1});
      }
    }
  }
}

// Note [end-of-backward callbacks] in engine.h.
thread_local int t_backward_depth = 0;
thread_local std::vector<BackwardCallback> t_callbacks;

// execute() inside the callback bookkeeping: at the end of the outermost backward, the queued
// callbacks run (those they queue run too), errors are kept in `err`, the backward's own first.
void execute_and_call_back(const std::vector<Edge>& roots, std::vector<Tensor> root_grads,
                           bool retain_graph, bool create_graph,
                           std::unordered_map<Node*, Tensor>* capture, bool accumulate_leaves) {
  std::exception_ptr err;
  ++t_backward_depth;
  try {
    execute(roots, std::move(root_grads), retain_graph, create_graph, capture, accumulate_leaves);
  } catch (...) {
    err = std::current_exception();
  }
  --t_backward_depth;
  if (t_backward_depth == 0) {
    const bool succeeded = !err;
    while (!t_callbacks.empty()) {
      std::vector<BackwardCallback> callbacks = std::move(t_callbacks);
      t_callbacks.clear();
      for (auto& fn : callbacks) {
        try {
          fn(succeeded);
        } catch (...) {
          if (!err) err = std::current_exception();
        }
      }
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace

void queue_callback(BackwardCallback fn) {
  ACCEL_CHECK(t_backward_depth > 0, ValueError, "queue_callback",
              "no backward is running on this thread");
  t_callbacks.push_back(std::move(fn));
}

bool backward_running() { return t_backward_depth > 0; }

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph, bool create_graph) {
  std::vector<Edge> edges;
  std::vector<Tensor> gs;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    ACCEL_CHECK(r.defined(), ValueError, "backward", "root tensor is undefined");
    ACCEL_CHECK(r.requires_grad(), ValueError, "backward", "tensor of shape ", r.sizes(),
                " does not require grad and has no grad_fn");
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      ACCEL_CHECK(r.numel() == 1, ShapeError, "backward",
                  "grad can be implicitly created only for one-element outputs; got shape ",
                  r.sizes());
      g = ones(r.sizes(), TensorOptions(r.dtype(), r.device()));
    } else {
      ACCEL_CHECK(g.sizes() == r.sizes(), ShapeError, "backward", "gradient shape ", g.sizes(),
                  " does not match output shape ", r.sizes());
    }
    edges.push_back(gradient_edge(r));
    gs.push_back(std::move(g));
  }
  execute_and_call_back(edges, std::move(gs), retain_graph, create_graph, nullptr, true);
}

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph) {
  ACCEL_CHECK(grad_tensors.empty() || grad_tensors.size() == tensors.size(), ValueError, "backward",
              "got ", grad_tensors.size(), " gradients for ", tensors.size(), " tensors");
  run_backward(tensors, grad_tensors, retain_graph.value_or(create_graph), create_graph);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  std::vector<Edge> edges;
  std::vector<Tensor> gs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& r = outputs[i];
    ACCEL_CHECK(r.defined(), ValueError, "grad", "output ", i, " is undefined");
    ACCEL_CHECK(r.requires_grad(), ValueError, "grad", "output ", i, " of shape ", r.sizes(),
                " does not require grad");
    Tensor g = i < grad_outputs.size() ? grad_outputs[i] : Tensor();
    if (!g.defined()) {
      ACCEL_CHECK(r.numel() == 1, ShapeError, "grad",
                  "grad can be implicitly created only for one-element outputs; got shape ",
                  r.sizes());
      g = ones(r.sizes(), TensorOptions(r.dtype(), r.device()));
    } else {
      ACCEL_CHECK(g.sizes() == r.sizes(), ShapeError, "grad", "grad_outputs[", i, "] of shape ",
                  g.sizes(), " does not match output ", i, " of shape ", r.sizes());
    }
    edges.push_back(gradient_edge(r));
    gs.push_back(std::move(g));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    ACCEL_CHECK(x.defined(), ValueError, "grad", "input ", i, " is undefined");
    ACCEL_CHECK(x.requires_grad(), ValueError, "grad", "input ", i, " of shape ", x.sizes(),
                " does not require grad");
    ACCEL_CHECK(x.is_leaf(), ValueError, "grad", "only leaf inputs are supported (input ", i,
                " of shape ", x.sizes(), ")");
  }
  std::vector<Tensor> result = grad_from_edges(
      edges, std::move(gs), inputs, retain_graph.value_or(create_graph), create_graph, false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    ACCEL_CHECK(result[i].defined() || allow_unused, ValueError, "grad", "input ", i, " of shape ",
                inputs[i].sizes(), " was not used in the graph (pass allow_unused=true)");
  }
  return result;
}

std::vector<Tensor> grad_from_edges(const std::vector<Edge>& roots, std::vector<Tensor> grads,
                                    const std::vector<Tensor>& leaves, bool retain_graph,
                                    bool create_graph, bool accumulate_leaves) {
  std::unordered_map<Node*, Tensor> capture;
  std::vector<Node*> input_nodes;
  std::vector<std::shared_ptr<Node>> keep;
  for (const Tensor& x : leaves) {
    Edge e = gradient_edge(x);
    keep.push_back(e.fn);
    capture[e.fn.get()] = Tensor();
    input_nodes.push_back(e.fn.get());
  }
  execute_and_call_back(roots, std::move(grads), retain_graph, create_graph, &capture,
                        accumulate_leaves);
  std::vector<Tensor> result;
  result.reserve(leaves.size());
  for (Node* n : input_nodes) result.push_back(capture[n]);
  return result;
}

}  // namespace accel::autograd

// ---------------- Tensor autograd members ----------------

namespace accel {

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  if (impl_->view_base_) [[unlikely]]
    return autograd::view_grad_fn(*this);
  return impl_->autograd_ ? impl_->autograd_->grad_fn : kNone;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = impl_->autograd_.get();
  if (!m) return Tensor();
  if (m->retained_grad) return *m->retained_grad;
  return m->grad;
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined()) {
    ACCEL_CHECK(g.sizes() == sizes(), ShapeError, "set_grad", "gradient shape ", g.sizes(),
                " does not match tensor shape ", sizes());
    ACCEL_CHECK(g.device() == device(), DeviceError, "set_grad", "gradient on ", g.device(),
                " for a tensor on ", device());
  }
  autograd_meta().grad = g;
}

void Tensor::zero_grad(bool set_to_none) {
  if (!impl_->autograd_ || !impl_->autograd_->grad.defined()) return;
  if (set_to_none) {
    impl_->autograd_->grad = Tensor();
  } else {
    NoGradGuard g;
    impl_->autograd_->grad.zero_();
  }
}

void Tensor::retain_grad() {
  ACCEL_CHECK(requires_grad(), ValueError, "retain_grad", "tensor of shape ", sizes(),
              " does not require grad");
  if (is_leaf()) return;                                  // leaves keep .grad anyway
  const std::shared_ptr<autograd::Node>& fn = grad_fn();  // a view's, regenerated if stale
  AutogradMeta& m = autograd_meta();
  if (m.retains_grad) return;
  m.retains_grad = true;
  // The slot is shared between the tensor's metadata and the node, so neither outlives the other
  // unsafely and there is no reference cycle through the node. An in-place op moves it to the
  // tensor's new grad_fn (Note [in-place ops]).
  m.retained_grad = std::make_shared<Tensor>();
  fn->add_retained_grad(m.output_nr, m.retained_grad);
}

void Tensor::backward(const Tensor& gradient, std::optional<bool> retain_graph,
                      bool create_graph) const {
  autograd::run_backward({*this}, {gradient}, retain_graph.value_or(create_graph), create_graph);
}

void Tensor::register_hook(GradHook hook) {
  ACCEL_CHECK(requires_grad(), ValueError, "register_hook",
              "cannot register a hook on a tensor that does not require grad (shape ", sizes(),
              ")");
  AutogradMeta& m = autograd_meta();
  if (m.grad_fn) {
    m.grad_fn->add_pre_hook(m.output_nr, std::move(hook));
  } else {
    m.hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) {
  ACCEL_CHECK(requires_grad() && is_leaf(), ValueError, "register_post_accumulate_grad_hook",
              "only leaf tensors that require grad accumulate gradients (shape ", sizes(), ")");
  autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace accel
