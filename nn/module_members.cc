// Module registration and the members bound to its entries (Note [module members], Note [tied
// parameters]).
#include <algorithm>
#include <cxxabi.h>
#include <cstdlib>
#include <mutex>

#include "nn/module.h"

namespace accel::nn {

// Note [module members]
// torch's Module.__setattr__ sees `model.fc = nn.Linear(512, 2)` and `head.weight = emb.weight`
// and updates the module's tables, so whatever walks the model afterwards (parameters(),
// state_dict(), named_modules(), to(), hooks, optimizers built afterwards) sees the new object.
// C++ has no __setattr__: a member is a field the base class cannot see. Three ways were weighed:
//  - members that are references into the table (`Tensor& weight = register_parameter(...)`):
//    one source of truth, but a reference must be bound where the member is initialised, so the
//    common libtorch shape (declare the member, then `fc = register_module(...)` in the
//    constructor body) cannot be written, and forgetting the & compiles to today's trap;
//  - checking at forward / parameters() that the members still hold the registered objects: the
//    base class cannot read a derived class's fields, so there is nothing to compare with;
//  - member types that know their entry: nn::Parameter and nn::Buffer (Tensors) and
//    nn::Child<M> (a std::shared_ptr<M>), bound when initialised or assigned from what
//    register_* returns (a TensorRegistration / ModuleRegistration: the object, its owner and
//    the entry's index). Assigning a bound member assigns the entry through the owner (the
//    checks of set_parameter), and the owner keeps a pointer to the member bound to each entry,
//    so a change made on the table's side (set_parameter, register_* on a used name,
//    replace_module) reaches the member too.
// The third is built; the built-in layers, models and examples declare their members this way.
// A copy of a bound member is a plain handle (`auto w = lin->weight; w = x;` changes nothing in
// lin); a bound member unbinds itself when destroyed, and a module unbinds the members still
// bound to it when it is destroyed. Modules are neither copied nor moved, so a bound member's
// address is stable.
//
// What stays unseen: a member declared as a plain Tensor or std::shared_ptr<M> holds a copy of
// the handle (code written that way keeps working as before; assigning such a member later
// changes only the member: declare it nn::Parameter / nn::Buffer / nn::Child<M>).
// None: an undefined tensor or a null module in an entry is torch's None, listed nowhere
// (parameters(), state_dict(), named_modules(), printing as "None") until something is assigned.

template <MemberKind K>
void TensorMember<K>::bind(Module* owner, uint32_t index) {
  owner_ = owner;
  index_ = index;
  if constexpr (K == MemberKind::Parameter) {
    owner->param_members_[index] = this;
  } else {
    owner->buffers_[index].member = this;
  }
}

template <MemberKind K>
void TensorMember<K>::unbind() {
  if (owner_ == nullptr) return;
  if constexpr (K == MemberKind::Parameter) {
    if (owner_->param_members_[index_] == this) owner_->param_members_[index_] = nullptr;
  } else {
    if (owner_->buffers_[index_].member == this) owner_->buffers_[index_].member = nullptr;
  }
  owner_ = nullptr;
}

template <MemberKind K>
void TensorMember<K>::assign(const Tensor& t) {
  if (owner_ == nullptr) {
    Tensor::operator=(t);
  } else if constexpr (K == MemberKind::Parameter) {
    owner_->assign_parameter(index_, t, "Module.setattr");
  } else {
    owner_->assign_buffer(index_, t);
  }
}

template class TensorMember<MemberKind::Parameter>;
template class TensorMember<MemberKind::Buffer>;

void ChildMember::bind(Module* owner, uint32_t index) {
  owner_ = owner;
  index_ = index;
  owner->child_members_[index] = this;
}

void ChildMember::unbind() {
  if (owner_ == nullptr) return;
  if (owner_->child_members_[index_] == this) owner_->child_members_[index_] = nullptr;
  owner_ = nullptr;
}

void ChildMember::assign_entry(std::shared_ptr<Module> m) {
  owner_->assign_child(index_, std::move(m), "Module.setattr");
}

Module::~Module() {
  // Members of a derived class unbound themselves already; these are bound members living
  // elsewhere (a registration kept in a variable that outlives the module).
  for (Parameter* m : param_members_)
    if (m) m->owner_ = nullptr;
  for (BufferEntry& b : buffers_)
    if (b.member) b.member->owner_ = nullptr;
  for (ChildMember* c : child_members_)
    if (c) c->owner_ = nullptr;
}

// ---------------- registration ----------------

namespace {
enum class EntryKind { None, Parameter, Buffer, Child };
const char* kind_word(EntryKind k) {
  switch (k) {
    case EntryKind::Parameter: return "a parameter";
    case EntryKind::Buffer: return "a buffer";
    case EntryKind::Child: return "a submodule";
    case EntryKind::None: break;
  }
  return "nothing";
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : mangled;
  std::free(d);
  return s;
}
}  // namespace

// Checks the name's syntax and that it is not used by another kind of entry than `kind`;
// returns the index of the entry of `kind` with that name, or -1.
int64_t Module::check_name(const std::string& name, int kind_code, const char* what) const {
  const auto kind = EntryKind(kind_code);
  ACCEL_CHECK(!name.empty(), ValueError, what, type_name(), ": empty name");
  ACCEL_CHECK(name.find('.') == std::string::npos, ValueError, what, type_name(), ": name '", name,
              "' must not contain '.'");
  EntryKind found = EntryKind::None;
  int64_t index = -1;
  auto look = [&](EntryKind k, const std::string& n, size_t i) {
    if (n == name) {
      found = k;
      index = int64_t(i);
    }
  };
  for (size_t i = 0; i < params_.size(); ++i) look(EntryKind::Parameter, params_[i].first, i);
  for (size_t i = 0; i < buffers_.size(); ++i) look(EntryKind::Buffer, buffers_[i].name, i);
  for (size_t i = 0; i < children_.size(); ++i) look(EntryKind::Child, children_[i].first, i);
  ACCEL_CHECK(found == EntryKind::None || found == kind, ValueError, what, type_name(), ": '", name,
              "' is already registered as ", kind_word(found));
  return found == kind ? index : -1;
}

ParameterRegistration Module::register_parameter(const std::string& name, Tensor value,
                                                 bool requires_grad) {
  const int64_t used = check_name(name, int(EntryKind::Parameter), "Module.register_parameter");
  if (value.defined()) {
    ACCEL_CHECK(value.is_floating_point(), DTypeError, "Module.register_parameter", type_name(),
                ": parameter '", name, "' must be floating point, got ", value.dtype());
    // A parameter is a leaf: drop any history the initialiser left behind.
    if (!value.is_leaf()) value = value.detach();
  }
  // Note [tied parameters]: a deferred tensor was registered by another module already (a fresh
  // parameter is allocated until it is registered); that module initialises it.
  const bool borrowed = is_deferred(value);
  if (value.defined() && !borrowed && DeferredInit::active()) {
    if (deferred_rng_state_.empty()) {
      Generator& g = default_generator();
      std::lock_guard<std::mutex> lk(g.mutex());
      deferred_rng_state_ = g.state();
    }
    // Throws for a borrowed buffer (from_blob), which cannot be given back.
    value.storage()->release();
  }
  if (value.defined()) value.requires_grad_(requires_grad);
  std::erase(borrowed_, name);
  if (borrowed) borrowed_.push_back(name);
  uint32_t index;
  if (used >= 0) {  // torch's register_parameter on a parameter's name replaces it
    index = uint32_t(used);
    params_[index].second = value;
    if (Parameter* m = param_members_[index]) static_cast<Tensor&>(*m) = value;
  } else {
    index = uint32_t(params_.size());
    params_.emplace_back(name, value);
    param_members_.push_back(nullptr);
  }
  return ParameterRegistration(std::move(value), this, index);
}

// Note [tied parameters]
// Tying is one TensorImpl registered in two modules (GPT's lm_head and token embedding): either
// registered twice (register_parameter with another module's parameter) or rebound afterwards,
// by assigning a bound member (`head->weight = emb->weight`, Note [module members]) or with
// set_parameter; both replace the table entry and the member.
// Everything that walks parameters sees the tensor once (named_parameters keeps the first name,
// so optimizers, DDP buckets and ZeRO shards hold it once), autograd sums both uses into its one
// .grad (the engine adds a node's incoming gradients before running it, so post-accumulate hooks
// fire once per backward), and state_dict lists it under both names (as PyTorch), so a
// checkpoint loads whether or not the model ties. Files hold it once: save_safetensors writes
// one copy and records the alias in the metadata (safetensors.torch.save_model's convention,
// Note [tied tensors in files] in safetensors.cc), and load_safetensors restores it.
// Deferred init: the module that registered the tensor first owns it and initialises it; a
// module holding it through a second registration (the tensor is deferred already) or through
// an assignment borrows it: its materialize_own_parameters neither allocates nor initialises it
// (its reset_parameters still draws, leaving the generator where eager construction leaves it,
// and writes nothing into an unallocated tensor; an allocated one is kept). So the tied values
// are the owner's, in any materialization order, as in eager construction where the tie comes
// after both constructors ran.
// ZeRO-3 (dist/fsdp.h): a parameter used by two units lives in the root unit (Note [unit
// lifecycle]).
Tensor Module::set_parameter(const std::string& name, Tensor value) {
  auto it =
      std::find_if(params_.begin(), params_.end(), [&](const auto& e) { return e.first == name; });
  if (it == params_.end()) {
    std::string names;
    for (const auto& [n, p] : params_) names += (names.empty() ? "" : ", ") + n;
    ACCEL_THROW(IndexError, "Module.set_parameter", type_name(), " has no parameter '", name,
                "' (it has: ", names.empty() ? std::string("none") : names, ")");
  }
  assign_parameter(uint32_t(it - params_.begin()), value, "Module.set_parameter");
  return value;
}

void Module::assign_parameter(uint32_t index, Tensor value, const char* op) {
  const std::string& name = params_[index].first;
  ACCEL_CHECK(sharded_how_to_load_.empty(), ValueError, op, type_name(),
              " is sharded (its parameters are views of ZeRO-3 unit buffers): assign or tie "
              "parameters before preparing the model (parameter '",
              name, "')");
  if (value.defined()) {
    ACCEL_CHECK(value.is_floating_point(), DTypeError, op, type_name(), ": parameter '", name,
                "' must be floating point, got ", value.dtype());
    ACCEL_CHECK(value.is_leaf(), ValueError, op, type_name(), ": parameter '", name, "' ",
                value.sizes(),
                " has autograd history; a parameter is a leaf (pass another module's parameter, "
                "or detach it)");
  }
  params_[index].second = value;
  if (std::find(borrowed_.begin(), borrowed_.end(), name) == borrowed_.end())
    borrowed_.push_back(name);
  if (Parameter* m = param_members_[index]) static_cast<Tensor&>(*m) = value;
}

BufferRegistration Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  const int64_t used = check_name(name, int(EntryKind::Buffer), "Module.register_buffer");
  if (value.defined() && (!value.is_leaf() || value.requires_grad())) value = value.detach();
  uint32_t index;
  if (used >= 0) {
    index = uint32_t(used);
    buffers_[index].value = value;
    buffers_[index].persistent = persistent;
    if (Buffer* m = buffers_[index].member) static_cast<Tensor&>(*m) = value;
  } else {
    index = uint32_t(buffers_.size());
    buffers_.push_back(BufferEntry{name, value, persistent, nullptr});
  }
  return BufferRegistration(std::move(value), this, index);
}

