#include "autograd/nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "autograd/nn/safetensors.h"

namespace accel::nn {

namespace {
thread_local int g_deferred_depth = 0;  // live DeferredInit guards on this thread
}  // namespace

Module::~Module() = default;

Tensor Module::forward(const Tensor&) {
  ACCEL_THROW(ValueError, "Module.forward", type_name(),
              " does not define a single-input forward(const Tensor&)");
}

// ---------------- calls (Note [module calls]) ----------------

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Tensor: return t_.defined() ? "Tensor" : "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int64";
    case Kind::Double: return "double";
  }
  return "?";
}

std::string describe_values(const Values& values) {
  std::string s = "(";
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? ", " : "") + std::string(values[i].type_name());
  return s + ")";
}

namespace call_detail {

std::string type_name_of(const std::type_info& t) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled) ? demangled : t.name();
  std::free(demangled);
  for (const std::string anon = "(anonymous namespace)::";;) {
    const size_t at = name.find(anon);
    if (at == std::string::npos) break;
    name.erase(at, anon.size());
  }
  // Drop every namespace qualifier ("accel::Tensor" -> "Tensor", "std::tuple<...>" ->
  // "tuple<...>"): a qualifier is an identifier followed by "::".
  std::string out;
  size_t word = 0;  // start of the current identifier in `out`
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == ':' && i + 1 < name.size() && name[i + 1] == ':') {
      out.erase(word);
      ++i;
      continue;
    }
    const char c = name[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) word = out.size() + 1;
    out += c;
  }
  // The allocator and other defaulted arguments stay; they rarely appear in results.
  return out;
}

void throw_result_count(const std::string& who, size_t got, size_t want,
                        const std::type_info& result) {
  ACCEL_THROW(ValueError, "Module.call", who, " returned ", got, " tensor(s); the result type ",
              type_name_of(result), " holds ", want);
}

}  // namespace call_detail

std::vector<Tensor> Module::forward_values(Values& in) {
  ACCEL_CHECK(in.size() == 1 && in[0].is_tensor(), ValueError, "Module.call", call_name(),
              ": called with ", describe_values(in));
  return {forward(in[0].tensor())};
}

Tensor Module::call_one(const Tensor& x) {
  Values in{Value::from_tensor(x)};
  std::vector<Tensor> out = run_call(in, [this](Values& v) { return forward_values(v); });
  if (out.size() != 1) call_detail::throw_result_count(call_name(), out.size(), 1, typeid(Tensor));
  return out[0];
}

std::vector<Tensor> Module::call_values(Values inputs) {
  if (!intercepted()) return forward_values(inputs);
  return run_call(inputs, [this](Values& v) { return forward_values(v); });
}

namespace {
// The tensor arguments of `in`, by position among the values.
std::vector<Tensor> tensor_args(const Values& in, std::vector<size_t>& where) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].is_tensor()) {
      where.push_back(i);
      ts.push_back(in[i].tensor());
    }
  return ts;
}
}  // namespace

std::vector<Tensor> Module::run_call(Values& inputs, CallFn body) {
  std::shared_ptr<CallHooks> h = calls_;  // alive even if a hook removes itself
  if (!h || !h->active()) return body(inputs);
  CallFn inner = [this, h, body = std::move(body)](Values& in) {
    // Copies: a hook may register or remove hooks.
    const auto pre = h->pre;
    const auto post = h->post;
    std::vector<size_t> where;
    std::vector<Tensor> args = tensor_args(in, where);
    for (const auto& [id, hook] : pre) {
      hook(*this, args);
      ACCEL_CHECK(args.size() == where.size(), ValueError, "Module.forward_pre_hook", call_name(),
                  ": a pre-hook changed the number of tensor arguments from ", where.size(), " to ",
                  args.size());
    }
    for (size_t j = 0; j < where.size(); ++j) in[where[j]].tensor() = args[j];
    std::vector<Tensor> out = body(in);
    for (const auto& [id, hook] : post) {
      const size_t n = out.size();
      hook(*this, args, out);
      ACCEL_CHECK(out.size() == n, ValueError, "Module.forward_hook", call_name(),
                  ": a forward hook changed the number of result tensors from ", n, " to ",
                  out.size());
    }
    return out;
  };
  if (h->wrapper) {
    CallWrapper w = h->wrapper;
    return w(*this, inputs, inner);
  }
  return inner(inputs);
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  ACCEL_CHECK(bool(hook), ValueError, "Module.register_forward_pre_hook", type_name(),
              ": empty hook");
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  const uint64_t id = calls_->next_id++;
  calls_->pre.emplace_back(id, std::move(hook));
  return HookHandle(calls_, id);
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  ACCEL_CHECK(bool(hook), ValueError, "Module.register_forward_hook", type_name(), ": empty hook");
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  const uint64_t id = calls_->next_id++;
  calls_->post.emplace_back(id, std::move(hook));
  return HookHandle(calls_, id);
}

