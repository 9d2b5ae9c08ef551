// nn::Module: a tree of named parameters, buffers and submodules.
//
//   struct MLP : nn::Module {
//     std::shared_ptr<nn::Linear> fc1 = register_module("fc1", std::make_shared<nn::Linear>(784,
//     1024)); std::shared_ptr<nn::Linear> fc2 = register_module("fc2",
//     std::make_shared<nn::Linear>(1024, 10)); Tensor forward(const Tensor& x) override { return
//     fc2->forward(relu(fc1->forward(x))); }
//   };
//   auto model = std::make_shared<MLP>();
//   model->named_parameters();  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
//
// Parameters and buffers are Tensor handles: the member a subclass keeps (`weight` above) and the
// entry in the module's table share one TensorImpl, so `to()` and `load_state_dict()` change
// what the member sees (see Note [module tensors are updated in place]).
//
// Deferred init (Note [deferred init] in module.cc): a model too big for one process is built
// without memory and materialized later, piece by piece:
//
//   std::shared_ptr<Gpt> model;
//   { nn::DeferredInit deferred; model = std::make_shared<Gpt>(cfg); }  // shapes, no memory
//   nn::materialize(*model);  // same values as eager construction with the same seed
#pragma once

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "io/tensor_dict.h"
#include "nn/call.h"
#include "nn/init.h"

namespace accel::nn {

// io/tensor_dict.h's types: what state_dict() returns and safetensors files hold.
using io::Metadata;
using io::TensorDict;

template <typename T>
using Named = std::vector<std::pair<std::string, T>>;

// What a non-strict load_state_dict() skipped.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// Note [module calls]
// PyTorch modules take any arguments and return anything; containers, hooks, DDP and FSDP pass
// them through untouched. C++ needs the forward's types at compile time, while containers hold
// `shared_ptr<Module>` and engines wrap modules they know only as Module. The bridge is a
// type-erased call: arguments as nn::Values (tensor, None, bool, int64, double), results as a
// flat std::vector<Tensor> (nn/call.h flattens tuples and structs of tensors field by field and
// rebuilds them), with one virtual, forward_values, from which every other path is built.
//
// Where the typed forward meets the erased one. A base class cannot see a derived class's
// forward, so something must capture Self. Three ways were weighed:
//  - capture the type where the module is registered or prepared (libtorch's AnyModule inside
//    Sequential does this): nothing to write in the module, but it works only through the
//    registration paths that saw the type (not for a model held as shared_ptr<Module>, not for
//    the root model the user calls), and gives no typed operator() on the module itself;
//  - a value type in the signature (forward(const Values&)): one virtual, but every module
//    unpacks its own arguments by hand and loses its types: nothing a PyTorch user writes;
//  - a CRTP base, TypedModule<Self>: one word in the class head (libtorch users know the shape
//    from torch::nn::Cloneable<Impl>), and from &Self::forward it generates forward_values,
//    forward_signature (for error messages) and a typed operator() that runs hooks and returns
//    forward's own type. It works wherever the module is held, in any container, as a root or
//    a child, and a wrong call fails at compile time on the typed path.
// TypedModule is the one chosen. The one-tensor case is unchanged: derive from Module, override
// Tensor forward(const Tensor&), call (*m)(x) or m->forward(x).
//
// Paths. operator() / call<R>() / call_values() run the hooks (and an engine's call wrapper);
// forward() runs none, as in PyTorch. Through a Module pointer, call<R>(args...) packs the
// arguments, runs the erased call and rebuilds R; the typed operator() packs its arguments only
// when hooks are registered (otherwise it is self.forward(args...)) and unpacks them into the
// types it was given, so default arguments work. The erased forward_values maps values to
// Self::forward's parameters: each value's kind must fit its parameter (an int converts to a
// double; None fits Tensor and optional<Tensor>), trailing optional<Tensor> parameters may be
// left out, anything else is a ValueError naming the type and the signature.
//
// Hooks (PyTorch's forward pre-hooks and forward hooks) see the tensors: the tensor arguments in
// order (None as an undefined tensor; plain arguments are not shown) and the flattened result.
// They may replace tensors but not change their number.
//
// Call wrappers. A ZeRO-3 unit (dist/fsdp.h) must run code around its module's forward:
// gather parameters before, release them and hook the outputs' gradients after, or run the
// forward under activation checkpointing. set_call_wrapper installs such an engine wrapper on
// the module itself; it gets the erased arguments and a copyable function running hooks and
// forward, so it can cast the tensor arguments, run the function inside autograd::checkpoint,
// and see every output tensor, whatever the signature. Calls that go through forward() directly
// bypass it, which is why containers route their entries' forward() calls to operator() while a
// unit is wrapped (Note [entry wrappers] in nn/container.h).

class Module;
struct CallHooks;

// PyTorch's RemovableHandle: remove() unregisters the hook (a no-op once done, or when the
// module is gone).
class HookHandle {
 public:
  HookHandle() = default;
  void remove();

