// ZeRO-3 per wrapping unit; see parallel/fsdp.h, Note [unit lifecycle].
#include "parallel/fsdp.h"

#include "nn/wrapper_label.h"

#include <algorithm>
#include <array>
#include <exception>
#include <unordered_map>
#include <unordered_set>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "nn/container.h"
#include "core/error.h"
#include "core/storage.h"
#include "parallel/ddp.h"
#include "parallel/fsdp_impl.h"
#include "parallel/hsdp.h"
#include "parallel/materialize.h"

namespace accel::dist {

namespace {

ProcessGroupPtr group_or_default(ProcessGroupPtr pg) { return pg ? pg : default_group(); }

bool has_trainable(const nn::Module& m) {
  for (auto& [n, p] : m.named_parameters())
    if (p.requires_grad()) return true;
  return false;
}

int64_t trainable_numel(const nn::Module& m) {
  int64_t n = 0;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

}  // namespace

FullyShardedModel::FullyShardedModel(std::shared_ptr<nn::Module> model, ProcessGroupPtr pg,
                                     FsdpOptions options)
    : model_(std::move(model)), pg_(group_or_default(std::move(pg))), options_(std::move(options)) {
  ACCEL_CHECK(model_ != nullptr, ValueError, "fsdp", "model is null");
  ACCEL_CHECK(options_.root >= 0 && options_.root < pg_->size(), DistError, "fsdp", "root ",
              options_.root, " is outside [0, ", pg_->size(), ")");
  hsdp::check_groups("fsdp", *pg_, options_.replicate);
  ACCEL_CHECK(!options_.param_dtype || is_floating(*options_.param_dtype), ValueError, "fsdp",
              "param_dtype must be a floating dtype, got ", *options_.param_dtype);
  if (options_.wrap == FsdpOptions::Wrap::Classes)
    ACCEL_CHECK(!options_.classes.empty(), DistError, "fsdp",
                "wrap policy 'classes' with no class names");
  if (options_.wrap == FsdpOptions::Wrap::MinParams)
    ACCEL_CHECK(options_.min_params > 0, DistError, "fsdp",
                "wrap policy 'min_params' needs min_params > 0, got ", options_.min_params);
  build_units();
  init_values();
  // Note [sharded modules] in nn/module.cc: a plain load_state_dict would be lost.
  for (auto& [name, m] : model_->named_modules())
    m->set_sharded(
        "load it with Accelerator::load_state or FullyShardedModel::load_full_parameters");
}

FullyShardedModel::~FullyShardedModel() {
  *alive_ = false;
  for (auto& [name, m] : model_->named_modules()) m->set_sharded("");
  for (auto& u : units_) {
    try {
      if (u->gather_work) u->gather_work->wait();
      if (u->reduce_work) u->reduce_work->wait();
    } catch (...) {  // a failed group: nothing left to wait for
    }
    if (u->module) u->module->set_call_wrapper({});
    if (u->seq) u->seq->unwrap(u->entry);
    if (u->list) u->list->unwrap(u->entry);
  }
}

// Units: outermost container entries the policy picks (Note [unit lifecycle]); a parameter used
// by two units, or by a unit and a module outside it (tied), belongs to the root unit.
void FullyShardedModel::build_units() {
  for (auto& [name, p] : model_->named_parameters())
    if (p.requires_grad()) params_.emplace_back(name, p);
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].second.impl(), i);

  auto root = std::make_unique<Unit>();
  root->root = true;
  root->type = model_->type_name();
  units_.push_back(std::move(root));
  // Per parameter (params_ index): the first unit that uses it, and whether another does too.
  std::vector<int> first_unit(params_.size(), -1);
  std::vector<uint8_t> tied(params_.size(), 0);
  std::unordered_set<std::string> matched_classes;

  auto matches = [&](const nn::Module& c) {
    switch (options_.wrap) {
      case FsdpOptions::Wrap::Entries: return has_trainable(c);
      case FsdpOptions::Wrap::Classes:
        return std::find(options_.classes.begin(), options_.classes.end(), c.type_name()) !=
               options_.classes.end();
      case FsdpOptions::Wrap::MinParams: return trainable_numel(c) >= options_.min_params;
      case FsdpOptions::Wrap::None: return false;
    }
    return false;
  };

