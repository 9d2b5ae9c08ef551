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
// in as one per output (undefined when that output got none) and go out as one per input.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

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
  void add_pre_hook(uint32_t output_nr, GradHook hook);
  const std::vector<std::pair<uint32_t, GradHook>>& pre_hooks() const { return pre_hooks_; }

 protected:
  EdgeList next_edges_;
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks_;
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

// True when grad mode is on and any defined input requires grad.
inline bool needs_grad(const Tensor& a) {
  return grad_enabled() && a.defined() && a.requires_grad();
}
template <typename... Ts>
bool needs_grad(const Tensor& a, const Ts&... rest) {
  if (!grad_enabled()) return false;
  return (a.defined() && a.requires_grad()) || ((rest.defined() && rest.requires_grad()) || ...);
}
bool needs_grad(const std::vector<Tensor>& xs);

// The edge through which gradient flows into `t` (its grad_fn, or the leaf accumulator).
Edge gradient_edge(const Tensor& t);

// Connects `node` to its inputs and makes it the grad_fn of each output.
void set_history(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
                 std::initializer_list<Tensor*> outputs);
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs);

template <typename F>
std::shared_ptr<Node> record(const char* name, std::initializer_list<const Tensor*> inputs,
                             std::initializer_list<Tensor*> outputs, F&& backward) {
  auto node = std::make_shared<FunctionNode<std::decay_t<F>>>(name, uint32_t(outputs.size()),
                                                              std::forward<F>(backward));
  set_history(node, inputs, outputs);
  return node;
}
template <typename F>
std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor*>& outputs, F&& backward) {
  auto node = std::make_shared<FunctionNode<std::decay_t<F>>>(name, uint32_t(outputs.size()),
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

// Runs backward from roots with the given gradients (undefined = ones for a scalar root).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph);
// Gradients of outputs w.r.t. inputs without touching .grad (torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// Gradient helper: `g` when defined, else zeros shaped like `like`.
Tensor grad_or_zeros(const Tensor& g, const Tensor& like);

}  // namespace accel::autograd