void HookHandle::remove() {
  std::shared_ptr<CallHooks> h = hooks_.lock();
  if (!h || id_ == 0) return;
  auto drop = [&](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == id_; }),
            v.end());
  };
  drop(h->pre);
  drop(h->post);
  id_ = 0;
}

void Module::set_call_wrapper(CallWrapper wrapper) {
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  ACCEL_CHECK(!wrapper || !calls_->wrapper, ValueError, "Module.set_call_wrapper", type_name(),
              " already has a call wrapper (is it a unit of another sharded model?)");
  calls_->wrapper = std::move(wrapper);
}

// ---------------- registration ----------------

void Module::check_new_name(const std::string& name, const char* what) const {
  ACCEL_CHECK(!name.empty(), ValueError, what, type_name(), ": empty name");
  ACCEL_CHECK(name.find('.') == std::string::npos, ValueError, what, type_name(), ": name '", name,
              "' must not contain '.'");
  for (const auto& [n, _] : params_) {
    ACCEL_CHECK(n != name, ValueError, what, type_name(), ": '", name,
                "' is already registered as a parameter");
  }
  for (const auto& b : buffers_) {
    ACCEL_CHECK(b.name != name, ValueError, what, type_name(), ": '", name,
                "' is already registered as a buffer");
  }
  for (const auto& [n, _] : children_) {
    ACCEL_CHECK(n != name, ValueError, what, type_name(), ": '", name,
                "' is already registered as a submodule");
  }
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name, "Module.register_parameter");
  ACCEL_CHECK(value.defined(), ValueError, "Module.register_parameter", type_name(),
              ": parameter '", name, "' is undefined");
  ACCEL_CHECK(value.is_floating_point(), DTypeError, "Module.register_parameter", type_name(),
              ": parameter '", name, "' must be floating point, got ", value.dtype());
  // A parameter is a leaf: drop any history the initialiser left behind.
  if (!value.is_leaf()) value = value.detach();
  // Note [tied parameters]: a deferred tensor was registered by another module already (a
  // fresh parameter is allocated until it is registered); that module initialises it.
  if (is_deferred(value)) {
    value.requires_grad_(requires_grad);
    params_.emplace_back(name, value);
    borrowed_.push_back(name);
    return value;
  }
  if (DeferredInit::active()) {
    if (deferred_rng_state_.empty()) {
      Generator& g = default_generator();
      std::lock_guard<std::mutex> lk(g.mutex());
      deferred_rng_state_ = g.state();
    }
    // Throws for a borrowed buffer (from_blob), which cannot be given back.
    value.storage()->release();
  }
  value.requires_grad_(requires_grad);
  params_.emplace_back(name, value);
  return value;
}