  std::function<void(nn::Module&, const std::string&, int)> walk =
      [&](nn::Module& m, const std::string& path, int unit) {
        module_units_.emplace_back(&m, unit);
        for (auto& [pname, p] : m.named_parameters(false)) {
          if (!p.requires_grad()) continue;
          const size_t k = index.at(p.impl());
          if (first_unit[k] < 0) {
            first_unit[k] = unit;
          } else if (first_unit[k] != unit) {
            tied[k] = 1;
          }
        }
        auto* seq = dynamic_cast<nn::Sequential*>(&m);
        auto* list = dynamic_cast<nn::ModuleList*>(&m);
        for (auto& [cname, child] : m.named_children()) {
          const std::string cpath = path.empty() ? cname : path + "." + cname;
          int cu = unit;
          if (unit == 0 && matches(*child)) {
            matched_classes.insert(child->type_name());
            if (seq || list) {
              auto u = std::make_unique<Unit>();
              u->name = cpath;
              u->type = child->type_name();
              u->module = child.get();
              u->seq = seq;
              u->list = list;
              u->entry = size_t(std::stoul(cname));
              cu = int(units_.size());
              units_.push_back(std::move(u));
            } else {
              ACCEL_CHECK(options_.wrap != FsdpOptions::Wrap::Classes, DistError, "fsdp",
                          "module '", cpath, "' (", child->type_name(),
                          ") matches the wrap policy but is not an entry of a ModuleList or "
                          "Sequential, so its forward cannot be hooked (Note [entry wrappers]); "
                          "hold it in a container or choose another policy");
            }
          }
          walk(*child, cpath, cu);
        }
      };
  walk(*model_, "", 0);

  if (options_.wrap == FsdpOptions::Wrap::Classes)
    for (const std::string& c : options_.classes)
      ACCEL_CHECK(matched_classes.count(c), DistError, "fsdp", "wrap policy names class '", c,
                  "', which no module of ", model_->type_name(), " has");

  // Note [tied parameters] in nn/module.cc: a parameter used by several units is the
  // root's (always gathered, reduced once at the end of backward).
  for (size_t k = 0; k < params_.size(); ++k)
    units_[tied[k] ? 0 : size_t(first_unit[k])]->params.push_back(k);  // model order

  const int w = pg_->size();
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    Unit& u = *units_[ui];
    u.arrived.assign(u.params.size(), 0);
    for (size_t k : u.params) {
      const Tensor& p = params_[k].second;
      if (u.offset.empty()) {
        u.master = p.dtype();
        u.device = p.device();
      }
      ACCEL_CHECK(p.dtype() == u.master && p.device() == u.device, DistError, "fsdp", "unit '",
                  u.name, "' mixes parameters of ", u.master, " on ", u.device, " and ", p.dtype(),
                  " on ", p.device(), " ('", params_[k].first, "'); a unit shards one flat buffer");
      ACCEL_CHECK(is_floating(p.dtype()), DTypeError, "fsdp", "parameter '", params_[k].first,
                  "' is ", p.dtype(), "; only floating parameters train");
      u.offset.push_back(u.used);
      u.used += p.numel();
    }
    u.numel = (u.used + w - 1) / w * w;
    u.shard_numel = u.numel / w;
    u.compute = options_.param_dtype ? *options_.param_dtype : u.master;
  }
}