 private:
  friend class Module;
  HookHandle(std::weak_ptr<CallHooks> hooks, uint64_t id) : hooks_(std::move(hooks)), id_(id) {}
  std::weak_ptr<CallHooks> hooks_;
  uint64_t id_ = 0;
};

using ForwardPreHook = std::function<void(Module& module, std::vector<Tensor>& inputs)>;
using ForwardHook = std::function<void(Module& module, const std::vector<Tensor>& inputs,
                                       std::vector<Tensor>& outputs)>;
// Runs the rest of a call (hooks and forward) over the arguments; copyable, so that a wrapper
// can keep it (activation checkpointing runs it again in backward).
using CallFn = std::function<std::vector<Tensor>(Values& inputs)>;
using CallWrapper =
    std::function<std::vector<Tensor>(Module& module, Values& inputs, const CallFn& call)>;

// What a module's calls run besides its forward (null in Module until something registers).
struct CallHooks {
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<std::pair<uint64_t, ForwardHook>> post;
  CallWrapper wrapper;
  uint64_t next_id = 1;
  // Calls of the module's forward in progress through run_call (Module::check_not_bypassed).
  int depth = 0;
  bool active() const { return !pre.empty() || !post.empty() || bool(wrapper); }
};

// ---- members the module sees assigned (Note [module members] in module_members.cc) ----
//
//   struct Net : nn::Module {
//     nn::Child<nn::Linear> fc = register_module("fc", std::make_shared<nn::Linear>(512, 10));
//     nn::Parameter scale = register_parameter("scale", ones({10}));
//     nn::Buffer mask = register_buffer("mask", tril(ones({8, 8})));
//   };
//   net->fc = std::make_shared<nn::Linear>(512, 2);  // replaces the child, as torch's setattr
//   head->weight = emb->weight;                        // ties: parameters() lists it once
//
// A member declared as nn::Parameter, nn::Buffer or nn::Child<M> and initialised (or assigned)
// from register_parameter / register_buffer / register_module is bound to that entry of the
// module's table: assigning the member assigns the entry, so state_dict(), parameters(),
// named_modules(), to(), hooks and optimizers built afterwards see the new object; changing the
// entry (set_parameter, register_* on the same name) changes the member. A member declared as a
// plain Tensor / std::shared_ptr<M> is a copy of the handle: assigning it later changes only
// the member (the module cannot see it). Copies of a bound member are plain handles.

enum class MemberKind : uint8_t { Parameter, Buffer };
template <MemberKind K>
class TensorMember;

// What register_parameter / register_buffer return: the registered tensor, and the entry that
// holds it, for a member to bind to. Used as a Tensor, it is the registered tensor.
template <MemberKind K>
class TensorRegistration : public Tensor {
 public:
  TensorRegistration(Tensor t, Module* owner, uint32_t index)
      : Tensor(std::move(t)), owner_(owner), index_(index) {}

 private:
  friend class TensorMember<K>;
  Module* owner_;
  uint32_t index_;
};

// A parameter or buffer member (Note [module members]); a Tensor in every other respect.
template <MemberKind K>
class TensorMember : public Tensor {
 public:
  TensorMember() = default;
  TensorMember(const Tensor& t) : Tensor(t) {}  // NOLINT: a plain handle, unbound
  TensorMember(TensorRegistration<K>&& r) : Tensor(r) { bind(r.owner_, r.index_); }  // NOLINT
  TensorMember(const TensorMember& other) : Tensor(other) {}  // a copy is not the member
  ~TensorMember() { unbind(); }
  // Bound: the module's entry becomes `t` (a parameter: a floating leaf or undefined for None,
  // ValueError otherwise; a buffer: detached), then this member. Unbound: rebinds the handle.
  TensorMember& operator=(const Tensor& t) {
    assign(t);
    return *this;
  }
  TensorMember& operator=(const TensorMember& other) {
    assign(other);
    return *this;
  }
  // Binds this member to the new registration (and unbinds it from any earlier one).
  TensorMember& operator=(TensorRegistration<K>&& r) {
    unbind();
    Tensor::operator=(r);
    bind(r.owner_, r.index_);
    return *this;
  }
  // The module whose entry this member is (null for a plain handle).
  Module* owner() const { return owner_; }

