// Graph nodes for op authors. An op that records history does:
//
//   Tensor out = ...forward...;
//   if (autograd::needs_grad(a, b)) {
//     autograd::record("mul", {a, b}, {&out}, [a, b](const autograd::Grads& g) -> autograd::Grads {
//       return {g[0] * b, g[0] * a};   // one gradient per input, undefined = no gradient
//     });
//   }
//
// The backward lambda is written with framework ops, so it runs on every device. Gradients come
// in as one per output (undefined when that output got none) and go out as one per input. A
// tensor the backward reads is captured as a SavedTensor (Note [saved tensors]):
//
//     autograd::record("mul", {a, b}, {&out},
//                      [x = autograd::save_input(a, 0), y = autograd::save_input(b, 1)](...) {
//                        return autograd::Grads{g[0] * y.unpack(), g[0] * x.unpack()};
//                      });
//
// In-place ops use autograd::InplaceOp (Note [in-place ops]); an in-place method written as "the
// out-of-place op, stored into self" uses autograd::inplace_method (Note [in-place methods]).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/small_pool.h"
#include "core/tensor.h"

namespace accel::autograd {

using Grads = std::vector<Tensor>;
class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which input slot of fn receives this gradient
  bool valid() const { return bool(fn); }
};

// Edges of a node: most ops have one or two inputs, so two live inline and more spill to the heap
// (one allocation fewer per recorded op).
class EdgeList {
 public:
  static constexpr size_t kInline = 2;
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void reserve(size_t n) {
    if (n > kInline) heap_.reserve(n);
  }
  void push_back(Edge e) {
    if (size_ < kInline && heap_.empty()) {
      inline_[size_] = std::move(e);
    } else {
      if (heap_.empty()) {
        for (size_t i = 0; i < size_; ++i) heap_.push_back(std::move(inline_[i]));
      }
      heap_.push_back(std::move(e));
    }
    ++size_;
  }
  const Edge& operator[](size_t i) const { return heap_.empty() ? inline_[i] : heap_[i]; }
  Edge& operator[](size_t i) { return heap_.empty() ? inline_[i] : heap_[i]; }
  const Edge* begin() const { return heap_.empty() ? inline_ : heap_.data(); }
  const Edge* end() const { return begin() + size_; }

 private:
  Edge inline_[kInline];
  std::vector<Edge> heap_;
  size_t size_ = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(uint32_t num_outputs = 1);
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads: one per output of the forward op; returns one per entry of next_edges().
  virtual Grads apply(Grads&& grads) = 0;
  virtual const char* name() const = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release() {}
  virtual bool released() const { return false; }

  const EdgeList& next_edges() const { return next_edges_; }
  EdgeList& mutable_next_edges() { return next_edges_; }
  uint32_t num_outputs() const { return num_outputs_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  // Hooks on the gradient of forward output `output_nr` (Tensor::register_hook on non-leaves).
  using PreHook = std::pair<uint32_t, GradHook>;
  void add_pre_hook(uint32_t output_nr, GradHook hook);
  // retain_grad() slots: filled with the gradient of output `output_nr` after the pre-hooks ran.
  // Kept apart from the hooks so that an in-place op can move a tensor's slot to its new
  // grad_fn (the retained gradient is then the one of the value after the op, as in torch).
  using RetainedSlot = std::pair<uint32_t, std::shared_ptr<Tensor>>;
  void add_retained_grad(uint32_t output_nr, std::shared_ptr<Tensor> slot);
  void remove_retained_grad(const std::shared_ptr<Tensor>& slot);
  // Both lists, or null when the node has neither (almost every node: one pointer, no
  // construction or destruction cost per recorded op).
  struct Hooks {
    std::vector<PreHook> pre;
    std::vector<RetainedSlot> retained;
  };
  const Hooks* hooks() const { return hooks_.get(); }

 protected:
  EdgeList next_edges_;
  std::unique_ptr<Hooks> hooks_;
  uint32_t num_outputs_;
  uint64_t sequence_nr_;
};

// Writes into a leaf's .grad; runs the leaf's hooks and post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  Grads apply(Grads&& grads) override;
  const char* name() const override { return "AccumulateGrad"; }
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

// Node holding the backward as a lambda (one allocation for node + captures).
template <typename F>
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, uint32_t num_outputs, F&& f)
      : Node(num_outputs), name_(name), fn_(std::move(f)) {}
  Grads apply(Grads&& grads) override;
  const char* name() const override { return name_; }
  void release() override { fn_.reset(); }
  bool released() const override { return !fn_.has_value(); }

 private:
  const char* name_;
  std::optional<F> fn_;
};

