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
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace accel::nn {

// Name -> tensor, sorted by name (what state_dict() returns and safetensors files hold).
using TensorDict = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

template <typename T>
using Named = std::vector<std::pair<std::string, T>>;

// What a non-strict load_state_dict() skipped.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- forward ----
  // The single-input forward used by Sequential and operator(). Modules with other signatures
  // add their own overloads; calling this one on them throws.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // ---- registration (names: non-empty, no '.', unique among params/buffers/children) ----
  // Returns a handle sharing the registered tensor. `value` must be a floating leaf.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  // persistent = false keeps the buffer out of state_dict() (e.g. a cached causal mask).
  Tensor register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_child(name, module);
    return module;
  }

  // ---- access (registration order; hierarchical dotted names) ----
  // Shared tensors (weight tying) appear once, under the first name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  Named<Tensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  Named<Tensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  Named<std::shared_ptr<Module>> named_children() const;
  // This module (name "") and every descendant, depth first.
  Named<Module*> named_modules();
  // Looks up "blocks.0.attn.qkv.weight"; throws IndexError listing nothing found.
  Tensor parameter(const std::string& dotted_name) const;
  Tensor buffer(const std::string& dotted_name) const;
  int64_t num_parameters() const;

  // ---- mode and placement ----
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters, their gradients and buffers. to(dtype) converts floating tensors only
  // (integer buffers such as BatchNorm's num_batches_tracked keep their type), like PyTorch.
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);
  void zero_grad(bool set_to_none = true);

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

  // ---- state ----
  // Parameters and persistent buffers; tensors share storage with the module. Throws ValueError
  // naming the first deferred (unallocated) tensor.
  TensorDict state_dict() const;
  // state_dict() without that check: deferred or ZeRO-3-released tensors come back as handles
  // without memory (for code that replaces them, e.g. dist/fsdp.h's full_state_dict).
  TensorDict state_handles() const;
  // Copies values in (converting dtype/device). Shape mismatches always throw; with strict,
  // missing and unexpected keys throw too. The error lists every problem; nothing is copied
  // unless the whole dict is accepted. Deferred parameters that get a value are allocated (a
  // deferred model can be loaded without ever running its initialisers).
  LoadResult load_state_dict(const TensorDict& state, bool strict = true);
  // Note [sharded modules] (module.cc): set by an engine whose parameters are views of buffers it
  // manages (dist::FullyShardedModel marks every module of its model); `how_to_load` names what
  // to use instead, and load_state_dict() on this module or an ancestor throws ValueError with
  // it. Empty: not sharded.
  void set_sharded(std::string how_to_load) { sharded_how_to_load_ = std::move(how_to_load); }
  const std::string& sharded() const { return sharded_how_to_load_; }
  // safetensors checkpoint of state_dict() (autograd/nn/safetensors.h).
  void save(const std::string& path, const Metadata& metadata = {}) const;
  LoadResult load(const std::string& path, bool strict = true);

  // ---- printing ----
  // Class name without namespaces ("Linear", "MLP").
  std::string type_name() const;
  // Arguments printed inside the parentheses, e.g. "in_features=4, out_features=8, bias=true".
  virtual std::string extra_repr() const { return ""; }
  std::string repr() const;

 protected:
  void register_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct BufferEntry {
    std::string name;
    Tensor value;
    bool persistent = true;
  };
  void check_new_name(const std::string& name, const char* what) const;
  // ValueError when this module or one below it is sharded (Note [sharded modules]).
  void check_not_sharded(const char* op);
  void collect_parameters(const std::string& prefix, Named<Tensor>& out, bool recurse) const;
  void collect_buffers(const std::string& prefix, Named<Tensor>& out, bool recurse,
                       bool persistent_only) const;
  void collect_modules(const std::string& prefix, Named<Module*>& out);
  // Parameters and persistent buffers in registration order, deferred ones included.
  Named<Tensor> collect_state() const;
  void apply_to_tensors(const std::function<Tensor(const Tensor&)>& convert);
  void repr_into(std::ostream& os, int indent) const;

  bool training_ = true;
  Named<Tensor> params_;
  // Default generator state when the first parameter was registered under DeferredInit; empty
  // when none was (Note [deferred init]).
  std::string deferred_rng_state_;
  std::string sharded_how_to_load_;  // set_sharded()
  std::vector<BufferEntry> buffers_;
  Named<std::shared_ptr<Module>> children_;
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