void FullyShardedModel::init_values() {
  NoGradGuard ng;
  const int r = pg_->rank();
  std::vector<Tensor> leaves(params_.size()), grad_views(params_.size());
  // Which unit holds each trainable parameter, at which index of its u.params.
  UnitIndex where;
  bool any_deferred = false;
  for (auto& up : units_)
    for (size_t j = 0; j < up->params.size(); ++j) {
      const Tensor& p = params_[up->params[j]].second;
      where[p.impl()] = {up.get(), j};
      any_deferred = any_deferred || nn::is_deferred(p);
    }
  // Note [deferred regions] in parallel/materialize.cc: deferred values are not broadcast, so the
  // ranks must have built the model from one generator state.
  if (any_deferred) {
    check_deferred_agreement(*model_, *pg_, "fsdp");
    if (hsdp::active(options_.replicate))
      check_deferred_agreement(*model_, *options_.replicate, "fsdp");
  }
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.params.empty()) {  // frozen parameters only (replicated, whole)
      materialize_unit_modules(u, {});
      continue;
    }
    // This rank's range [lo, hi) of parameter j's (tp-local) row-major order, and where it lies
    // in the shard.
    auto span = [&](size_t j) {
      const int64_t n = params_[u.params[j]].second.numel(), o = u.offset[j];
      const int64_t lo = std::clamp<int64_t>(r * u.shard_numel - o, 0, n);
      const int64_t hi = std::max(lo, std::clamp<int64_t>((r + 1) * u.shard_numel - o, 0, n));
      return std::array<int64_t, 3>{lo, hi, lo < hi ? o + lo - r * u.shard_numel : 0};
    };
    bool deferred = false;
    for (size_t k : u.params) deferred = deferred || nn::is_deferred(params_[k].second);
    if (deferred) {
      init_deferred_unit(u, where);
    } else {
      init_eager_unit(u);
    }
    // A deferred unit's gradient shard gets its memory at its first reduction (issue_reduce):
    // preparing a model too large for one rank holds its parameter shards only.
    u.grad_shard = deferred ? nn::deferred_tensor({u.shard_numel}, u.master, u.device)
                            : zeros({u.shard_numel}, TensorOptions(u.master, u.device));
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t k = u.params[j];
      Tensor p = params_[k].second;
      const Shape shape = p.sizes();
      nn::assign_tensor_data(p, u.full.narrow(0, u.offset[j], p.numel()).view(shape));
      const auto [lo, hi, at] = span(j);
      Tensor leaf = u.shard.narrow(0, at, hi - lo).detach();
      leaf.requires_grad_(true);
      leaves[k] = leaf;
      grad_views[k] = u.grad_shard.narrow(0, at, hi - lo);
    }
    if (!deferred) {
      u.gathered = true;
      if (!u.root) release(u);
    } else if (u.root) {
      gather(u, /*wait=*/true);  // the root stays gathered
    }
  }
  shard_leaves_ = std::move(leaves);
  // Buffers are replicated: everyone starts from root's.
  broadcast_module_buffers(*pg_, *model_, options_.root);
  hsdp::broadcast_buffers(options_.replicate, *model_);
  // Hooks: units' entries, and every parameter's accumulation (Note [unit lifecycle]).
  std::weak_ptr<bool> alive = alive_;
  for (auto& up : units_) {
    Unit* u = up.get();
    for (size_t j = 0; j < u->params.size(); ++j) {
      Tensor p = params_[u->params[j]].second;
      p.register_post_accumulate_grad_hook([this, alive, u, j](Tensor&) {
        if (alive.lock()) on_param_grad(*u, j);
      });
    }
    if (u->root) continue;
    // Note [module calls] in nn/module.h: the wrapper sees any call of the unit's
    // module; the entry routes the parent's direct forward() calls to it.
    u->module->set_call_wrapper(
        [this, alive, u](nn::Module&, nn::Values& in, const nn::CallFn& call) {
          ACCEL_CHECK(alive.lock() != nullptr, ValueError, "fsdp", "unit '", u->name,
                      "' outlived its FullyShardedModel");
          return unit_call(*u, in, call);
        });
    nn::set_call_wrapper_label(*u->module, "ZeRO-3 unit '" + u->name + "'");
    if (u->seq) u->seq->wrap(u->entry);
    if (u->list) u->list->wrap(u->entry);
  }
  grad_views_ = std::move(grad_views);
  root_version_ = units_[0]->params.empty() ? 0 : units_[0]->shard.version();
  // The unsharded parameters just went back to the allocator: hand that memory to the system,
  // or the process keeps a whole model's footprint for the rest of the run.
  if (Allocator* a = get_allocator(kCPU)) a->empty_cache();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// An eager unit (or one whose modules hold deferred parameters of other units only): its modules'
