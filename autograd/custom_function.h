// Custom autograd functions with a context, as libtorch spells them
// (torch/csrc/autograd/custom_function.h):
//
//   struct MulConst : autograd::Function<MulConst> {
//     static Tensor forward(autograd::AutogradContext* ctx, Tensor x, double c) {
//       ctx->saved_data["c"] = c;
//       ctx->save_for_backward({x});
//       return x * c;
//     }
//     static autograd::variable_list backward(autograd::AutogradContext* ctx,
//                                             autograd::variable_list grad_outputs) {
//       const double c = ctx->saved_data["c"].toDouble();
//       return {grad_outputs[0] * c, Tensor()};  // one per forward argument: c gets none
//     }
//   };
//   Tensor y = MulConst::apply(x, 2.0);
//
// Note [custom functions]
// apply() runs forward with grad mode off and, when grad mode is on and a tensor argument
// requires grad, makes one node the grad_fn of every floating output (the outputs a forward
// returns are its results; an argument returned as it is comes back as an alias). The node's
// backward calls T::backward with one gradient per output (zeros for an output that got none,
// unless set_materialize_grads(false): then undefined) and takes one result per forward
// argument: a gradient (or undefined) for each Tensor argument, undefined for the others; extra
// trailing undefined results are allowed, as in libtorch. A gradient whose shape differs from its
// input's is summed to it when it broadcasts, else ShapeError; a dtype differing from a floating
// input's is converted.
//   - save_for_backward / get_saved_variables: SavedTensors (Note [saved tensors] in
//     autograd/function.h): modifying one in place after the forward is the usual version error
//     at get_saved_variables(), and after a backward without retain_graph they are freed (a
//     second backward throws). Non-tensor values go in saved_data (IValue, below).
//   - mark_dirty(tensors): the forward modified these arguments in place and returns them; they
//     get the node as grad_fn (a leaf that requires grad is refused, as for every in-place op,
//     and so is a view: clone it first).
//   - mark_non_differentiable(outputs): those outputs do not require grad; their incoming
//     gradient is zeros (or undefined without materialize_grads).
//   - needs_input_grad(i): whether Tensor argument i (counting Tensor arguments only) gets a
//     gradient, in forward and backward.
// backward runs under the engine's grad mode: with create_graph it must compute from
// differentiable ops (and does, when written with them), and get_saved_variables() returns the
// saved inputs with their history and the saved outputs with this node as grad_fn (Note [saved
// tensors and double backward]), so double backward through a custom function works.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "autograd/function.h"
#include "core/tensor.h"

namespace accel::autograd {

using variable_list = std::vector<Tensor>;

// A non-tensor value kept in ctx->saved_data: libtorch's at::IValue, for the kinds a backward
// needs (none, bool, integer, double, string, tensor, integer and double lists). The accessor of
// another kind throws ValueError naming both kinds.
class IValue {
 public:
  IValue() = default;
  IValue(bool v) : v_(v) {}  // NOLINT: implicit, as libtorch's
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  IValue(T v) : v_(int64_t(v)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  IValue(T v) : v_(double(v)) {}                                            // NOLINT
  IValue(const char* v) : v_(std::string(v)) {}                             // NOLINT
  IValue(std::string v) : v_(std::move(v)) {}                               // NOLINT
  IValue(Tensor v) : v_(std::move(v)) {}                                    // NOLINT
  IValue(std::vector<int64_t> v) : v_(std::move(v)) {}                      // NOLINT
  IValue(const Shape& v) : v_(std::vector<int64_t>(v.begin(), v.end())) {}  // NOLINT
  IValue(std::vector<double> v) : v_(std::move(v)) {}                       // NOLINT

  bool isNone() const { return v_.index() == 0; }
  bool isBool() const { return std::holds_alternative<bool>(v_); }
  bool isInt() const { return std::holds_alternative<int64_t>(v_); }
  bool isDouble() const { return std::holds_alternative<double>(v_); }
  bool isString() const { return std::holds_alternative<std::string>(v_); }
  bool isTensor() const { return std::holds_alternative<Tensor>(v_); }
  bool isIntList() const { return std::holds_alternative<std::vector<int64_t>>(v_); }
  bool isDoubleList() const { return std::holds_alternative<std::vector<double>>(v_); }

  bool toBool() const { return get<bool>("Bool"); }
  int64_t toInt() const { return get<int64_t>("Int"); }
  double toDouble() const { return get<double>("Double"); }
  const std::string& toStringRef() const { return get<std::string>("String"); }
  const Tensor& toTensor() const { return get<Tensor>("Tensor"); }
  const std::vector<int64_t>& toIntVector() const { return get<std::vector<int64_t>>("IntList"); }
  const std::vector<double>& toDoubleVector() const {
    return get<std::vector<double>>("DoubleList");
  }
  // "None", "Bool", "Int", "Double", "String", "Tensor", "IntList", "DoubleList".
  const char* tagKind() const;

 private:
  template <typename T>
  const T& get(const char* want) const {
    if (const T* p = std::get_if<T>(&v_)) return *p;
    wrong_kind(want);
  }
  [[noreturn]] void wrong_kind(const char* want) const;
  std::variant<std::monostate, bool, int64_t, double, std::string, Tensor, std::vector<int64_t>,
               std::vector<double>>
      v_;
};

namespace detail {
class CustomFunctionNode;
class CustomCall;
}  // namespace detail

// The `ctx` of a custom function (Note [custom functions]).
class AutogradContext {
 public:
  // Values for the backward that are not tensors to version-check (libtorch's saved_data).
  std::unordered_map<std::string, IValue> saved_data;

