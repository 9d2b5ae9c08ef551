// Custom autograd functions (Note [custom functions] in autograd/custom_function.h): the node,
// the context, and the wrapping of one apply() call.
#include "autograd/custom_function.h"

#include <cxxabi.h>

#include <cstdlib>

#include "autograd/ops.h"

namespace accel::autograd {

// ---------------- IValue ----------------

const char* IValue::tagKind() const {
  static const char* const kinds[] = {"None",   "Bool",   "Int",     "Double",
                                      "String", "Tensor", "IntList", "DoubleList"};
  return kinds[v_.index()];
}

void IValue::wrong_kind(const char* want) const {
  ACCEL_THROW(ValueError, "IValue", "expected ", want, " but got ", tagKind());
}

namespace detail {

namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  return s;
}

bool contains(const variable_list& list, const Tensor& t) {
  for (const Tensor& x : list)
    if (x.defined() && x.is_same(t)) return true;
  return false;
}

struct TensorInfo {
  Shape sizes;
  DType dtype = kFloat32;
  Device device = kCPU;
};

}  // namespace

// The grad_fn of a custom function's outputs; edges: one per Tensor argument.
class CustomFunctionNode final : public Node {
 public:
  CustomFunctionNode(const char* mangled, CustomBackwardFn backward)
      : Node(0), name_(demangle(mangled)), backward_(backward) {
    ctx_.name_ = name_.c_str();
  }
  const char* name() const override { return name_.c_str(); }
  void release() override {
    ctx_.saved_.clear();
    ctx_.released_ = true;
  }
  bool released() const override { return ctx_.released_; }

  Grads apply(Grads&& grads) override {
    if (ctx_.released_) throw_released(name());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined() || !ctx_.materialize_grads_) continue;
      const TensorInfo& o = outputs_[i];
      grads[i] = zeros(o.sizes, TensorOptions(o.dtype, o.device));
    }
    variable_list res = backward_(&ctx_, std::move(grads));
    const size_t n_args = is_tensor_arg_.size();
    // Extra trailing results are allowed when undefined (libtorch).
    for (size_t i = n_args; i < res.size(); ++i) {
      ACCEL_CHECK(!res[i].defined(), ValueError, name(),
                  "function backward returned an incorrect number of gradients (expected ", n_args,
                  " but got ", res.size(), ")");
    }
    ACCEL_CHECK(res.size() >= n_args, ValueError, name(),
                "function backward returned an incorrect number of gradients (expected ", n_args,
                " but got ", res.size(), "): one per forward argument, undefined for non-tensors");
    Grads out;
    out.reserve(inputs_.size());
    for (size_t i = 0; i < n_args; ++i) {
      if (!is_tensor_arg_[i]) {
        ACCEL_CHECK(!res[i].defined(), ValueError, name(),
                    "function backward returned a gradient for non-tensor argument ", i,
                    "; return an undefined Tensor() there");
        continue;
      }
      out.push_back(checked_grad(std::move(res[i]), out.size(), i));
    }
    return out;
  }

  AutogradContext& ctx() { return ctx_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  std::vector<bool> is_tensor_arg_;
  std::vector<TensorInfo> inputs_, outputs_;

 private:
  // The gradient of tensor input k (forward argument i), fitted to the input as libtorch does.
  Tensor checked_grad(Tensor g, size_t k, size_t i) const {
    if (!g.defined() || !next_edges_[k].valid()) return Tensor();
    const TensorInfo& in = inputs_[k];
    ACCEL_CHECK(g.device() == in.device, DeviceError, name(), "function backward returned a ",
                g.device(), " gradient for argument ", i, " on ", in.device);
    if (g.sizes() != in.sizes) {
      ACCEL_CHECK(is_broadcastable_to(in.sizes, g.sizes()), ShapeError, name(),
                  "function backward returned a gradient of shape ", g.sizes(), " for argument ", i,
                  " of shape ", in.sizes);
      g = sum_to(g, in.sizes);
    }
    if (g.dtype() != in.dtype && is_floating(in.dtype)) g = g.to(in.dtype);
    return g;
  }

  std::string name_;
  CustomBackwardFn backward_;
  AutogradContext ctx_;
};

// ---------------- CustomCall ----------------