// deferred parameters of other units stay deferred for theirs; the unit's flat buffer is filled
// with the parameters' values, broadcast from root (replicas: from replica 0), and this rank's
// shard cut from it.
void FullyShardedModel::init_eager_unit(Unit& u) {
  materialize_unit_modules(u, {});
  Tensor flat = zeros({u.numel}, TensorOptions(u.master, u.device));
  for (size_t j = 0; j < u.params.size(); ++j) {
    const Tensor& p = params_[u.params[j]].second;
    flat.narrow(0, u.offset[j], p.numel()).copy_(p.reshape({p.numel()}));
  }
  if (pg_->size() > 1) pg_->broadcast(flat, options_.root);
  hsdp::broadcast_from_first_replica(options_.replicate, flat);
  u.shard = flat.narrow(0, pg_->rank() * u.shard_numel, u.shard_numel).clone();
  u.full = u.compute == u.master ? flat : flat.to(u.compute);
}

// Note [deferred regions] in parallel/materialize.cc: a unit with deferred parameters never
// exists whole. Each module holding one of them streams this rank's flat range of it straight
// into the shard (tp-sharded ones: the range of the tp piece); the unit's full buffer is created
// without memory (gathered on first use; the root's at once). Allocated parameters of the unit
// (loaded, or tied and materialised earlier) are broadcast from root one by one and their ranges
// copied in. No full unit, and no broadcast of deferred values: they are deterministic.
void FullyShardedModel::init_deferred_unit(Unit& u, const UnitIndex& where) {
  const int r = pg_->rank();
  u.shard = zeros({u.shard_numel}, TensorOptions(u.master, u.device));
  materialize_unit_modules(u, where);
  for (size_t j = 0; j < u.params.size(); ++j) {
    const auto& [name, p] = params_[u.params[j]];
    if (nn::is_deferred(p)) continue;  // streamed into the shard
    Tensor value = p.contiguous();
    if (pg_->size() > 1) pg_->broadcast(value, options_.root);
    hsdp::broadcast_from_first_replica(options_.replicate, value);
    const int64_t n = p.numel(), o = u.offset[j];
    const int64_t lo = std::clamp<int64_t>(r * u.shard_numel - o, 0, n);
    const int64_t hi = std::max(lo, std::clamp<int64_t>((r + 1) * u.shard_numel - o, 0, n));
    if (lo < hi)
      u.shard.narrow(0, o + lo - r * u.shard_numel, hi - lo)
          .copy_(value.reshape({n}).narrow(0, lo, hi - lo));
  }
  u.full = nn::deferred_tensor({u.numel}, u.compute, u.device);
  u.gathered = false;
}

// Materialises the deferred parameters of every module that belongs to unit u or holds one of
// its parameters (a tied parameter's owner may sit in another unit). With `where` (a deferred
// unit): u's trainable parameters stream this rank's flat range into u.shard, frozen ones of u's
// own modules get their whole (tp-local) value, other units' stay deferred. Without: each such
// module is materialised whole (the parameters keep their values for the eager path to copy).
void FullyShardedModel::materialize_unit_modules(Unit& u, const UnitIndex& where) {
  const int r = pg_->rank();
  std::unordered_set<const TensorImpl*> mine;
  for (size_t k : u.params) mine.insert(params_[k].second.impl());
  std::vector<uint8_t> streamed(u.params.size(), 0);
  for (auto& [m, owner] : module_units_) {
    const bool own_unit = units_[size_t(owner)].get() == &u;
    bool holds = own_unit;
    for (auto& [pname, p] : m->named_parameters(false)) holds = holds || mine.count(p.impl());
    if (!holds) continue;
    if (where.empty()) {
      nn::reset_module_parameters(*m);
      continue;
    }
    std::vector<std::pair<std::string, Tensor>> frozen;  // name -> its local value
    const std::vector<std::string> names = materialize_regions(
        *m,
        [&](const std::string& name, const Tensor& p,
            const Region& local) -> std::optional<RegionTarget> {
          auto it = where.find(p.impl());
          if (it == where.end()) {  // not trainable: replicated, whole, by its own module's unit
            if (!own_unit || p.requires_grad()) return std::nullopt;
            Tensor dst = zeros(local.local_shape(), TensorOptions(p.dtype(), p.device()));
            frozen.emplace_back(name, dst);
            return RegionTarget{local, dst};
          }
          if (it->second.first != &u) return std::nullopt;  // another unit's
          const size_t j = it->second.second;
          const int64_t n = p.numel(), o = u.offset[j];
          const int64_t lo = std::clamp<int64_t>(r * u.shard_numel - o, 0, n);
          const int64_t hi = std::max(lo, std::clamp<int64_t>((r + 1) * u.shard_numel - o, 0, n));
          streamed[j] = 1;
          return RegionTarget{local.flat(lo, hi),
                              u.shard.narrow(0, lo < hi ? o + lo - r * u.shard_numel : 0, hi - lo)};
        });
    for (auto& [pname, p] : m->named_parameters(false))
      for (auto& [fname, value] : frozen)
        if (fname == pname && std::find(names.begin(), names.end(), fname) != names.end())
          nn::assign_tensor_data(p, value);
  }
  for (size_t j = 0; j < u.params.size(); ++j) {
    const auto& [name, p] = params_[u.params[j]];
    ACCEL_CHECK(streamed[j] || !nn::is_deferred(p), ValueError, "fsdp", "parameter '", name,
                "' has no memory: it is released (sharded already?) or deferred in a module that "
                "nn::reset_module_parameters could not initialise");
  }
}