[[noreturn]] void throw_released(const char* name);

template <typename F>
Grads FunctionNode<F>::apply(Grads&& grads) {
  if (!fn_) throw_released(name_);
  return (*fn_)(grads);
}

// Note [node allocation]
// Every recorded op makes a node and frees it with its outputs, so make_node (record(), InplaceOp,
// the leaves' AccumulateGrad) keeps that cheap: the node and its shared_ptr control block are one
// block from the small-object pool (Note [small object pool] in core/small_pool.cc), and the node
// sits in a holder the shared_ptr aliases, so std::enable_shared_from_this does not see it: its
// weak self-reference would cost two locked instructions per node and keep the control block's
// weak count above 1, which sends every release down libstdc++'s atomic path (together about a
// sixth of a recorded 16-element add). Hence shared_from_this() throws std::bad_weak_ptr on the
// framework's nodes: keep the shared_ptr you got (grad_fn(), next_edges()) instead. A node made
// with std::make_shared has it as before.
namespace detail {
template <typename N>
struct NodeHolder {
  template <typename... Args>
  explicit NodeHolder(Args&&... args) : node(std::forward<Args>(args)...) {}
  N node;
};
}  // namespace detail
template <typename N, typename... Args>
std::shared_ptr<N> make_node(Args&&... args) {
  auto holder = std::allocate_shared<detail::NodeHolder<N>>(
      SmallPoolAllocator<detail::NodeHolder<N>>(), std::forward<Args>(args)...);
  N* node = &holder->node;
  return std::shared_ptr<N>(std::move(holder), node);  // aliasing: same control block
}

// True when grad mode is on and any defined input requires grad. Forced inline: every op asks,
// and Tensor::requires_grad() (which also looks at a view's base) is just past the size the
// compiler inlines on its own, which cost a call per op (Note [views and in-place autograd]).
[[gnu::always_inline]] inline bool needs_grad(const Tensor& a) {
  return grad_enabled() && a.defined() && a.requires_grad();
}
template <typename... Ts>
[[gnu::always_inline]] inline bool needs_grad(const Tensor& a, const Ts&... rest) {
  if (!grad_enabled()) return false;
  return (a.defined() && a.requires_grad()) || ((rest.defined() && rest.requires_grad()) || ...);
}
bool needs_grad(const std::vector<Tensor>& xs);

// The edge through which gradient flows into `t` (its grad_fn, or the leaf accumulator).
Edge gradient_edge(const Tensor& t);

