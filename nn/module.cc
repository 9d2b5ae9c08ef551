#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "io/safetensors.h"
#include "io/torch_file.h"
#include "io/torch_format.h"
#include "core/file_io.h"

namespace accel::nn {

// ---------------- access ----------------

namespace {
std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

// Walks skip None entries (Note [module members]).
void Module::collect_parameters(const std::string& prefix, Named<Tensor>& out, bool recurse) const {
  for (const auto& [n, t] : params_)
    if (t.defined()) out.emplace_back(join_name(prefix, n), t);
  if (!recurse) return;
  for (const auto& [n, c] : children_)
    if (c) c->collect_parameters(join_name(prefix, n), out, true);
}

void Module::collect_buffers(const std::string& prefix, Named<Tensor>& out, bool recurse,
                             bool persistent_only) const {
  for (const auto& b : buffers_) {
    if (b.value.defined() && (!persistent_only || b.persistent))
      out.emplace_back(join_name(prefix, b.name), b.value);
  }
  if (!recurse) return;
  for (const auto& [n, c] : children_) {
    if (c) c->collect_buffers(join_name(prefix, n), out, true, persistent_only);
  }
}

void Module::collect_modules(const std::string& prefix, Named<Module*>& out,
                             std::unordered_set<const Module*>& seen) {
  if (!seen.insert(this).second) return;  // shared: listed once, as torch's named_modules
  out.emplace_back(prefix, this);
  for (const auto& [n, c] : children_)
    if (c) c->collect_modules(join_name(prefix, n), out, seen);
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
  for (const auto& [n, c] : children_)
    if (c) out.push_back(c);
  return out;
}

Named<std::shared_ptr<Module>> Module::named_children() const {
  Named<std::shared_ptr<Module>> out;
  for (const auto& [n, c] : children_)
    if (c) out.emplace_back(n, c);
  return out;
}

Named<Module*> Module::named_modules() {
  Named<Module*> out;
  std::unordered_set<const Module*> seen;
  collect_modules("", out, seen);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::modules(bool include_self) {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [name, m] : named_modules()) {
    if (m == this) {
      if (!include_self) continue;
      // Owning when this module is held by a shared_ptr; a non-owning alias otherwise.
      std::shared_ptr<Module> self = weak_from_this().lock();
      out.push_back(self ? self : std::shared_ptr<Module>(std::shared_ptr<Module>(), this));
    } else {
      // Children are held by shared_ptrs (their parents' entries).
      std::shared_ptr<Module> owned = m->weak_from_this().lock();
      out.push_back(owned ? owned : std::shared_ptr<Module>(std::shared_ptr<Module>(), m));
    }
  }
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
  for (auto& [n, c] : children_)
    if (c) c->train(on);
  return *this;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, c] : children_)
    if (c) c->apply(fn);
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
      if (!p.defined() || !done.insert(p.impl()).second) continue;
      Tensor moved = convert(p);
      if (moved.is_same(p)) continue;
      Tensor g = p.grad();
      assign_tensor_data(p, moved.detach());
      if (g.defined()) p.set_grad(convert(g).detach());
    }
    for (auto& b : mod->buffers_) {
      if (!b.value.defined() || !done.insert(b.value.impl()).second) continue;
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
  std::vector<std::string> mismatched;  // torch's sentences, one per key
  for (const auto& [n, t] : own) {
    auto it = state.find(n);
    if (it == state.end()) {
      result.missing_keys.push_back(n);
    } else if (!it->second.defined()) {
      mismatched.push_back("undefined tensor for " + n + " in the checkpoint.");
    } else if (it->second.sizes() != t.sizes() && !loads_as_scalar(it->second, t)) {
      mismatched.push_back("size mismatch for " + n + ": copying a param with shape " +
                           shape_str(it->second.sizes()) +
                           " from checkpoint, the shape in current model is " +
                           shape_str(t.sizes()) + ".");
    }
  }
  for (const auto& [n, t] : state) {
    if (!own.count(n)) result.unexpected_keys.push_back(n);
  }
  const bool fail = !mismatched.empty() ||
                    (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()));
  if (fail) {
    // torch's report (Module.load_state_dict): missing, then unexpected (strict only), then the
    // size mismatches, one per line.
    std::ostringstream os;
    os << "Error(s) in loading state_dict for " << type_name() << ":";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      os << "\n\t" << what << " key(s) in state_dict: ";
      for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << '"' << keys[i] << '"';
      os << ".";
    };
    if (strict) {
      list("Missing", result.missing_keys);
      list("Unexpected", result.unexpected_keys);
    }
    for (const std::string& m : mismatched) os << "\n\t" << m;
    ACCEL_THROW(ValueError, "load_state_dict", os.str());
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

// Note [checkpoint file formats]: a path ending in .pt or .pth is a torch.save file
// (io/torch_format.h), anything else safetensors. Loading also recognises a torch.save
// file by its first bytes whatever its name (a Hugging Face pytorch_model.bin): a safetensors
// file begins with its header's length (8 bytes, at most 100 MB, so never the legacy magic) and
// the header's '{', which the zip magic with that length (0x04034b50) never has after it in a zip.
static bool torch_extension(const std::string& path) {
  auto ends = [&](const char* ext) {
    const size_t n = std::strlen(ext);
    return path.size() > n && path.compare(path.size() - n, n, ext) == 0;
  };
  return ends(".pt") || ends(".pth");
}

static bool torch_content(const std::string& path) {
  try {
    file_io::ReadableFile f = file_io::open_read(path, "Module.load");
    unsigned char head[16] = {};
    const size_t n = size_t(std::min<uint64_t>(f.size, sizeof head));
    return file_io::pread_all(f.fd.get(), head, n, 0) && io::detail::looks_like_torch_file(head, n);
  } catch (const IoError&) {
    return false;  // the safetensors reader names the problem
  }
}

void Module::save(const std::string& path, const Metadata& metadata) const {
  check_allocated(collect_state(), "Module.save", type_name(), " (to '" + path + "')");
  if (torch_extension(path)) {
    ACCEL_CHECK(metadata.empty(), ValueError, "Module.save", "'", path,
                "': a torch.save file has no metadata; save to a .safetensors file to keep it");
    io::save_pt(path, state_dict());
    return;
  }
  save_safetensors(path, state_dict(), metadata);
}

LoadResult Module::load(const std::string& path, bool strict) {
  if (torch_extension(path) || torch_content(path))
    return load_state_dict(io::load_pt(path), strict);
  return load_state_dict(load_safetensors(path), strict);
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
      if (c) {
        c->repr_into(os, indent + 2);
      } else {
        os << "None";
      }
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