std::vector<FullyShardedModel::UnitInfo> FullyShardedModel::units() const {
  std::vector<UnitInfo> out;
  for (auto& u : units_) out.push_back({u->name, u->type, u->used});
  return out;
}

std::vector<FullyShardedModel::Span> FullyShardedModel::spans(int rank) const {
  std::vector<Span> out(params_.size());
  const int r = rank < 0 ? pg_->rank() : rank;
  ACCEL_CHECK(r < pg_->size(), ValueError, "fsdp", "rank ", r, " of ", pg_->size());
  for (auto& u : units_)
    for (size_t j = 0; j < u->params.size(); ++j) {
      const size_t k = u->params[j];
      const Tensor& p = params_[k].second;
      const int64_t n = p.numel(), o = u->offset[j];
      const int64_t lo = std::clamp<int64_t>(r * u->shard_numel - o, 0, n);
      const int64_t hi = std::max(lo, std::clamp<int64_t>((r + 1) * u->shard_numel - o, 0, n));
      out[k] = {params_[k].first, p.sizes(), lo, hi};
    }
  return out;
}

std::vector<optim::ParamGroup> FullyShardedModel::shard_param_groups(
    const std::vector<optim::ParamGroup>& groups, const char* op) const {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].second.impl(), i);
  std::vector<bool> seen(params_.size(), false);
  std::vector<optim::ParamGroup> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    optim::ParamGroup sg;
    sg.lr = groups[g].lr;
    sg.weight_decay = groups[g].weight_decay;
    for (const Tensor& p : groups[g].params) {
      auto it = index.find(p.impl());
      ACCEL_CHECK(it != index.end(), ValueError, op, "parameter group ", g, " holds a tensor of ",
                  "shape ", p.shape_str(),
                  " that is not a trainable parameter of the sharded model (prepare the model "
                  "whose parameters the optimizer steps)");
      ACCEL_CHECK(!seen[it->second], ValueError, op, "parameter '", params_[it->second].first,
                  "' appears twice in the optimizer's groups");
      seen[it->second] = true;
      sg.params.push_back(shard_leaves_[it->second]);
    }
    out.push_back(std::move(sg));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// gather / release

void FullyShardedModel::gather(Unit& u, bool wait) {
  if (u.params.empty()) return;
  if (!u.gathered) {
    NoGradGuard ng;
    u.full.storage()->materialize();
    u.gather_src = u.compute == u.master ? u.shard : u.shard.to(u.compute);
    if (pg_->size() == 1) {
      // The refill restores what saved tensors of the unit's parameters saw: keep the version
      // (core/storage.h set_version; collectives write without bumping it).
      const uint32_t version = u.full.version();
      u.full.copy_(u.gather_src);
      u.full.storage()->set_version(version);
      u.gather_src = Tensor();
    } else {
      u.gather_work = pg_->all_gather_async(u.full, u.gather_src);
    }
    u.gathered = true;
  }
  if (wait) wait_gather(u);
}

void FullyShardedModel::wait_gather(Unit& u) {
  if (!u.gather_work) return;
  WorkPtr w = std::move(u.gather_work);
  u.gather_work.reset();
  w->wait();
  u.gather_src = Tensor();
}

void FullyShardedModel::release(Unit& u) {
  if (u.root || !u.gathered) return;
  wait_gather(u);  // never free memory a collective is writing
  u.full.storage()->release();
  u.gathered = false;
}