// ---------------- saved tensors ----------------
//
// Note [saved tensors]
// A backward that reads a tensor its op can be given or returns (an input, an output, or a view
// of one) captures it as a SavedTensor: the tensor plus the version counter of its storage at the
// time (core/storage.h; every in-place write bumps it, views and detached aliases share it).
// unpack() compares the two and throws ValueError when an in-place op wrote the tensor since,
// naming the op whose backward runs, which input or output it was, its dtype and shape, and both
// versions (torch's "one of the variables needed for gradient computation has been modified by
// an inplace operation"): the backward would otherwise compute with values the forward never
// saw. An op saves only what its backward reads, so writes to anything else stay legal, as in
// torch: `y = x * 2; x.add_(1)` is fine (mul by a scalar saves nothing), `y = x.exp(); y.add_(1)`
// then backward is an error (exp saves its output). Tensors only the op itself can reach
// (workspaces, statistics, a converted or contiguous copy it made) may be captured as plain
// Tensors: nobody else can write them. The version check is one load and compare per unpack.
//
// Note [saved tensors and double backward]
// An input is kept as the tensor itself (as torch's SavedVariable does for non-outputs), history
// included, so a backward run with create_graph (grad mode on: Note [double backward] in
// autograd/engine.h) that computes with it records a graph reaching the input's history. An
// output is kept as a detached alias (the output itself would hold its own grad_fn: a reference
// cycle); under grad mode unpack() returns an alias whose grad_fn is the node that is running
// (the engine names it: current_node_owner()), as torch's SavedVariable::unpack(saved_for) does.
// That alias is kept by the running node's CurrentNodeScope (unpack returns a reference, as
// before: a by-value return grew every backward closure enough to change the inlining of the
// ops' forward paths) and released when the node's apply() returns. Without create_graph both
// return the saved data with no history work: grad mode is off.
//
// Indices count the op's tensor arguments and results: for index_select(x, dim, index), x is
// input 0 and index input 1; for max(x, dim), the indices are output 1.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output, uint32_t index)
      : data_(!t.defined() ? Tensor()
              : is_output  ? t.detach()
                           : t),
        version_(t.defined() ? t.version() : 0),
        index_(index),
        is_output_(is_output) {}
  bool defined() const { return data_.defined(); }
  // The saved tensor (undefined if an undefined one was saved); ValueError if it was modified in
  // place since it was saved. Under grad mode a saved output carries the running node as its
  // grad_fn (Note [saved tensors and double backward]); that tensor lives until the running
  // node's apply() returns.
  const Tensor& unpack() const {
    if (data_.defined() && data_.version() != version_) [[unlikely]]
      throw_modified();
    if (is_output_ && grad_enabled()) [[unlikely]]
      return output_with_history();
    return data_;
  }
  uint32_t saved_version() const { return version_; }

 private:
  [[noreturn]] void throw_modified() const;
  const Tensor& output_with_history() const;
  Tensor data_;
  uint32_t version_ = 0;
  uint32_t index_ = 0;
  bool is_output_ = false;
};
inline SavedTensor save_input(const Tensor& t, uint32_t index) { return {t, false, index}; }
inline SavedTensor save_output(const Tensor& t, uint32_t index = 0) { return {t, true, index}; }

// The node whose apply() runs on this thread (the engine sets it), for error messages; null
// outside a backward. current_node_owner() is the engine's owning pointer to it (null where the
// node was not run by the engine): the grad_fn a saved output gets under create_graph.
const Node* current_node();
const std::shared_ptr<Node>* current_node_owner();
class CurrentNodeScope {
 public:
  explicit CurrentNodeScope(const Node* n, const std::shared_ptr<Node>* owner = nullptr);
  ~CurrentNodeScope();
  CurrentNodeScope(const CurrentNodeScope&) = delete;
  CurrentNodeScope& operator=(const CurrentNodeScope&) = delete;

 private:
  const Node* prev_;
  const std::shared_ptr<Node>* prev_owner_;
  size_t prev_kept_;
};
// Keeps t until the innermost CurrentNodeScope ends; returns a reference to it (SavedTensor).
const Tensor& keep_for_current_node(Tensor t);