 private:
  friend class Module;
  void bind(Module* owner, uint32_t index);
  void unbind();
  void assign(const Tensor& t);
  Module* owner_ = nullptr;
  uint32_t index_ = 0;
};
using Parameter = TensorMember<MemberKind::Parameter>;
using Buffer = TensorMember<MemberKind::Buffer>;
using ParameterRegistration = TensorRegistration<MemberKind::Parameter>;
using BufferRegistration = TensorRegistration<MemberKind::Buffer>;

// What register_module returns: the registered module and the entry that holds it.
template <typename M>
class ModuleRegistration : public std::shared_ptr<M> {
 public:
  ModuleRegistration(std::shared_ptr<M> m, Module* owner, uint32_t index)
      : std::shared_ptr<M>(std::move(m)), owner_(owner), index_(index) {}
  Module* owner_;
  uint32_t index_;
};

// The untyped half of nn::Child<M>: which entry it is bound to.
class ChildMember {
 public:
  Module* owner() const { return owner_; }

 protected:
  ChildMember() = default;
  ChildMember(const ChildMember&) {}  // a copy is not the member
  ChildMember& operator=(const ChildMember&) { return *this; }
  ~ChildMember() { unbind(); }
  void bind(Module* owner, uint32_t index);
  void unbind();
  // Bound: the module's entry becomes `m` (null for None), then this member.
  void assign_entry(std::shared_ptr<Module> m);
  // Whether this member's type can hold `m`, and taking it (after the entry changed).
  virtual bool accepts(const Module* m) const = 0;
  virtual void take(const std::shared_ptr<Module>& m) = 0;
  virtual const char* held_type() const = 0;
  Module* owner_ = nullptr;
  uint32_t index_ = 0;

 private:
  friend class Module;
};

// A submodule member (Note [module members]); a std::shared_ptr<M> in every other respect.
template <typename M>
class Child : public std::shared_ptr<M>, public ChildMember {
 public:
  Child() = default;
  Child(std::nullptr_t) {}                                           // NOLINT
  Child(std::shared_ptr<M> m) : std::shared_ptr<M>(std::move(m)) {}  // NOLINT: unbound
  template <typename U>
  requires std::is_base_of_v<M, U> Child(ModuleRegistration<U>&& r)
      : std::shared_ptr<M>(r) {  // NOLINT
    bind(r.owner_, r.index_);
  }
  Child(const Child& other) : std::shared_ptr<M>(other), ChildMember() {}
  Child& operator=(std::shared_ptr<M> m) {
    if (owner_) {
      assign_entry(std::move(m));
    } else {
      std::shared_ptr<M>::operator=(std::move(m));
    }
    return *this;
  }
  Child& operator=(std::nullptr_t) { return *this = std::shared_ptr<M>(); }
  Child& operator=(const Child& other) { return *this = std::shared_ptr<M>(other); }
  template <typename U>
  requires(std::is_base_of_v<M, U> && !std::is_same_v<M, U>) Child& operator=(
      std::shared_ptr<U> m) {
    return *this = std::shared_ptr<M>(std::move(m));
  }
  template <typename U>
  requires std::is_base_of_v<M, U> Child& operator=(ModuleRegistration<U>&& r) {
    unbind();
    std::shared_ptr<M>::operator=(r);
    bind(r.owner_, r.index_);
    return *this;
  }

 private:
  bool accepts(const Module* m) const override;
  void take(const std::shared_ptr<Module>& m) override {
    std::shared_ptr<M>::operator=(std::dynamic_pointer_cast<M>(m));
  }
  const char* held_type() const override { return typeid(M).name(); }
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- forward (Note [module calls]) ----
  // The one-tensor forward. A module with another signature derives from TypedModule<Self>
  // (below), which implements this one through its typed forward when that takes one tensor
  // (plus optional ones) and returns one; otherwise calling it throws ValueError.
  // C++ fixes a virtual's return type: a typed forward over exactly (const Tensor&) overrides
  // this one and must return Tensor; a one-input module with a tuple or struct result takes
  // its input by value, `VaeOut forward(Tensor x)`.
  virtual Tensor forward(const Tensor& x);
  // forward(x) through this module's forward pre-hooks, forward hooks and call wrapper, as
  // PyTorch's module(x); forward(x) itself runs none of them. With none registered, forward(x).
  Tensor operator()(const Tensor& x) { return intercepted() ? call_one(x) : forward(x); }
  // A call of any module with any arguments (Tensor, std::optional<Tensor> / std::nullopt,
  // bool, integers, doubles) and the result type R the caller expects (Tensor, a tuple, a
  // struct of tensors, std::vector<Tensor>; nn/call.h), through hooks and wrapper: how code
  // that holds a Module pointer (a ModuleList entry) calls a typed forward:
  //   auto [y, h] = (*blocks)[i]->call<std::tuple<Tensor, Tensor>>(x, h0);
  // Wrong arity or argument types, or a result of another size, are ValueErrors naming the
  // module type and its forward's signature.
  template <typename R = Tensor, typename... A>
  R call(const A&... args) {
    return call_detail::unflatten<R>(call_values(call_detail::pack(args...)),
                                     [this] { return call_name(); });
  }
  // The type-erased call: hooks, wrapper, then forward_values. Returns the flattened result.
  std::vector<Tensor> call_values(Values inputs);
  // The type-erased forward (no hooks). The default takes exactly one tensor and calls
  // forward(x); TypedModule<Self> generates it from Self::forward; Sequential chains its entries.
  virtual std::vector<Tensor> forward_values(Values& inputs);
  // "forward(Tensor) -> Tensor", for messages.
  virtual std::string forward_signature() const { return "forward(Tensor) -> Tensor"; }
  // "<type>.<forward signature>", for messages.
  std::string call_name() const { return type_name() + "." + forward_signature(); }
  // Whether forward_values may take or return other than one tensor (TypedModule, a Sequential
  // holding one): callers that chain one-tensor calls switch to the type-erased call for it.
  virtual bool typed_forward() const { return false; }

