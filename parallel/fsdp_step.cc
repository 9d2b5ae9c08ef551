// FullyShardedModel between steps: the split step and what makes it optional (Note [fsdp without
// its step calls] in parallel/fsdp.h), the root unit's re-gather, full values, memory.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/storage.h"
#include "parallel/fsdp.h"
#include "parallel/fsdp_impl.h"

namespace accel::dist {

void FullyShardedModel::refresh_root() {
  // The shards changed: a unit still gathered (the last of a forward that had no backward) would
  // hold old values.
  for (size_t i = 1; i < units_.size(); ++i) release(*units_[i]);
  Unit& root = *units_[0];
  root_fresh_ = true;
  if (root.params.empty()) return;
  root.gathered = false;  // the shard changed: gather it again into the persistent buffer
  root_version_ = root.shard.version();
  gather(root, true);
}

// ---------------------------------------------------------------------------------------------
// Note [fsdp without its step calls] (parallel/fsdp.h)

std::vector<Tensor> FullyShardedModel::forward_values(nn::Values inputs) {
  if (root_stale_anywhere()) refresh_root();
  return model_->call_values(std::move(inputs));
}

// Whether the root unit's shard changed since the root was gathered, on any rank: a rank whose
// slice of the root holds no parameter element does not see the optimizer's write, so the ranks
// agree by an all-reduce (Max) of one flag. Collective when more than one rank.
bool FullyShardedModel::root_stale_anywhere() {
  Unit& root = *units_[0];
  if (root.params.empty()) return false;
  const bool mine = root.shard.version() != root_version_;
  if (pg_->size() == 1) return mine;
  NoGradGuard ng;
  Tensor flag = full({1}, Scalar(mine ? 1.0 : 0.0), TensorOptions(kFloat32, root.device));
  pg_->all_reduce(flag, ReduceOp::Max);
  return flag.item<float>() > 0;
}

// At the beginning of a backward: the forward it differentiates must have seen the root's
// current values. Nothing to check right after a re-gather (no step can have come between).
void FullyShardedModel::check_root_fresh() {
  const bool fresh = root_fresh_;
  root_fresh_ = false;
  if (fresh || !root_stale_anywhere()) return;
  const Unit& root = *units_[0];
  std::string names;
  for (size_t j = 0; j < root.params.size() && j < 4; ++j)
    names += (j ? ", " : "") + params_[root.params[j]].first;
  if (root.params.size() > 4) names += ", ...";
  ACCEL_THROW(DistError, "fsdp", "rank ", pg_->rank(), ": the forward of ", model_->type_name(),
              " being differentiated used root parameters (", names,
              ") older than the last optimizer step: the model was called directly "
              "(model->forward(x) or (*model)(x)) after opt.step(), which skips the re-gather of "
              "the root unit that the FullyShardedModel's forward does. Call fsdp.forward(x) (or "
              "fsdp(x)), or call fsdp.after_step() after every optimizer step");
}

// A synced backward adds into the gradient shards only what the optimizer still holds: a shard
// leaf whose .grad opt.zero_grad() set to None starts from zero (and a unit none of whose leaves
// has one reduces straight into its shard); one given another tensor by hand starts from it.
void FullyShardedModel::take_optimizer_grads() {
  NoGradGuard ng;
  for (auto& u : units_) {
    if (!u->grad_valid) continue;
    bool any = false;
    for (size_t k : u->params) any = any || shard_leaves_[k].grad().defined();
    if (!any) {
      u->grad_valid = false;
      continue;
    }
    for (size_t k : u->params) {
      const Tensor g = shard_leaves_[k].grad();
      Tensor view = grad_views_[k];
      if (!g.defined()) {
        view.zero_();
      } else if (g.numel() > 0 && g.data_ptr() != view.data_ptr()) {
        view.copy_(g);
      }
    }
  }
}

void FullyShardedModel::prepare_step() {
  for (auto& u : units_)
    for (size_t k : u->params) {
      Tensor leaf = shard_leaves_[k];
      leaf.set_grad(u->grad_valid ? grad_views_[k] : Tensor());
    }
}

void FullyShardedModel::after_step() { refresh_root(); }

void FullyShardedModel::zero_grad() {
  for (auto& u : units_) {
    u->grad_valid = false;
    for (size_t k : u->params) {
      Tensor leaf = shard_leaves_[k];
      leaf.set_grad(Tensor());
      Tensor p = params_[k].second;
      p.set_grad(Tensor());
    }
  }
  grads_valid_ = false;
}

// ---------------------------------------------------------------------------------------------
// full values

void FullyShardedModel::for_each_full_parameter(
    const std::function<void(const std::string&, const Tensor&)>& fn) {
  NoGradGuard ng;
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.params.empty()) continue;
    Tensor flat = empty({u.numel}, TensorOptions(u.master, u.device));
    if (pg_->size() == 1) {
      flat.copy_(u.shard);
    } else {
      pg_->all_gather(flat, u.shard);
    }
    for (size_t j = 0; j < u.params.size(); ++j) {
      const auto& [name, p] = params_[u.params[j]];
      fn(name, flat.narrow(0, u.offset[j], p.numel()).view(p.sizes()));
    }
  }
}

std::vector<FullyShardedModel::ParamEntry> FullyShardedModel::full_parameter_order() const {
  std::vector<ParamEntry> out;
  for (auto& u : units_)
    for (size_t k : u->params)
      out.push_back({params_[k].first, params_[k].second.sizes(), u->master});
  return out;
}

io::TensorDict FullyShardedModel::full_state_dict() {
  io::TensorDict d = model_->state_handles();
  for_each_full_parameter([&](const std::string& name, const Tensor& v) {
    if (d.count(name)) d[name] = v.clone();
  });
  // A tied parameter's other names share its full value (their handles are views of a unit).
  for (const auto& [alias, name] : model_->tied_aliases())
    if (d.count(alias) && d.count(name)) d[alias] = d[name];
  return d;
}

void FullyShardedModel::load_full_parameters(
    const std::function<Tensor(const std::string&)>& value_of) {
  NoGradGuard ng;
  const std::vector<Span> sp = spans();
  std::vector<std::pair<size_t, Tensor>> values;
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor v = value_of(params_[k].first);
    ACCEL_CHECK(v.defined(), ValueError, "fsdp", "no value for parameter '", params_[k].first, "'");
    ACCEL_CHECK(v.sizes() == sp[k].shape, ShapeError, "fsdp", "value for '", params_[k].first,
                "' has shape ", v.shape_str(), ", the parameter ", shape_str(sp[k].shape));
    values.emplace_back(k, v);
  }
  for (auto& [k, v] : values) {
    Tensor leaf = shard_leaves_[k];
    if (sp[k].hi > sp[k].lo)
      leaf.detach().copy_(
          v.reshape({v.numel()}).narrow(0, sp[k].lo, sp[k].hi - sp[k].lo).to(leaf.dtype()));
  }
  refresh_root();
}

FsdpMemory FullyShardedModel::memory() const {
  FsdpMemory m;
  for (auto& u : units_) {
    if (u->params.empty()) continue;
    m.shard_bytes += int64_t(u->shard.nbytes());
    m.grad_shard_bytes += int64_t(u->grad_shard.nbytes());
    if (u->full.storage()->allocated()) m.gathered_bytes += int64_t(u->full.nbytes());
    m.full_param_bytes += u->used * int64_t(dtype_size(u->master));
    for (size_t k : u->params) {
      const Tensor g = params_[k].second.grad();
      if (g.defined()) m.unsharded_grad_bytes += int64_t(g.nbytes());
    }
  }
  return m;
}

}  // namespace accel::dist