// ---------------- in-place ops ----------------
//
// Note [in-place ops]
// An in-place op writes `self` and, when autograd must see it, becomes self's history:
//
//     autograd::InplaceOp ip(self, "mul_", {&other});   // checks; decides whether to record
//     ...save what the backward needs from self's old value (a copy: it is overwritten)...
//     binary_stub(..., self, other, self, ...);          // the kernel writes self in place
//     if (ip.commit())                                   // bumps the version; true: record
//       ip.record([...](const Grads& g) { return Grads{d_self_before, d_other}; });
//
// It records when grad mode is on and self or an operand requires grad. Then a leaf that
// requires grad is refused (ValueError: its .grad would describe a value it no longer holds), as
// are views of one, views made under NoGradGuard (torch refuses them too: whether the write
// should be tracked is ambiguous) and views whose elements overlap (expand). The backward gets
// the gradient of self's new value and returns one per [self's old value, operands...]; saved
// outputs are saved after commit() (they must carry the bumped version). record() makes the node
// self's grad_fn: self now requires grad even if only an operand did (`buf.copy_(x)`), its
// retain_grad() slot moves to the node, hooks stay on the old one (they see the old value's
// gradient, as in torch). When self is a view, the history goes to its base instead (Note [views
// and in-place autograd]). Without recording, the op is the kernel and a version bump: no
// allocation, no node (the fast path of optimizers and init under NoGradGuard).
//
// Note [views and in-place autograd]
// The differentiable view ops record the view's base (TensorImpl::view_base_, always a non-view)
// and the view's geometry is its own sizes, strides and offset in the shared storage. An in-place
// op through a view rebases the base, as torch's CopySlices does: the base's grad_fn becomes a
// node that takes the base's gradient, hands the view's region of it to the in-place op's backward,
// writes back that backward's gradient for the view's old value into the region, and sends the
// result to the base's previous history; the in-place op's gradients for its operands go to
// them. The rest of the base passes through unchanged. A view's grad_fn is then stale: whenever
// its storage's version differs from the one its grad_fn was made for (AutogradMeta::
// attr_version), or its base requires grad and it has none, Tensor::grad_fn() (and every use as
// an op input) regenerates it as an as_strided view of the base's current history, so every view
// of the base sees the write. Unlike torch, outputs of split/chunk are ordinary views here and
// may be written in place; a view made under NoGradGuard is a plain alias for autograd
// (requires_grad only if set on it), and in place through it while recording is refused.
class InplaceOp {
 public:
  static constexpr size_t kMaxOperands = 4;
  InplaceOp(Tensor& self, const char* op, std::initializer_list<const Tensor*> operands = {});
  InplaceOp(Tensor& self, const char* op, const Tensor* const* operands, size_t n);
  bool recording() const { return record_; }
  // Bumps self's version; returns recording().
  bool commit() {
    self_->storage()->bump_version();
    return record_;
  }
  template <typename F>
  void record(F&& backward) {
    auto node = make_node<FunctionNode<std::decay_t<F>>>(op_, 1, std::forward<F>(backward));
    rebase(node);
  }

 private:
  void init(const Tensor* const* operands, size_t n);
  void rebase(const std::shared_ptr<Node>& node);
  Tensor* self_;
  const char* op_;
  // When recording: the edges of [self's old value, operands...], taken before the write (a
  // view operand's history must be the one of the values the op read).
  std::vector<Edge> edges_;
  bool record_ = false;
};

// Note [in-place methods]
// An in-place method that has an out-of-place op but no backward of its own (masked_fill_,
// index_add_, tril_, and any new one: index_put_, masked_scatter_, ...) is one call:
//
//     return autograd::inplace_method(*this, "index_add_", {src},
//         [&](const Tensor& s, const std::vector<Tensor>& o) { return index_add(s, dim, idx, o[0]);
//         });
//
// `fn` computes the new value of self from self and the operands with differentiable ops; its
// result must have self's dtype and shape (DTypeError / ShapeError naming op otherwise: an int
// tensor's add_(0.5) or a growing broadcast cannot be stored). It is stored into self through
// InplaceOp, so the checks, the version bump and the view rules are those of every in-place op.
// When recording, fn runs on stand-ins (a detached alias of self, detached leaves for the
// operands that require grad) and the in-place node's backward runs fn's graph from the incoming
// gradient to them (autograd::grad), so any composition of ops gets its gradient. Pass
// reads_self = true when fn's backward reads self's old value (pow_, ...): fn then gets a copy,
// since self is overwritten (getting it wrong is a version error at backward, never a wrong
// gradient). `kernel`, when given, writes the new value in place when nothing is recorded (no
// allocation); otherwise fn runs and its result is copied in.
using InplaceFn = std::function<Tensor(const Tensor& self, const std::vector<Tensor>& operands)>;
using InplaceKernel = std::function<void(Tensor& self)>;
Tensor& inplace_method(Tensor& self, const char* op, const std::vector<Tensor>& operands,
                       const InplaceFn& fn, bool reads_self = false,
                       const InplaceKernel& kernel = {});

// The grad_fn of a view, regenerated from its base when stale (Note [views and in-place
// autograd]); Tensor::grad_fn() calls it for views.
const std::shared_ptr<Node>& view_grad_fn(const Tensor& view);

// Connects `node` to its inputs and makes it the grad_fn of each output.
void set_history(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
                 std::initializer_list<Tensor*> outputs);
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs);