  // ---- hooks (Note [module calls]) ----
  // Run by operator(), call<R>() and call_values() (never by forward() itself), in the order
  // registered. A pre-hook sees the tensor arguments (undefined for None; bool / integer /
  // double arguments are not shown) and may replace them; a forward hook sees the arguments and
  // the flattened result, and may replace result tensors. Neither may change how many there are
  // (ValueError). The handle's remove() unregisters the hook.
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  // An engine's wrapper around every call of this module (ZeRO-3 units, dist/fsdp.h): it gets
  // the arguments and a function running the hooks and forward_values, and returns the result.
  // At most one; an empty `wrapper` removes it. ValueError when one is set already.
  void set_call_wrapper(CallWrapper wrapper);
  bool has_call_wrapper() const { return calls_ && bool(calls_->wrapper); }
  // Puts `outer` around the wrapper this module has (or sets it when there is none): a later
  // parallel dimension's wrapper around an earlier one's (context parallelism's position map
  // around tensor parallelism's sequence split). `outer`'s call runs the earlier wrapper.
  void wrap_call(CallWrapper outer);

  // ---- registration (names: non-empty, no '.') ----
  // Each returns the registered object together with its entry, so that a member declared as
  // nn::Parameter / nn::Buffer / nn::Child<M> binds to it (Note [module members]). As torch,
  // registering a name this module already uses for the same kind replaces that entry (and its
  // bound member); a name used by another kind is a ValueError.
  //
  // `value` must be a floating leaf, or undefined for None (an absent optional parameter, as
  // torch's register_parameter(name, None): listed nowhere until a tensor is assigned).
  // Registering another module's parameter ties the two (Note [tied parameters]).
  ParameterRegistration register_parameter(const std::string& name, Tensor value,
                                           bool requires_grad = true);
  // Replaces this module's parameter `name` by `value` (and the member bound to it) and returns
  // it (Note [tied parameters]); `decoder->weight = encoder->weight` on a bound member does the
  // same. IndexError when there is no parameter `name`; `value` must be a floating leaf (or
  // undefined: None); its requires_grad is kept. ValueError on a sharded module.
  Tensor set_parameter(const std::string& name, Tensor value);
  // persistent = false keeps the buffer out of state_dict() (e.g. a cached causal mask).
  BufferRegistration register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <typename M>
  ModuleRegistration<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    const uint32_t index = register_child(name, module);
    return ModuleRegistration<M>(std::move(module), this, index);
  }
  // torch's replace_module / setattr on a child: the child `name` (which must exist) becomes
  // `module` (and so does the member bound to it). Returns it.
  template <typename M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> module) {
    replace_child(name, module);
    return module;
  }

  // ---- access (registration order; hierarchical dotted names) ----
  // Shared tensors (weight tying) appear once, under the first name.
  // (state_dict() lists them under every name.) alias -> first name of every tied parameter or
  // buffer name that named_parameters() / named_buffers() leave out.
  std::map<std::string, std::string> tied_aliases() const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  Named<Tensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  Named<Tensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  Named<std::shared_ptr<Module>> named_children() const;
  // This module (name "") and every descendant, depth first. A module reachable under two
  // names (shared) is listed once, under the first.
  Named<Module*> named_modules();
  // named_modules() without the names (torch's modules()); include_self = false leaves this
  // module out. This module's pointer owns nothing when it is not held by a shared_ptr.
  std::vector<std::shared_ptr<Module>> modules(bool include_self = true);
  // This module as an M, or null (libtorch's module->as<nn::Linear>()).
  template <typename M>
  M* as() {
    return dynamic_cast<M*>(this);
  }
  // Looks up "blocks.0.attn.qkv.weight"; throws IndexError listing nothing found.
  Tensor parameter(const std::string& dotted_name) const;
  Tensor buffer(const std::string& dotted_name) const;
  int64_t num_parameters() const;

  // ---- mode and placement (each returns this module: model->eval().to(kCUDA)) ----
  virtual Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Moves parameters, their gradients and buffers. to(dtype) converts floating tensors only
  // (integer buffers such as BatchNorm's num_batches_tracked keep their type), like PyTorch.
  Module& to(Device device);
  Module& to(DType dtype);
  Module& to(Device device, DType dtype);
  // torch's model.double() / .float() / .half() / .bfloat16(), spelled as Tensor's.
  Module& float64() { return to(kFloat64); }
  Module& float32() { return to(kFloat32); }
  Module& half() { return to(kFloat16); }
  Module& bfloat16() { return to(kBFloat16); }
  void zero_grad(bool set_to_none = true);
  // fn on every module, children first (depth first, registration order), then this one, as
  // PyTorch's apply: model->apply([](nn::Module& m) { if (auto* l = dynamic_cast<...>) ... }).
  Module& apply(const std::function<void(Module&)>& fn);

  // ---- initialisation (Note [deferred init]) ----
  // Re-initialises this module's own parameters (not its children's) exactly as its constructor
  // does, drawing from `gen` or the default generator in the constructor's order. Built-in
  // modules construct through it. The default does nothing for a module without parameters of
  // its own and throws ValueError (naming the type and parameter) for one with: a user module
  // that registers parameters must override it to be materialized from deferred init.
  virtual void reset_parameters(Generator* gen = nullptr);
  // Allocates this module's own deferred parameters and initialises them with
  // reset_parameters(gen); parameters that were already allocated keep their values (a tied
  // weight, one loaded by load_state_dict). With gen == nullptr the default generator is set to
  // the state it had when the module was constructed under DeferredInit and put back afterwards,
  // so the values equal eager construction in any materialization order. Returns false (and does
  // nothing) when no own parameter is deferred. On error the parameters stay deferred.
  bool materialize_own_parameters(Generator* gen = nullptr);
  // Note [deferred parts] (module.cc): deferred parameter `name` (this module's own) will hold
  // only a part of the tensor its initialiser draws (a tensor-parallel shard): reset_parameters
  // sees it in `full_shape`, and `cut` turns that full value into the part, of the parameter's
  // own (current) shape. ValueError when `name` is not an own deferred parameter.
  using PartCut = std::function<Tensor(const Tensor& full)>;
  void set_deferred_part(const std::string& name, Shape full_shape, PartCut cut);
  // The part recorded for own parameter `name` ({full shape, cut}), or nullptr.
  const std::pair<Shape, PartCut>* deferred_part(const std::string& name) const;
  // The default generator's state when this module registered its first parameter under
  // DeferredInit (what its replay starts from); empty when it did not.
  const std::string& deferred_rng_state() const { return deferred_rng_state_; }
  // Note [streamed materialization] (module_deferred.cc): replays reset_parameters(gen) as
  // materialize_own_parameters does, but keeps no parameter: each own deferred parameter (or
  // part) for which `sink_for(name, parameter, full shape)` returns a sink has its whole
  // initial value (the full shape's, element order) handed to that sink, in chunks when every
  // initialiser streams, else at once after a replay into full-shape buffers (one module's
  // parameters whole). The module does not change: every own deferred parameter stays deferred,
  // in its current shape, with its part record (so a later replay still sees the full shapes);
  // the caller gives the streamed ones memory and the values it kept. Returns the names
  // streamed. On error nothing changes.
  using SinkFor = std::function<init::ValueSink(const std::string& name, const Tensor& parameter,
                                                const Shape& full_shape)>;
  std::vector<std::string> stream_own_parameters(const SinkFor& sink_for, Generator* gen = nullptr);

  // ---- state ----
  // Parameters and persistent buffers; tensors share storage with the module. Throws ValueError
  // naming the first deferred (unallocated) tensor.
  TensorDict state_dict() const;
  // state_dict() without that check: deferred or ZeRO-3-released tensors come back as handles
  // without memory (for code that replaces them, e.g. dist/fsdp.h's full_state_dict).
  TensorDict state_handles() const;
  // Copies values in (converting dtype/device). Shape mismatches always throw; with strict,
  // missing and unexpected keys throw too. The ValueError lists every problem in torch's words
  // ("Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "a", "b".\n\t
  // Unexpected key(s) ...\n\tsize mismatch for w: copying a param with shape (2, 3) from
  // checkpoint, the shape in current model is (3, 3)."); nothing is copied unless the whole dict
  // is accepted. Deferred parameters that get a value are allocated (a
  // deferred model can be loaded without ever running its initialisers).
  LoadResult load_state_dict(const TensorDict& state, bool strict = true);
  // Note [sharded modules] (module.cc): set by an engine whose parameters are views of buffers it
  // manages (dist::FullyShardedModel marks every module of its model); `how_to_load` names what
  // to use instead, and load_state_dict() on this module or an ancestor throws ValueError with
  // it. Empty: not sharded.
  void set_sharded(std::string how_to_load) { sharded_how_to_load_ = std::move(how_to_load); }
  const std::string& sharded() const { return sharded_how_to_load_; }
  // A checkpoint of state_dict(): a torch.save file for a path ending in .pt or .pth
  // (io/torch_format.h; `metadata` must be empty), else safetensors
  // (io/safetensors.h). load() also reads a torch.save file of any other name (it
  // recognises its first bytes). Note [checkpoint file formats] in module.cc.
  void save(const std::string& path, const Metadata& metadata = {}) const;
  LoadResult load(const std::string& path, bool strict = true);

  // ---- printing ----
  // Class name without namespaces ("Linear", "MLP").
  std::string type_name() const;
  // Arguments printed inside the parentheses, e.g. "in_features=4, out_features=8, bias=true".
  virtual std::string extra_repr() const { return ""; }
  std::string repr() const;

 protected:
  // Registers (or, for a used child name, replaces) child `name`; returns its entry's index.
  uint32_t register_child(const std::string& name, std::shared_ptr<Module> module);
  void replace_child(const std::string& name, std::shared_ptr<Module> module);
  // Whether a hook or a call wrapper is registered (calls take the type-erased path).
  bool intercepted() const { return calls_ && calls_->active(); }
  // Hooks, wrapper and `body` (the forward) over `inputs`.
  std::vector<Tensor> run_call(Values& inputs, CallFn body);
  // Called before entry `index` of children_ becomes `module` (replace_module, register_module
  // on a used name, a bound nn::Child assigned): containers keep their entry lists in step, and
  // may refuse (throw) before anything changed.
  virtual void on_child_assign(uint32_t /*index*/, const std::shared_ptr<Module>& /*module*/) {}
  // For a module that an engine wraps (set_call_wrapper: ZeRO-3 units, tensor-parallel layers):
  // its forward called directly (`fc->forward(x)`) would skip the wrapper's gathers and
  // collectives and compute on local shards without a word, so the built-in layers' forwards
  // call this first: ValueError naming the module unless the call came through the wrapper.
  void check_not_bypassed() const {
    if (calls_ && calls_->wrapper && calls_->depth == 0) throw_bypassed();
  }

 private:
  template <MemberKind K>
  friend class TensorMember;
  friend class ChildMember;
  Tensor call_one(const Tensor& x);
  [[noreturn]] void throw_bypassed() const;
  struct BufferEntry {
    std::string name;
    Tensor value;
    bool persistent = true;
    Buffer* member = nullptr;  // the member bound to this entry (Note [module members])
  };
  // Checks the name's syntax and that no entry of another kind (module_members.cc's EntryKind)
  // uses it; returns the index of the entry of this kind with that name, or -1.
  int64_t check_name(const std::string& name, int kind, const char* what) const;
  // Note [module members]: an entry written from either side (a bound member, or the table).
  void assign_parameter(uint32_t index, Tensor value, const char* op);
  void assign_buffer(uint32_t index, Tensor value);
  void assign_child(uint32_t index, std::shared_ptr<Module> module, const char* op);
  std::string member_name(const char* kind, uint32_t index) const;
  // ValueError when this module or one below it is sharded (Note [sharded modules]).
  void check_not_sharded(const char* op);
  void collect_parameters(const std::string& prefix, Named<Tensor>& out, bool recurse) const;
  void collect_buffers(const std::string& prefix, Named<Tensor>& out, bool recurse,
                       bool persistent_only) const;
  void collect_modules(const std::string& prefix, Named<Module*>& out,
                       std::unordered_set<const Module*>& seen);
  // Parameters and persistent buffers in registration order, deferred ones included.
  Named<Tensor> collect_state() const;
  void apply_to_tensors(const std::function<Tensor(const Tensor&)>& convert);
  void repr_into(std::ostream& os, int indent) const;

  bool training_ = true;
  // Entries in registration order; an undefined tensor / null module is None (listed nowhere).
  // params_[i] and children_[i] are bound to param_members_[i] / child_members_[i] when those
  // are not null (Note [module members]).
  Named<Tensor> params_;
  std::vector<Parameter*> param_members_;
  std::vector<ChildMember*> child_members_;
  // Default generator state when the first parameter was registered under DeferredInit; empty
  // when none was (Note [deferred init]).
  std::string deferred_rng_state_;
  void replay_reset_parameters(Generator* gen);  // from deferred_rng_state_ (gen == nullptr)
  // Note [deferred parts]: own deferred parameters that hold a part of what their init draws.
  std::map<std::string, std::pair<Shape, PartCut>> deferred_parts_;
  std::string sharded_how_to_load_;  // set_sharded()
  std::vector<BufferEntry> buffers_;
  Named<std::shared_ptr<Module>> children_;
  // Parameters this module holds but another module owns (registered deferred, or through
  // set_parameter): the owner initialises them (Note [tied parameters]).
  std::vector<std::string> borrowed_;
  std::shared_ptr<CallHooks> calls_;  // null until a hook or wrapper is registered
};