  // Tensors the backward reads: arguments or outputs of the forward (each version-checked).
  void save_for_backward(variable_list to_save);
  // The saved tensors, in order; ValueError if one was modified in place since, or if a
  // backward without retain_graph freed them.
  variable_list get_saved_variables() const;
  // Arguments the forward modified in place (and returns).
  void mark_dirty(const variable_list& inputs);
  // Outputs that get no gradient.
  void mark_non_differentiable(const variable_list& outputs);
  // false: an output that got no gradient is passed to backward as an undefined tensor.
  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  // Whether Tensor argument `output_edge_index` (Tensor arguments counted alone) gets a gradient.
  bool needs_input_grad(size_t output_edge_index) const;

 private:
  friend class detail::CustomFunctionNode;
  friend class detail::CustomCall;
  const char* name_ = "Function";
  variable_list to_save_;
  std::vector<SavedTensor> saved_;
  variable_list dirty_, non_differentiable_;
  std::vector<bool> needs_input_grad_;
  bool materialize_grads_ = true;
  bool released_ = false;
};

namespace detail {

using CustomBackwardFn = variable_list (*)(AutogradContext*, variable_list);

// One apply() call: made before forward (the node, its edges, needs_input_grad), finished after
// it (outputs wrapped, tensors saved). Non-template, in autograd/custom_function.cc.
class CustomCall {
 public:
  CustomCall(const char* mangled_name, CustomBackwardFn backward, variable_list inputs,
             std::vector<bool> is_tensor_arg);
  AutogradContext* ctx();
  void finish(variable_list& outputs);

 private:
  std::shared_ptr<CustomFunctionNode> node_;
  variable_list inputs_;
  bool executable_ = false;
};

inline void extract_arg(std::vector<bool>& is_tensor, variable_list& tensors, const Tensor& t) {
  is_tensor.push_back(true);
  tensors.push_back(t);
}
inline void extract_arg(std::vector<bool>& is_tensor, variable_list& tensors,
                        const std::optional<Tensor>& t) {
  is_tensor.push_back(true);
  tensors.push_back(t ? *t : Tensor());
}
template <typename T>
void extract_arg(std::vector<bool>& is_tensor, variable_list&, const T&) {
  is_tensor.push_back(false);
}

}  // namespace detail

// CRTP base of a custom function: T defines static forward(AutogradContext*, args...) returning
// Tensor or variable_list, and static backward(AutogradContext*, variable_list) (Note [custom
// functions]).
template <class T>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    variable_list inputs;
    std::vector<bool> is_tensor;
    (detail::extract_arg(is_tensor, inputs, args), ...);
    detail::CustomCall call(typeid(T).name(), &T::backward, std::move(inputs),
                            std::move(is_tensor));
    using R = decltype(T::forward(call.ctx(), std::forward<Args>(args)...));
    static_assert(std::is_same_v<R, Tensor> || std::is_same_v<R, variable_list>,
                  "a custom Function's forward returns Tensor or variable_list");
    R out;
    {
      NoGradGuard no_grad;
      out = T::forward(call.ctx(), std::forward<Args>(args)...);
    }
    if constexpr (std::is_same_v<R, Tensor>) {
      variable_list outs{std::move(out)};
      call.finish(outs);
      return outs[0];
    } else {
      call.finish(out);
      return out;
    }
  }
};

}  // namespace accel::autograd