template <typename F>
std::shared_ptr<Node> record(const char* name, std::initializer_list<const Tensor*> inputs,
                             std::initializer_list<Tensor*> outputs, F&& backward) {
  auto node = make_node<FunctionNode<std::decay_t<F>>>(name, uint32_t(outputs.size()),
                                                       std::forward<F>(backward));
  set_history(node, inputs, outputs);
  return node;
}
template <typename F>
std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor*>& outputs, F&& backward) {
  auto node = make_node<FunctionNode<std::decay_t<F>>>(name, uint32_t(outputs.size()),
                                                       std::forward<F>(backward));
  set_history(node, inputs, outputs);
  return node;
}

// Registry of differentiable op names: each op registers itself, and the gradcheck test fails
// for any registered op without a sample input.
struct OpRegistrar {
  explicit OpRegistrar(const char* name);
};
const std::vector<const char*>& differentiable_ops();
#define ACCEL_DIFFERENTIABLE_OP(id, name) \
  static const ::accel::autograd::OpRegistrar accel_op_registrar_##id(name)

// Runs backward from roots with the given gradients (undefined = ones for a scalar root); with
// create_graph the backward formulas run in grad mode and record a graph (Note [double backward]
// in autograd/engine.h).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph, bool create_graph = false);
// Gradients of outputs w.r.t. inputs (leaves) without touching .grad: libtorch's
// torch::autograd::grad, with its arguments and defaults. retain_graph defaults to create_graph;
// create_graph records the gradients' own graph (grad of grad); allow_unused returns an
// undefined tensor for an input the outputs do not depend on (else ValueError).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);
// libtorch's torch::autograd::backward: Tensor::backward for several roots at once.
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);

// Runs the graph from `roots` (with their gradients) and returns the gradient that reaches each
// of `leaves` (leaf tensors that require grad, or stand_in()s; undefined where none arrives)
// without running past them: the engine of grad(), also used by inplace_method's backward and
// recompute_grads. .grad of other leaves is left alone unless accumulate_leaves.
std::vector<Tensor> grad_from_edges(const std::vector<Edge>& roots, std::vector<Tensor> grads,
                                    const std::vector<Tensor>& leaves, bool retain_graph,
                                    bool create_graph = false, bool accumulate_leaves = false);

// ---------------- double backward (Note [double backward] in autograd/engine.h) ----------------

// Inside a backward formula: whether the engine runs with create_graph (grad mode is on exactly
// then), so the formula must build its result from differentiable ops.
inline bool creating_graph() { return grad_enabled(); }

// The error of a backward that cannot record its own graph: "[op] double backward is not
// supported: <why>". tests/autograd/gradgradcheck_main.cc lists every op that throws it.
[[noreturn]] void throw_no_double_backward(const char* op, const char* why);

// Note [stand-ins]
// An alias of t's data whose grad_fn is one node passing its gradient on to t's history (t's
// grad_fn, or its leaf accumulator). A computation run on stand-ins records a graph that ends at
// them: grad_from_edges with the stand-ins as `leaves` returns the gradients that reach them
// without going further (nothing of t's history runs), and because the stand-in's node still
// leads to t's history, a graph recorded from those gradients (create_graph) reaches t. Used by
// inplace_method, recompute_grads and activation checkpointing.
Tensor stand_in(const Tensor& t);
// Stand-in of a detached copy of t's value (the value must outlive an in-place write to t).
Tensor stand_in_copy(const Tensor& t);
// Stand-in of `data` (no history of its own) passing its gradient to `edge`.
Tensor stand_in(const Tensor& data, const Edge& edge);

// Note [double backward by recompute]
// A fused op whose backward is a kernel of its own (layer_norm, sdpa, the fused LSTM layer, ...)
// keeps that kernel for the plain backward; under create_graph its backward calls this instead:
// fn (the op's composed form from differentiable ops) runs again on stand-ins of `inputs` (the
// op's inputs, saved with their history) and the gradients of its outputs, seeded with `grads`
// (one per output; undefined ones are skipped), are taken with create_graph. Returns one gradient
// per input (undefined for an input that does not require grad or gets none). Costs one forward
// of the composed form, on the double-backward path only.
using RecomputeFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
Grads recompute_grads(const std::vector<Tensor>& inputs, const Grads& grads, const RecomputeFn& fn);

// Gradient helper: `g` when defined, else zeros shaped like `like`.
Tensor grad_or_zeros(const Tensor& g, const Tensor& like);

}  // namespace accel::autograd