template <typename M>
bool Child<M>::accepts(const Module* m) const {
  return m == nullptr || dynamic_cast<const M*>(m) != nullptr;
}

// A module whose forward has its own signature (Note [module calls]): several tensors,
// optional ones, plain arguments, a tuple or struct result.
//
//   struct VaeOut { Tensor recon, mu, logvar; };
//   struct Vae : nn::TypedModule<Vae> {
//     VaeOut forward(Tensor x, std::optional<Tensor> cond = std::nullopt) { ... }
//   };
//   VaeOut out = (*vae)(x);          // typed, through hooks; vae->forward(x) skips them
//   auto o = list[i]->call<VaeOut>(x, c);  // through a Module pointer
//
// It generates the type-erased forward_values from Self::forward (exactly one forward, const or
// not; trailing std::optional<Tensor> parameters may be left out of a type-erased call) and a
// typed operator(). Default arguments hold for operator() and forward(), not for the
// type-erased path.
template <typename Self>
class TypedModule : public Module {
 public:
  // Typed call through hooks and wrapper; self.forward(args...) when there are none.
  template <typename... A>
  auto operator()(A&&... args) {  // the result type is deduced: Self is incomplete here
    Self& self = static_cast<Self&>(*this);
    using R = std::decay_t<decltype(self.forward(std::forward<A>(args)...))>;
    if (!intercepted()) return R(self.forward(std::forward<A>(args)...));
    Values in = call_detail::pack(args...);
    Self* s = &self;
    CallFn body = [s](Values& v) {
      return invoke_given<call_detail::Carrier<A>...>(*s, v, std::index_sequence_for<A...>{});
    };
    return call_detail::unflatten<R>(run_call(in, std::move(body)), [this] { return call_name(); });
  }