// ---------------------------------------------------------------------------------------------
// forward / backward hooks

std::vector<Tensor> FullyShardedModel::unit_call(Unit& u, nn::Values& in, const nn::CallFn& call) {
  gather(u, true);
  // A forward without backward (evaluation) must not grow the order forever.
  if (fwd_order_.size() >= 4 * units_.size()) {
    last_fwd_order_ = fwd_order_;
    fwd_order_.clear();
  }
  if (options_.activation_checkpointing && grad_enabled() &&
      std::find(fwd_order_.begin(), fwd_order_.end(), &u) != fwd_order_.end())
    u.reduce_at_end = true;
  u.fwd_pos = fwd_order_.size();
  fwd_order_.push_back(&u);
  if (options_.prefetch) {
    // The unit that ran after this one last time, else the next in module order.
    Unit* next = nullptr;
    if (u.fwd_pos + 1 < last_fwd_order_.size() && last_fwd_order_[u.fwd_pos] == &u)
      next = last_fwd_order_[u.fwd_pos + 1];
    if (!next)
      for (size_t i = 1; i + 1 < units_.size(); ++i)
        if (units_[i].get() == &u) next = units_[i + 1].get();
    if (next && next != &u) gather(*next, false);
  }
  // Mixed precision: the unit computes in its parameters' dtype (FSDP casts forward inputs).
  if (options_.param_dtype)
    for (nn::Value& v : in) {
      if (!v.is_tensor()) continue;
      const Tensor& x = v.tensor();
      if (x.defined() && is_floating(x.dtype()) && x.dtype() != *options_.param_dtype)
        v.tensor() = x.to(*options_.param_dtype);
    }
  std::vector<Tensor> ys =
      options_.activation_checkpointing && grad_enabled() ? checkpoint_call(in, call) : call(in);
  if (grad_enabled()) {
    std::weak_ptr<bool> alive = alive_;
    Unit* up = &u;
    std::unordered_set<const TensorImpl*> hooked;
    for (const Tensor& y : ys) {
      if (!y.defined() || !y.requires_grad() || !hooked.insert(y.impl()).second) continue;
      Tensor h = y;
      h.register_hook([this, alive, up](const Tensor&) {
        if (alive.lock()) on_output_grad(*up);
        return Tensor();
      });
    }
  }
  // The unit that ran last in the previous forward is the first whose backward runs: keeping it
  // saves gathering it again right away (as FSDP does), when a backward is coming.
  const bool first_in_backward = grad_enabled() && !last_fwd_order_.empty() &&
                                 u.fwd_pos + 1 == last_fwd_order_.size() &&
                                 last_fwd_order_.back() == &u;
  if (options_.reshard_after_forward && !first_in_backward) release(u);
  return ys;
}

// The recompute runs `call` (the module's hooks and forward, not the wrapper) after the output's
// gradient hook gathered the unit again, so the parameters are there and nothing releases them
// early. The defined tensor arguments are the checkpoint's inputs; plain arguments and None are
// captured. Undefined results (an optional loss left out) cannot pass through the checkpoint:
// they are left out of it and put back at their places.
std::vector<Tensor> FullyShardedModel::checkpoint_call(nn::Values& in, const nn::CallFn& call) {
  std::vector<size_t> at;
  std::vector<Tensor> inputs;
  nn::Values rest = in;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].is_tensor() && in[i].tensor().defined()) {
      at.push_back(i);
      inputs.push_back(in[i].tensor());
      rest[i].tensor() = Tensor();  // the checkpoint keeps its own aliases
    }
  auto defined = std::make_shared<std::vector<uint8_t>>();  // per result, from the first run
  auto fn = [call, rest, at, defined](const std::vector<Tensor>& xs) {
    nn::Values v = rest;
    for (size_t j = 0; j < at.size(); ++j) v[at[j]].tensor() = xs[j];
    std::vector<Tensor> all = call(v);
    if (defined->empty())
      for (const Tensor& t : all) defined->push_back(t.defined());
    ACCEL_CHECK(all.size() == defined->size(), ValueError, "fsdp",
                "activation checkpointing: the recomputed forward returned ", all.size(),
                " tensors, the first ", defined->size());
    std::vector<Tensor> out;
    for (size_t i = 0; i < all.size(); ++i) {
      ACCEL_CHECK(all[i].defined() == bool((*defined)[i]), ValueError, "fsdp",
                  "activation checkpointing: result ", i,
                  " is defined in one run of the forward and not in the other");
      if (all[i].defined()) out.push_back(all[i]);
    }
    return out;
  };
  std::vector<Tensor> ys = autograd::checkpoint(fn, inputs);
  std::vector<Tensor> out;
  size_t j = 0;
  for (uint8_t d : *defined) out.push_back(d ? ys[j++] : Tensor());
  return out;
}