// Note [tied parameters]
// Tying is one TensorImpl registered in two modules (GPT's lm_head and token embedding): either
// registered twice (register_parameter with another module's parameter) or rebound afterwards
// with set_parameter, which replaces the table entry; the member must be rebound too, which
// `decoder->weight = decoder->set_parameter("weight", encoder->weight)` does in one line.
// Everything that walks parameters sees the tensor once (named_parameters keeps the first name,
// so optimizers, DDP buckets and ZeRO shards hold it once), autograd sums both uses into its one
// .grad (the engine adds a node's incoming gradients before running it, so post-accumulate hooks
// fire once per backward), and state_dict lists it under both names (as PyTorch), so a
// checkpoint loads whether or not the model ties. Files hold it once: save_safetensors writes
// one copy and records the alias in the metadata (safetensors.torch.save_model's convention,
// Note [tied tensors in files] in safetensors.cc), and load_safetensors restores it.
// Deferred init: the module that registered the tensor first owns it and initialises it; a
// module holding it through a second registration (the tensor is deferred already) or through
// set_parameter borrows it: its materialize_own_parameters neither allocates nor initialises it
// (its reset_parameters still draws, leaving the generator where eager construction leaves it,
// and writes nothing into an unallocated tensor; an allocated one is kept). So the tied values
// are the owner's, in any materialization order, as in eager construction where the tie comes
// after both constructors ran.
// ZeRO-3 (dist/fsdp.h): a parameter used by two units lives in the root unit (Note [unit
// lifecycle]).
Tensor Module::set_parameter(const std::string& name, Tensor value) {
  ACCEL_CHECK(sharded_how_to_load_.empty(), ValueError, "Module.set_parameter", type_name(),
              " is sharded (its parameters are views of ZeRO-3 unit buffers): tie parameters "
              "before preparing the model");
  auto it =
      std::find_if(params_.begin(), params_.end(), [&](const auto& e) { return e.first == name; });
  if (it == params_.end()) {
    std::string names;
    for (const auto& [n, p] : params_) names += (names.empty() ? "" : ", ") + n;
    ACCEL_THROW(IndexError, "Module.set_parameter", type_name(), " has no parameter '", name,
                "' (it has: ", names.empty() ? std::string("none") : names, ")");
  }
  ACCEL_CHECK(value.defined(), ValueError, "Module.set_parameter", type_name(), ": parameter '",
              name, "' is undefined");
  ACCEL_CHECK(value.is_floating_point(), DTypeError, "Module.set_parameter", type_name(),
              ": parameter '", name, "' must be floating point, got ", value.dtype());
  ACCEL_CHECK(value.is_leaf(), ValueError, "Module.set_parameter", type_name(), ": parameter '",
              name, "' ", value.sizes(),
              " has autograd history; a parameter is a leaf (pass another module's parameter, or "
              "detach it)");
  it->second = value;
  if (std::find(borrowed_.begin(), borrowed_.end(), name) == borrowed_.end())
    borrowed_.push_back(name);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_new_name(name, "Module.register_buffer");
  ACCEL_CHECK(value.defined(), ValueError, "Module.register_buffer", type_name(), ": buffer '",
              name, "' is undefined");
  if (!value.is_leaf() || value.requires_grad()) value = value.detach();
  buffers_.push_back(BufferEntry{name, value, persistent});
  return value;
}

void Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "Module.register_module");
  ACCEL_CHECK(module != nullptr, ValueError, "Module.register_module", type_name(), ": submodule '",
              name, "' is null");
  ACCEL_CHECK(module.get() != this, ValueError, "Module.register_module", type_name(),
              ": a module cannot be its own child ('", name, "')");
  children_.emplace_back(name, std::move(module));
}

// ---------------- access ----------------