  std::vector<Tensor> forward_values(Values& in) override {
    static_assert(single_forward(), "TypedModule<Self>: Self must declare exactly one forward");
    using Params = typename call_detail::ForwardTraits<decltype(&Self::forward)>::Params;
    return invoke_params(in, static_cast<Params*>(nullptr));
  }
  // One tensor (trailing optional tensors None) through the typed forward; ValueError unless it
  // returns exactly one tensor.
  Tensor forward(const Tensor& x) override {
    Values in{Value::from_tensor(x)};
    std::vector<Tensor> out = forward_values(in);
    if (out.size() != 1)
      call_detail::throw_result_count(call_name(), out.size(), 1, typeid(Tensor));
    return out[0];
  }
  std::string forward_signature() const override {
    static_assert(single_forward(), "TypedModule<Self>: Self must declare exactly one forward");
    using T = call_detail::ForwardTraits<decltype(&Self::forward)>;
    return call_detail::forward_signature<typename T::Result>(
        static_cast<typename T::Params*>(nullptr));
  }
  bool typed_forward() const override { return true; }

 private:
  // Self declares exactly one forward (overloads would make &Self::forward ambiguous; none
  // would find this class's own one-tensor forward and recurse).
  static constexpr bool single_forward() {
    if constexpr (requires { &Self::forward; }) {
      return !std::is_same_v<decltype(&Self::forward), Tensor (TypedModule::*)(const Tensor&)>;
    } else {
      return false;
    }
  }