void FullyShardedModel::on_output_grad(Unit& u) {
  if (!in_backward_) begin_backward_from_hook();
  gather(u, true);
  if (!options_.prefetch || !in_backward_) return;
  // Backward runs the units in reverse forward order: the one before this in the forward.
  if (u.fwd_pos > 0 && u.fwd_pos < bwd_order_.size() && bwd_order_[u.fwd_pos] == &u) {
    Unit* prev = bwd_order_[u.fwd_pos - 1];
    if (prev != &u && prev->ready < prev->params.size()) gather(*prev, false);
  }
}

void FullyShardedModel::on_param_grad(Unit& u, size_t j) {
  if (!in_backward_) begin_backward_from_hook();  // a plain loss.backward()
  // A tied parameter (in the root) or one used in two checkpointed segments accumulates once
  // per use site: count it once. The root, and a unit called twice under checkpointing, are
  // reduced at the end of backward, after every use.
  if (u.arrived[j]) return;
  u.arrived[j] = 1;
  if (++u.ready != u.params.size() || u.root || u.reduce_at_end) return;
  if (sync_ && !options_.find_unused_parameters) issue_reduce(u);
  release(u);
}

void FullyShardedModel::issue_reduce(Unit& u) {
  if (u.reduced || u.params.empty()) return;
  NoGradGuard ng;
  u.reduced = true;
  // At most two reduce-scatters in flight: every staging buffer alive costs one unit of memory.
  drain_reduces(1);
  const DType red = options_.reduce_in_fp32 ? u.master : u.compute;
  const int w = pg_->size();
  u.staging = empty({u.numel}, TensorOptions(red, u.device));
  if (u.numel > u.used) u.staging.narrow(0, u.used, u.numel - u.used).zero_();
  for (size_t j = 0; j < u.params.size(); ++j) {
    Tensor p = params_[u.params[j]].second;
    const Tensor g = p.grad();
    Tensor dst = u.staging.narrow(0, u.offset[j], p.numel());
    if (g.defined()) {
      dst.copy_(g.reshape({g.numel()}));
    } else {
      dst.zero_();
    }
    p.set_grad(Tensor());  // the full gradient goes; the shard keeps the reduced one
  }
  // The average: fp16 divides before summing (a sum of N gradients may overflow its range, as
  // FSDP's pre-divide factor avoids); other dtypes divide only this rank's reduced slice, 1/N of
  // the bytes (by a power of two both give the same bits).
  const bool pre_divide = red == kFloat16;
  if (w > 1 && pre_divide) u.staging.div_(double(w));
  if (!u.grad_shard.storage()->allocated()) {  // a deferred unit's first backward (init_values)
    u.grad_shard.storage()->materialize();
    u.grad_shard.zero_();
  }
  // With no gradient to accumulate into, the reduce-scatter writes the shard directly.
  u.reduce_into_shard = !u.grad_valid && red == u.master && w > 1;
  if (w == 1) {
    u.reduce_out = u.staging;
  } else {
    u.reduce_out =
        u.reduce_into_shard ? u.grad_shard : empty({u.shard_numel}, TensorOptions(red, u.device));
    u.reduce_work = pg_->reduce_scatter_async(u.reduce_out, u.staging,
                                              pre_divide ? ReduceOp::Sum : ReduceOp::Avg);
  }
  reduce_order_.push_back(&u);
}