namespace {
std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

void Module::collect_parameters(const std::string& prefix, Named<Tensor>& out, bool recurse) const {
  for (const auto& [n, t] : params_) out.emplace_back(join_name(prefix, n), t);
  if (!recurse) return;
  for (const auto& [n, c] : children_) c->collect_parameters(join_name(prefix, n), out, true);
}

void Module::collect_buffers(const std::string& prefix, Named<Tensor>& out, bool recurse,
                             bool persistent_only) const {
  for (const auto& b : buffers_) {
    if (!persistent_only || b.persistent) out.emplace_back(join_name(prefix, b.name), b.value);
  }
  if (!recurse) return;
  for (const auto& [n, c] : children_) {
    c->collect_buffers(join_name(prefix, n), out, true, persistent_only);
  }
}

void Module::collect_modules(const std::string& prefix, Named<Module*>& out) {
  out.emplace_back(prefix, this);
  for (const auto& [n, c] : children_) c->collect_modules(join_name(prefix, n), out);
}

namespace {
// Keeps the first occurrence of each TensorImpl (tied weights are stepped once).
Named<Tensor> dedupe(Named<Tensor>&& all) {
  std::unordered_set<const TensorImpl*> seen;
  Named<Tensor> out;
  out.reserve(all.size());
  for (auto& [n, t] : all) {
    if (seen.insert(t.impl()).second) out.emplace_back(std::move(n), std::move(t));
  }
  return out;
}
}  // namespace

Named<Tensor> Module::named_parameters(bool recurse) const {
  Named<Tensor> all;
  collect_parameters("", all, recurse);
  return dedupe(std::move(all));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

Named<Tensor> Module::named_buffers(bool recurse) const {
  Named<Tensor> all;
  collect_buffers("", all, recurse, false);
  return dedupe(std::move(all));
}

std::map<std::string, std::string> Module::tied_aliases() const {
  std::unordered_map<const TensorImpl*, std::string> first;
  std::map<std::string, std::string> out;
  Named<Tensor> all;
  collect_parameters("", all, true);
  collect_buffers("", all, true, false);
  for (const auto& [n, t] : all) {
    auto [it, fresh] = first.emplace(t.impl(), n);
    if (!fresh && it->second != n) out.emplace(n, it->second);
  }
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, c] : children_) out.push_back(c);
  return out;
}

Named<std::shared_ptr<Module>> Module::named_children() const { return children_; }

Named<Module*> Module::named_modules() {
  Named<Module*> out;
  collect_modules("", out);
  return out;
}

Tensor Module::parameter(const std::string& dotted_name) const {
  for (const auto& [n, t] : named_parameters()) {
    if (n == dotted_name) return t;
  }
  ACCEL_THROW(IndexError, "Module.parameter", type_name(), " has no parameter '", dotted_name, "'");
}

Tensor Module::buffer(const std::string& dotted_name) const {
  for (const auto& [n, t] : named_buffers()) {
    if (n == dotted_name) return t;
  }
  ACCEL_THROW(IndexError, "Module.buffer", type_name(), " has no buffer '", dotted_name, "'");
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

// ---------------- mode and placement ----------------

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
  return *this;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, c] : children_) c->apply(fn);
  fn(*this);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) p.zero_grad(set_to_none);
}

// Note [module tensors are updated in place]
// A subclass keeps its parameters as members (`Tensor weight = register_parameter(...)`) and the
// module table holds another handle to the same TensorImpl. Moving a module therefore cannot
// hand out new tensors: it swaps the storage/geometry/dtype inside the existing impl (what
// PyTorch's `param.data = ...` does). Autograd metadata (requires_grad, hooks, the grad
// accumulator) stays; the gradient is converted alongside. Optimizers built before the move see
// the moved tensors too, but their state (momentum, Adam moments) is not converted: build the
// optimizer after moving the model, as in PyTorch.
void assign_tensor_data(Tensor& dst, const Tensor& src) {
  TensorImpl* d = dst.impl();
  const TensorImpl* s = src.impl();
  d->storage_ = s->storage_;
  d->sizes_ = s->sizes_;
  d->strides_ = s->strides_;
  d->offset_ = s->offset_;
  d->dtype_ = s->dtype_;
  d->refresh();
}

void Module::apply_to_tensors(const std::function<Tensor(const Tensor&)>& convert) {
  NoGradGuard no_grad;
  std::unordered_set<const TensorImpl*> done;
  for (auto& [name, mod] : named_modules()) {
    for (auto& [n, p] : mod->params_) {
      if (!done.insert(p.impl()).second) continue;
      Tensor moved = convert(p);
      if (moved.is_same(p)) continue;
      Tensor g = p.grad();
      assign_tensor_data(p, moved.detach());
      if (g.defined()) p.set_grad(convert(g).detach());
    }
    for (auto& b : mod->buffers_) {
      if (!done.insert(b.value.impl()).second) continue;
      Tensor moved = convert(b.value);
      if (!moved.is_same(b.value)) assign_tensor_data(b.value, moved.detach());
    }
  }
}