  // The arguments operator() was given, after the hooks (which keep their kinds).
  template <typename... C, size_t... I>
  static std::vector<Tensor> invoke_given(Self& self, Values& v, std::index_sequence<I...>) {
    return call_detail::flatten(self.forward(call_detail::Arg<C>::from(v[I])...));
  }

  // A type-erased call with fewer values than Self::forward has parameters: the forward's own
  // default arguments fill the rest when `self.forward(first K arguments)` is a valid call (C++
  // applies defaults at the call, so this is the call the typed operator() would make);
  // otherwise trailing std::optional<Tensor> parameters left out are None.
  template <typename... P>
  std::vector<Tensor> invoke_params(Values& in, std::tuple<P...>*) {
    constexpr size_t n = sizeof...(P);
    constexpr bool optional[] = {call_detail::is_optional_tensor<P>::value..., false};
    bool ok = in.size() <= n;
    size_t i = 0;
    ((ok = ok && (i >= in.size() || call_detail::Arg<P>::accepts(in[i])), ++i), ...);
    if (!ok) throw_bad_arguments(in);
    if (in.size() < n) {
      std::vector<Tensor> out;
      if (invoke_with_defaults<P...>(in, out, std::make_index_sequence<n>{})) return out;
      for (size_t j = in.size(); j < n; ++j)
        if (!optional[j]) throw_bad_arguments(in);
    }
    return invoke_params_at<P...>(in, std::index_sequence_for<P...>{});
  }
  template <typename... P, size_t... K>
  bool invoke_with_defaults(Values& in, std::vector<Tensor>& out, std::index_sequence<K...>) {
    bool done = false;
    ((done = done || (in.size() == K && invoke_first<K, P...>(in, out))), ...);
    return done;
  }
  // Calls self.forward with the first K values when that call is valid; false otherwise.
  template <size_t K, typename... P>
  bool invoke_first(Values& in, std::vector<Tensor>& out) {
    using Tup = std::tuple<P...>;
    return [&]<size_t... I>(std::index_sequence<I...>) {
      if constexpr (requires(Self & s) {
                      s.forward(std::declval<std::tuple_element_t<I, Tup>>()...);
                    }) {
        Self& self = static_cast<Self&>(*this);
        out = call_detail::flatten(
            self.forward(call_detail::Arg<std::tuple_element_t<I, Tup>>::from(in[I])...));
        return true;
      } else {
        return false;
      }
    }
    (std::make_index_sequence<K>{});
  }
  template <typename... P, size_t... I>
  std::vector<Tensor> invoke_params_at(Values& in, std::index_sequence<I...>) {
    Self& self = static_cast<Self&>(*this);
    return call_detail::flatten(
        self.forward((I < in.size() ? call_detail::Arg<P>::from(in[I]) : P{})...));
  }
  [[noreturn]] void throw_bad_arguments(const Values& in) const {
    ACCEL_THROW(ValueError, "Module.call", call_name(), ": called with ", describe_values(in),
                " (parameters with default arguments, and trailing optional<Tensor> ones, may be "
                "left out)");
  }
};