CustomCall::CustomCall(const char* mangled_name, CustomBackwardFn backward, variable_list inputs,
                       std::vector<bool> is_tensor_arg)
    : node_(std::make_shared<CustomFunctionNode>(mangled_name, backward)),
      inputs_(std::move(inputs)) {
  executable_ = needs_grad(inputs_);
  node_->is_tensor_arg_ = std::move(is_tensor_arg);
  AutogradContext& ctx = node_->ctx();
  ctx.needs_input_grad_.reserve(inputs_.size());
  if (executable_) {
    EdgeList& edges = node_->mutable_next_edges();
    edges.reserve(inputs_.size());
    for (const Tensor& x : inputs_) {
      edges.push_back(x.defined() ? gradient_edge(x) : Edge{});
      node_->inputs_.push_back(x.defined() ? TensorInfo{x.sizes(), x.dtype(), x.device()}
                                           : TensorInfo{});
    }
  }
  for (size_t i = 0; i < inputs_.size(); ++i)
    ctx.needs_input_grad_.push_back(executable_ && node_->next_edges()[i].valid());
}

AutogradContext* CustomCall::ctx() { return &node_->ctx(); }

void CustomCall::finish(variable_list& outputs) {
  AutogradContext& ctx = node_->ctx();
  const char* name = node_->name();
  for (const Tensor& d : ctx.dirty_) {
    ACCEL_CHECK(contains(outputs, d), ValueError, name, "a tensor marked dirty (shape ", d.sizes(),
                ") is not returned by forward; return every tensor modified in place");
    ACCEL_CHECK(contains(inputs_, d), ValueError, name, "a tensor marked dirty (shape ", d.sizes(),
                ") is not an argument of forward");
  }
  if (!executable_) {
    ctx.to_save_.clear();
    return;
  }
  for (const Tensor& d : ctx.dirty_) {
    ACCEL_CHECK(!(d.is_leaf() && d.requires_grad()), ValueError, name,
                "a leaf tensor that requires grad (shape ", d.sizes(),
                ") is modified in place by forward (mark_dirty); clone it first");
    ACCEL_CHECK(!d.is_view(), ValueError, name, "a view (shape ", d.sizes(),
                ") modified in place by a custom function (mark_dirty) is not supported; clone "
                "it first");
  }
  std::vector<Tensor*> attach;  // the outputs that get the node as grad_fn
  for (Tensor& o : outputs) {
    if (!o.defined()) {
      attach.push_back(nullptr);
      continue;
    }
    const bool differentiable = is_floating(o.dtype()) && !contains(ctx.non_differentiable_, o);
    // An argument returned as it is (not modified) comes back as an alias, so its own history
    // stays (torch's view_as).
    if (!contains(ctx.dirty_, o) && contains(inputs_, o)) o = o.detach();
    attach.push_back(differentiable ? &o : nullptr);
  }
  set_history(node_, std::vector<Tensor>{}, attach);  // the edges are set: attaches the outputs
  for (const Tensor& o : outputs)
    node_->outputs_.push_back(o.defined() ? TensorInfo{o.sizes(), o.dtype(), o.device()}
                                          : TensorInfo{});
  node_->set_num_outputs(uint32_t(outputs.size()));
  ctx.saved_.reserve(ctx.to_save_.size());
  for (const Tensor& t : ctx.to_save_) {
    uint32_t out_nr = 0;
    bool is_output = false;
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (attach[j] && outputs[j].is_same(t)) {
        is_output = true;
        out_nr = uint32_t(j);
      }
    }
    uint32_t in_nr = 0;
    for (size_t k = 0; k < inputs_.size(); ++k)
      if (inputs_[k].is_same(t)) in_nr = uint32_t(k);
    ctx.saved_.emplace_back(t, is_output, is_output ? out_nr : in_nr);
  }
  ctx.to_save_.clear();
}

}  // namespace detail

// ---------------- AutogradContext ----------------

void AutogradContext::save_for_backward(variable_list to_save) { to_save_ = std::move(to_save); }

variable_list AutogradContext::get_saved_variables() const {
  if (released_) throw_released(name_);
  variable_list out;
  out.reserve(saved_.size());
  for (const SavedTensor& s : saved_) out.push_back(s.unpack());
  return out;
}

void AutogradContext::mark_dirty(const variable_list& inputs) { dirty_ = inputs; }

void AutogradContext::mark_non_differentiable(const variable_list& outputs) {
  non_differentiable_ = outputs;
}

bool AutogradContext::needs_input_grad(size_t output_edge_index) const {
  ACCEL_CHECK(output_edge_index < needs_input_grad_.size(), IndexError, name_, "needs_input_grad(",
              output_edge_index, "): the function has ", needs_input_grad_.size(),
              " tensor arguments");
  return needs_input_grad_[output_edge_index];
}

}  // namespace accel::autograd