namespace {
// A deferred tensor moved: new unallocated contiguous storage with the target device and dtype
// (nothing to copy), or `t` itself when both already match.
Tensor deferred_as(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  auto storage = make_intrusive<Storage>(size_t(t.numel()) * dtype_size(dtype), device,
                                         Storage::Unallocated{});
  return Tensor(make_intrusive<TensorImpl>(std::move(storage), t.sizes(),
                                           contiguous_strides(t.sizes()), 0, dtype));
}
}  // namespace

Module& Module::to(Device device) {
  apply_to_tensors([device](const Tensor& t) {
    return is_deferred(t) ? deferred_as(t, device, t.dtype()) : t.to(device);
  });
  return *this;
}

Module& Module::to(DType dtype) {
  ACCEL_CHECK(is_floating(dtype), DTypeError, "Module.to", type_name(),
              ": can only convert to a floating dtype, got ", dtype);
  apply_to_tensors([dtype](const Tensor& t) {
    if (!t.is_floating_point()) return t;
    return is_deferred(t) ? deferred_as(t, t.device(), dtype) : t.to(dtype);
  });
  return *this;
}

Module& Module::to(Device device, DType dtype) {
  to(device);
  return to(dtype);
}

// ---------------- state ----------------

Named<Tensor> Module::collect_state() const {
  // Tied tensors appear under every name (as in PyTorch), so a checkpoint loads into a module
  // whether or not the tie is rebuilt.
  Named<Tensor> all;
  collect_parameters("", all, true);
  collect_buffers("", all, true, true);
  return all;
}

namespace {
// Reading a deferred tensor would throw from core without saying which one; say it here.
void check_allocated(const Named<Tensor>& all, const char* op, const std::string& type,
                     const std::string& where) {
  for (const auto& [n, t] : all) {
    ACCEL_CHECK(!is_deferred(t), ValueError, op, type, where, ": '", n, "' ", t.sizes(),
                " is not allocated (built under nn::DeferredInit, or released by ZeRO-3); "
                "materialize it first (nn::materialize)");
  }
}
}  // namespace

TensorDict Module::state_dict() const {
  const Named<Tensor> all = collect_state();
  check_allocated(all, "Module.state_dict", type_name(), "");
  TensorDict out;
  for (auto& [n, t] : all) out.emplace(n, t.detach());
  return out;
}

TensorDict Module::state_handles() const {
  TensorDict out;
  for (auto& [n, t] : collect_state()) out.emplace(n, t.detach());
  return out;
}

// Note [sharded modules]
// Under ZeRO-3 (dist/fsdp.h, Note [unit lifecycle]) a parameter is a view of its unit's flat
// buffer: released between uses, or (the root unit) refreshed from the shards after every step.
// Copying values into it would either allocate a released view on its own, detaching the
// parameter from its unit (the deferred-init path below), or be overwritten by the next refresh:
// both silently lose the load. The engine marks every module of the model (set_sharded), so a
// load into the model or any part of it is refused up front. Without a mark, a released view of
// a larger storage can only be such a buffer (a deferred parameter owns its storage exactly) and
// is refused too; a sharded single-parameter unit whose buffer needs no padding looks like a
// deferred parameter, which is why the mark exists.
void Module::check_not_sharded(const char* op) {
  for (const auto& [name, m] : named_modules()) {
    if (m->sharded_how_to_load_.empty()) continue;
    const std::string which = name.empty() ? std::string() : " (its submodule '" + name + "')";
    ACCEL_THROW(ValueError, op, type_name(), which,
                " is sharded: its parameters are views of ZeRO-3 unit buffers, so copying values "
                "into them would be lost or detach them from their unit; ",
                m->sharded_how_to_load_);
  }
  for (const auto& [n, t] : collect_state()) {
    if (!t.defined() || t.storage()->allocated()) continue;
    ACCEL_CHECK(t.offset() == 0 && t.storage()->nbytes() == t.nbytes(), ValueError, op, type_name(),
                ": '", n,
                "' is a released view of a larger buffer (a ZeRO-3 sharded parameter?); load "
                "sharded models with Accelerator::load_state or "
                "dist::FullyShardedModel::load_full_parameters");
  }
}