// Waits for the oldest reduce-scatters until at most `keep` are in flight, adding each result into
// its unit's gradient shard and freeing its buffers.
void FullyShardedModel::drain_reduces(size_t keep) {
  NoGradGuard ng;
  while (reduce_order_.size() > keep) {
    Unit* u = reduce_order_.front();
    reduce_order_.pop_front();
    WorkPtr w = std::move(u->reduce_work);
    u->reduce_work.reset();
    Tensor out = std::move(u->reduce_out);
    u->staging = Tensor();
    u->reduce_out = Tensor();
    if (w) w->wait();
    hsdp::average_across_replicas(options_.replicate, out);  // Note [hsdp]
    if (u->reduce_into_shard) {
      u->reduce_into_shard = false;
    } else if (u->grad_valid) {
      u->grad_shard.add_(out);
    } else {
      u->grad_shard.copy_(out);
    }
    u->grad_valid = true;
  }
}

void FullyShardedModel::backward(const Tensor& loss, bool sync) {
  begin_backward(sync);
  std::exception_ptr err;
  try {
    loss.backward();
  } catch (...) {
    err = std::current_exception();
  }
  end_backward(err);
  if (err) std::rethrow_exception(err);
}

void FullyShardedModel::begin_backward(bool sync) {
  ACCEL_CHECK(!in_backward_, DistError, "fsdp", "backward() while another backward runs");
  check_root_fresh();
  if (sync) take_optimizer_grads();
  in_backward_ = true;
  sync_ = sync;
  for (auto& u : units_) {
    u->ready = 0;
    std::fill(u->arrived.begin(), u->arrived.end(), 0);
    u->reduced = false;
  }
  bwd_order_ = fwd_order_;
  last_fwd_order_ = fwd_order_;
  fwd_order_.clear();
  reduce_order_.clear();
}

// A plain loss.backward() (not FullyShardedModel::backward, not begin_backward): its first hook
// begins the backward, the engine ends it (Note [end-of-backward callbacks]).
void FullyShardedModel::begin_backward_from_hook() {
  begin_backward(auto_sync_);
  std::weak_ptr<bool> alive = alive_;
  autograd::queue_callback([this, alive](bool succeeded) {
    if (!alive.lock() || !in_backward_) return;
    // A failed backward keeps its own error: ours (an unused parameter) is not reported then.
    std::exception_ptr err =
        succeeded ? nullptr : std::make_exception_ptr(DistError("[fsdp] backward failed"));
    const bool failed = bool(err);
    end_backward(err);
    if (err && !failed) std::rethrow_exception(err);
  });
}

void FullyShardedModel::end_backward(std::exception_ptr& err) {
  ACCEL_CHECK(in_backward_, DistError, "fsdp", "end_backward() without begin_backward()");
  finish_backward(sync_, err);
  in_backward_ = false;
  for (auto& u : units_) u->reduce_at_end = false;
  bwd_order_.clear();
}

// Every rank issues every unit's reduce-scatter (zero-filled where gradients never came, so peers
// are not left waiting), waits in issue order, adds the results into the gradient shards, then
// frees every unit. Errors are kept until the collectives are done.
void FullyShardedModel::finish_backward(bool sync, std::exception_ptr& err) {
  std::vector<std::string> unused;
  // A model none of whose parameters got a gradient (the other model of a GAN step) is not
  // synced by this backward, on any rank.
  bool touched = false;
  for (auto& u : units_) touched = touched || u->ready > 0;
  if (sync && touched) {
    for (auto& u : units_) {
      if (!u->reduced && u->ready < u->params.size())
        for (size_t j = 0; j < u->params.size(); ++j)
          if (!params_[u->params[j]].second.grad().defined())
            unused.push_back(params_[u->params[j]].first);
      try {
        issue_reduce(*u);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    while (!reduce_order_.empty()) {
      try {
        drain_reduces(reduce_order_.size() - 1);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    grads_valid_ = true;
    prepare_step();  // Note [fsdp without its step calls]
  }
  for (auto& u : units_) {
    try {
      release(*u);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  if (!err && !unused.empty() && !options_.find_unused_parameters) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 8; ++i) names += (i ? ", " : "") + unused[i];
    if (unused.size() > 8) names += ", ...";
    try {
      ACCEL_THROW(DistError, "fsdp", unused.size(),
                  " parameter(s) got no gradient in this backward: ", names,
                  " (pass find_unused_parameters if the model leaves some unused)");
    } catch (...) {
      err = std::current_exception();
    }
  }
}

}  // namespace accel::dist