std::ostream& operator<<(std::ostream& os, const Module& m);

// ---- deferred init (Note [deferred init] in module.cc) ----

// While alive (thread-local, nestable), Module::register_parameter releases the storage of each
// parameter right after registering it: names, shapes, dtypes, devices and requires_grad exist,
// memory does not. Buffers stay allocated (they are small and constructors compute them). The
// initialisers of nn::init leave unallocated tensors alone but advance the generator as if they
// had drawn, so the default generator ends where eager construction leaves it. Reading a
// deferred parameter (forward, state_dict, save) throws ValueError.
class DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  // Whether a guard is alive on this thread.
  static bool active();
};

// A tensor whose storage is not allocated (deferred, or released by ZeRO-3).
bool is_deferred(const Tensor& t);
// A deferred tensor of `shape` (contiguous, storage not allocated).
Tensor deferred_tensor(const Shape& shape, DType dtype, Device device);
// Whether any parameter of `m` (of its descendants too with recurse) is deferred.
bool is_deferred(const Module& m, bool recurse = true);

// Which modules materialize() handles: (dotted name from named_modules(), module).
using ModuleFilter = std::function<bool(const std::string& name, const Module& module)>;

// Allocates and initialises the deferred parameters of every module in named_modules() order
// (depth first, registration order) that passes `filter` (all when empty), one module at a time:
// the memory peak is the materialized modules plus one module's draw. See
// materialize_own_parameters for the generator and the values (bit-identical to eager
// construction with the same seed when gen is null). Throws ValueError for a module with own
// deferred parameters that does not override reset_parameters.
void materialize(Module& m, const ModuleFilter& filter = {}, Generator* gen = nullptr);

// The building block for materializing unit by unit (dist/fsdp.h): m.materialize_own_parameters
// (non-recursive). Returns whether anything was deferred.
bool reset_module_parameters(Module& m, Generator* gen = nullptr);

// Replaces the data of `dst` (storage, shape, strides, dtype) with that of `src`, keeping the
// TensorImpl, its autograd metadata and every handle to it. Used by Module::to(); see
// Note [module tensors are updated in place].
void assign_tensor_data(Tensor& dst, const Tensor& src);

}  // namespace accel::nn