// torch's load rule (Module._load_from_state_dict): a 0-dim parameter or buffer takes a checkpoint
// tensor of shape (1,), its one element (files of older code keep BatchNorm's
// num_batches_tracked as (1,)). Any other shape difference is refused.
static bool loads_as_scalar(const Tensor& saved, const Tensor& own) {
  return own.dim() == 0 && saved.dim() == 1 && saved.size(0) == 1;
}

LoadResult Module::load_state_dict(const TensorDict& state, bool strict) {
  check_not_sharded("load_state_dict");
  TensorDict own;
  for (auto& [n, t] : collect_state()) own.emplace(n, t.detach());
  LoadResult result;
  std::vector<std::string> mismatched;
  for (const auto& [n, t] : own) {
    auto it = state.find(n);
    if (it == state.end()) {
      result.missing_keys.push_back(n);
    } else if (!it->second.defined()) {
      mismatched.push_back(n + ": checkpoint tensor is undefined");
    } else if (it->second.sizes() != t.sizes() && !loads_as_scalar(it->second, t)) {
      mismatched.push_back(n + ": checkpoint " + shape_str(it->second.sizes()) + ", model " +
                           shape_str(t.sizes()));
    }
  }
  for (const auto& [n, t] : state) {
    if (!own.count(n)) result.unexpected_keys.push_back(n);
  }
  const bool fail = !mismatched.empty() ||
                    (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()));
  if (fail) {
    std::ostringstream os;
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      os << "; " << what << " (" << keys.size() << "): ";
      for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << keys[i];
    };
    if (strict) {
      list("missing keys", result.missing_keys);
      list("unexpected keys", result.unexpected_keys);
    }
    list("shape mismatch", mismatched);
    ACCEL_THROW(ValueError, "load_state_dict", "error(s) loading state into ", type_name(),
                os.str());
  }
  NoGradGuard no_grad;
  for (const auto& [n, dst] : own) {
    auto it = state.find(n);
    if (it == state.end()) continue;
    Tensor d = dst;  // shares the module's impl
    if (it->second.is_same(d)) continue;
    // A deferred parameter gets its memory here and its value from the checkpoint: loading a
    // DeferredInit model never runs its initialisers.
    if (is_deferred(d)) d.storage()->materialize();
    d.copy_(loads_as_scalar(it->second, d) ? it->second.reshape({}) : it->second);
  }
  return result;
}

void Module::save(const std::string& path, const Metadata& metadata) const {
  check_allocated(collect_state(), "Module.save", type_name(), " (to '" + path + "')");
  save_safetensors(path, state_dict(), metadata);
}

LoadResult Module::load(const std::string& path, bool strict) {
  return load_state_dict(load_safetensors(path), strict);
}

// ---------------- deferred init ----------------

// Note [deferred init]
// A model that does not fit one process must exist (names, shapes, the module tree) before any
// rank holds its values, so that ZeRO-3 can materialize one unit at a time, keep this rank's
// shard and free the rest (dist/fsdp.h). Under nn::DeferredInit, register_parameter releases
// each parameter's storage right after registering it (core/storage.h Note [released storage]):
// a constructor allocates at most one parameter at a time and ends holding none. Buffers stay
// real: they are small and constructors compute them.
//
// Same values as eager construction, in any order. Built-in constructors register their
// parameters and then call reset_parameters(), whose nn::init calls leave unallocated tensors
// alone but still pull from the generator as many values as they would have drawn (in small
// chunks, so no parameter-sized buffer). Two consequences: the default generator ends deferred
// construction in the state eager construction leaves it in (dropout and shuffling afterwards
// match), and each module's first deferred registration can snapshot the default generator's
// state (deferred_rng_state_, ~6 KB of text), which is exactly the state its eager
// reset_parameters() started from. materialize_own_parameters() sets that state, runs
// reset_parameters() and puts the current state back, so a module's values do not depend on
// which modules were materialized before it: a ZeRO-3 engine can walk its units in any order,
// or materialize only some of them, and get the parameters eager construction would have. This
// is why the order is not simply "named_modules() order": a model that registers its blocks
// after its head (examples/models.h's Gpt fills its ModuleList last) draws in a different order
// from the one named_modules() lists. An explicit generator (gen != nullptr) is not replayed:
// values are drawn from it in call order.
//
// What a deferred tensor supports: metadata (sizes, dtype, device, requires_grad, names),
// Module::to() (changes the metadata, allocates nothing), load_state_dict() (allocates the
// loaded parameters and copies the values in, no initialiser runs). Reading it (forward,
// state_dict, save) throws ValueError.