void Module::assign_buffer(uint32_t index, Tensor value) {
  if (value.defined() && (!value.is_leaf() || value.requires_grad())) value = value.detach();
  buffers_[index].value = value;
  if (Buffer* m = buffers_[index].member) static_cast<Tensor&>(*m) = value;
}

uint32_t Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  const int64_t used = check_name(name, int(EntryKind::Child), "Module.register_module");
  ACCEL_CHECK(module != nullptr, ValueError, "Module.register_module", type_name(), ": submodule '",
              name, "' is null");
  if (used >= 0) {  // torch's add_module on a submodule's name replaces it
    assign_child(uint32_t(used), std::move(module), "Module.register_module");
    return uint32_t(used);
  }
  ACCEL_CHECK(module.get() != this, ValueError, "Module.register_module", type_name(),
              ": a module cannot be its own child ('", name, "')");
  children_.emplace_back(name, std::move(module));
  child_members_.push_back(nullptr);
  return uint32_t(children_.size() - 1);
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].first == name) {
      assign_child(uint32_t(i), std::move(module), "Module.replace_module");
      return;
    }
  }
  std::string names;
  for (const auto& [n, c] : children_) names += (names.empty() ? "" : ", ") + n;
  ACCEL_THROW(IndexError, "Module.replace_module", type_name(), " has no submodule '", name,
              "' (it has: ", names.empty() ? std::string("none") : names, ")");
}

void Module::assign_child(uint32_t index, std::shared_ptr<Module> module, const char* op) {
  const std::string& name = children_[index].first;
  ACCEL_CHECK(module.get() != this, ValueError, op, type_name(),
              ": a module cannot be its own child ('", name, "')");
  ACCEL_CHECK(sharded_how_to_load_.empty(), ValueError, op, type_name(),
              " is sharded (a ZeRO-3 model): replace submodules before preparing the model "
              "(submodule '",
              name, "')");
  ChildMember* member = child_members_[index];
  ACCEL_CHECK(member == nullptr || member->accepts(module.get()), ValueError, op, type_name(),
              ": member '", name, "' is an nn::Child<", demangle(member ? member->held_type() : ""),
              ">, which cannot hold a ", module ? module->type_name() : std::string());
  on_child_assign(index, module);
  children_[index].second = module;
  if (member) member->take(module);
}

}  // namespace accel::nn