DeferredInit::DeferredInit() { ++g_deferred_depth; }
DeferredInit::~DeferredInit() { --g_deferred_depth; }
bool DeferredInit::active() { return g_deferred_depth > 0; }

bool is_deferred(const Tensor& t) { return t.defined() && !t.storage()->allocated(); }

bool is_deferred(const Module& m, bool recurse) {
  for (const auto& [n, p] : m.named_parameters(recurse)) {
    if (is_deferred(p)) return true;
  }
  return false;
}

void Module::reset_parameters(Generator*) {
  ACCEL_CHECK(params_.empty(), ValueError, "Module.reset_parameters", type_name(),
              " registers parameter '", params_.front().first,
              "' but does not override reset_parameters(Generator*), so it cannot be "
              "initialised after deferred construction (nn::DeferredInit / nn::materialize): "
              "override it with the constructor's initialisation");
}

bool Module::materialize_own_parameters(Generator* gen) {
  std::vector<Tensor> deferred, kept;
  for (const auto& [n, p] : params_) {
    // Note [tied parameters]: a borrowed parameter is its owner's to initialise; deferred, the
    // initialisers below leave it alone; allocated, it is kept.
    const bool borrowed = std::find(borrowed_.begin(), borrowed_.end(), n) != borrowed_.end();
    if (borrowed && is_deferred(p)) continue;
    (is_deferred(p) && !borrowed ? deferred : kept).push_back(p);
  }
  if (deferred.empty()) return false;
  NoGradGuard no_grad;
  // reset_parameters() re-initialises every own parameter; those that already had values keep
  // them.
  std::vector<Tensor> saved;
  for (const Tensor& p : kept) saved.push_back(p.clone());
  for (Tensor& p : deferred) {
    p.storage()->materialize();
    p.zero_();  // never garbage, even if an override forgets a parameter
  }
  try {
    if (gen == nullptr && !deferred_rng_state_.empty()) {
      Generator& g = default_generator();
      std::string now;
      {
        std::lock_guard<std::mutex> lk(g.mutex());
        now = g.state();
        g.set_state(deferred_rng_state_);
      }
      auto put_back = [&] {
        std::lock_guard<std::mutex> lk(g.mutex());
        g.set_state(now);
      };
      try {
        reset_parameters(nullptr);
      } catch (...) {
        put_back();
        throw;
      }
      put_back();
    } else {
      reset_parameters(gen);
    }
  } catch (...) {
    for (Tensor& p : deferred) p.storage()->release();
    throw;
  }
  for (size_t i = 0; i < kept.size(); ++i) kept[i].copy_(saved[i]);
  return true;
}

bool reset_module_parameters(Module& m, Generator* gen) {
  return m.materialize_own_parameters(gen);
}

void materialize(Module& m, const ModuleFilter& filter, Generator* gen) {
  for (auto& [name, mod] : m.named_modules()) {
    if (filter && !filter(name, *mod)) continue;
    mod->materialize_own_parameters(gen);
  }
}

// ---------------- printing ----------------

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled) ? demangled : mangled;
  std::free(demangled);
  // Drop namespaces but keep template arguments intact: cut at the last "::" before any '<'.
  const size_t angle = name.find('<');
  const size_t colon = name.rfind("::", angle == std::string::npos ? std::string::npos : angle);
  if (colon != std::string::npos) name = name.substr(colon + 2);
  return name;
}

void Module::repr_into(std::ostream& os, int indent) const {
  os << type_name() << '(' << extra_repr();
  if (!children_.empty()) {
    os << '\n';
    for (const auto& [n, c] : children_) {
      os << std::string(size_t(indent + 2), ' ') << '(' << n << "): ";
      c->repr_into(os, indent + 2);
      os << '\n';
    }
    os << std::string(size_t(indent), ' ');
  }
  os << ')';
}

std::string Module::repr() const {
  std::ostringstream os;
  repr_into(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.repr(); }

}  // namespace accel::nn
