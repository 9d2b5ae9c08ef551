// Checkpoint format 2 for the replicated strategies (one process, DDP, ZeRO-1/2) and the piece
// helpers every strategy shares (Note [format-2 strategy seam] in accelerate/strategy.h).
//
// Note [zero pieces]
// A ZeRO-1/2 bucket shard holds, for each parameter of the bucket it overlaps, a range of that
// parameter's flattened (tp-local) tensor: bucket b's rank-r shard is [r * shard_numel,
// (r + 1) * shard_numel) of the bucket, parameter j lies at [offset_j, offset_j + numel_j), so the
// shard holds the parameter's flat range [max(lo, off) - off, min(hi, off + n) - off). Each such
// part is one piece of "optim.<o>.<model>.<param>.<slot>" (region: the parameter's place, then
// that flat range; local: the view of the shard slot), so a bucket shard is written without a
// copy and read back on any mesh (another world size, FSDP, one process) by the overlaps of
// regions. The bucket's step is one value per parameter, written by the rank holding the
// parameter's first element; at load every parameter of a bucket must give the same step.
#include <algorithm>
#include <map>
#include <string>

#include "accelerate/strategy_base.h"
#include "parallel/checkpoint/names.h"

namespace accel::dist {

namespace names = ckpt::names;

// ---- the defaults of the seam ----

void StrategyCheckpoint::state_entries(std::vector<ckpt::StateEntry>&, bool, int) {
  ACCEL_THROW(ValueError, "save_state",
              "this strategy does not implement StrategyCheckpoint::state_entries (checkpoint "
              "format 2)");
}

std::unique_ptr<StrategyState> StrategyCheckpoint::read_pieces(ckpt::CheckpointSource&, bool, int) {
  ACCEL_THROW(ValueError, "load_state",
              "this strategy does not implement StrategyCheckpoint::read_pieces (checkpoint "
              "format 2)");
}

// ---- helpers ----

Tensor read_region(ckpt::CheckpointSource& src, const std::string& name, const Region& region,
                   DType dtype, Device device) {
  const ckpt::TensorRecord& r = src.tensor(name);
  ACCEL_CHECK(r.shape == region.global_shape(), ValueError, "load_state", "checkpoint tensor '",
              name, "' has shape ", shape_str(r.shape), ", this run's is ",
              shape_str(region.global_shape()));
  Tensor t = empty(region.local_shape(), TensorOptions(dtype, device));
  src.read(name, region, t);
  return t;
}

void check_model_shapes(const ckpt::CheckpointSource& src, size_t model,
                        const std::vector<std::pair<std::string, Shape>>& want) {
  std::string bad;
  size_t n = 0;
  for (const auto& [name, shape] : want) {
    const std::string g = names::model(model, name);
    if (!src.contains(g) || src.tensor(g).shape == shape) continue;
    bad += (n++ ? ", " : "") + name + ": checkpoint " + shape_str(src.tensor(g).shape) +
           ", model " + shape_str(shape);
  }
  ACCEL_CHECK(n == 0, ValueError, "load_state", "error(s) loading state into model ", model,
              "; shape mismatch (", n, "): ", bad);
}

Tensor read_whole(ckpt::CheckpointSource& src, const std::string& name) {
  const ckpt::TensorRecord& r = src.tensor(name);
  return read_region(src, name, Region::whole(r.shape), r.dtype, kCPU);
}

bool is_group_list(const std::string& key) {
  const std::string pre = "param_groups.", post = ".params";
  return key.rfind(pre, 0) == 0 && key.size() > pre.size() + post.size() &&
         key.compare(key.size() - post.size(), post.size(), post) == 0;
}

void own_group_lists(io::TensorDict& meta, const optim::Optimizer& opt, bool pipelined) {
  bool saved = false;
  for (const auto& [k, v] : meta) saved = saved || is_group_list(k);
  if (saved && !pipelined) return;
  for (const auto& [k, v] : opt.state_dict())
    if (is_group_list(k)) meta[k] = v;
}

void optimizer_meta_entries(std::vector<ckpt::StateEntry>& out, size_t o,
                            const io::TensorDict& state, bool primary, bool group_lists) {
  for (const auto& [key, v] : state)
    if (key.rfind("state.", 0) != 0 && v.defined() && (group_lists || !is_group_list(key)))
      out.push_back(
          {"optim." + std::to_string(o) + "." + key, Region::whole(v.sizes()), v, primary, ""});
}

io::TensorDict read_optimizer_meta(ckpt::CheckpointSource& src, size_t o) {
  const std::string prefix = "optim." + std::to_string(o) + ".param_groups.";
  io::TensorDict out;
  for (const std::string& n : src.names())
    if (n.rfind(prefix, 0) == 0)
      out[n.substr(prefix.size() - std::string("param_groups.").size())] = read_whole(src, n);
  return out;
}

std::string rank_name(const std::string& base, int world_rank) {
  return base + ".rank" + std::to_string(world_rank);
}

std::map<std::string, std::string> saved_slots(const ckpt::CheckpointSource& src, size_t o,
                                               size_t model, const std::string& param) {
  const std::string prefix = names::optim_slot(o, model, param, "");
  std::map<std::string, std::string> out;
  for (const std::string& n : src.names()) {
    if (n.rfind(prefix, 0) != 0) continue;
    const std::string slot = n.substr(prefix.size());
    // "a.b" is a parameter too: a longer name's slots hold a dot.
    if (!slot.empty() && slot.find('.') == std::string::npos) out.emplace(slot, n);
  }
  return out;
}

namespace {

// Parameter impl -> (model, name), for the optimizers' parameters.
std::map<const void*, std::pair<size_t, std::string>> owners(
    const std::vector<std::shared_ptr<nn::Module>>& models) {
  std::map<const void*, std::pair<size_t, std::string>> out;
  for (size_t m = 0; m < models.size(); ++m)
    for (auto& [n, p] : models[m]->named_parameters()) out.emplace(p.impl(), std::make_pair(m, n));
  return out;
}

const std::pair<size_t, std::string>& owner_of(
    const std::map<const void*, std::pair<size_t, std::string>>& own, const Tensor& p, size_t o) {
  const auto it = own.find(p.impl());
  ACCEL_CHECK(it != own.end(), ValueError, "save_state", "optimizer ", o,
              " steps a tensor of shape ", p.shape_str(),
              " that is not a parameter of a prepared model");
  return it->second;
}

std::vector<Tensor> params_of(const optim::Optimizer& opt) {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt.num_param_groups(); ++g)
    for (const Tensor& p : opt.params(g)) out.push_back(p);
  return out;
}

// "state.<k>.<slot>" -> (k, slot); false for other keys.
bool split_state_key(const std::string& key, size_t& k, std::string& slot) {
  if (key.rfind("state.", 0) != 0) return false;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot > 15) return false;
  const std::string digits = key.substr(6, dot - 6);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  k = std::stoul(digits);
  slot = key.substr(dot + 1);
  return true;
}

std::string join_layout(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + ", " + b;
}

// Model `i`'s full state dict read from `src` where `cp` places each tensor (the whole tensor, or
// under tp this rank's part); tied aliases left out; a name the checkpoint holds that the model
// has not maps to an undefined tensor, which apply_state's check names.
io::TensorDict read_model_state(ckpt::CheckpointSource& src, size_t i, nn::Module& model,
                                const StrategyCheckpoint& cp) {
  const auto aliases = model.tied_aliases();
  io::TensorDict d;
  const io::TensorDict live = model.state_handles();
  std::vector<std::pair<std::string, Shape>> want;
  for (const auto& [n, t] : live)
    if (!aliases.count(n)) want.emplace_back(n, cp.place(i, n, t.sizes()).region.global_shape());
  check_model_shapes(src, i, want);
  for (const auto& [n, t] : live) {
    if (aliases.count(n)) continue;
    const std::string g = names::model(i, n);
    if (!src.contains(g)) continue;  // apply_state names it missing
    const TensorPlace pl = cp.place(i, n, t.sizes());
    d[n] = read_region(src, g, pl.region, load_dtype(src.tensor(g).dtype, t.dtype()), t.device());
  }
  const std::string prefix = names::model(i, "");
  for (const std::string& g : src.names())
    if (g.rfind(prefix, 0) == 0) {
      const std::string n = g.substr(prefix.size());
      if (!live.count(n) && !cp.held_elsewhere(i, n)) d.emplace(n, Tensor());
    }
  return d;
}

}  // namespace

// ---- ReplicatedStrategy ----

void ReplicatedStrategy::state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window,
                                       int world_rank) {
  NoGradGuard ng;
  const bool dp0 = ctx_.rank == 0;
  const bool lead = place(size_t(-1), "", {}).lead;
  for (size_t i = 0; i < models_.size(); ++i) {
    const auto aliases = models_[i]->tied_aliases();
    for (auto& [n, t] : models_[i]->state_dict()) {
      if (aliases.count(n)) continue;
      const TensorPlace pl = place(i, n, t.sizes());
      out.push_back({names::model(i, n), pl.region, t.detach(), dp0 && pl.primary, pl.layout});
    }
  }
  const auto own = owners(models_);
  for (size_t o = 0; o < slots_.size(); ++o) {
    Slot& s = *slots_[o];
    const io::TensorDict st = s.user->state_dict();
    optimizer_meta_entries(out, o, st, dp0 && lead, !pipelined());
    if (!s.zero) {
      const std::vector<Tensor> params = params_of(*s.user);
      for (const auto& [key, v] : st) {
        size_t k = 0;
        std::string slot;
        if (key.rfind("state.", 0) != 0 || !v.defined()) continue;
        // State that is not per model parameter (LBFGS's history, an optimizer over tensors of
        // no prepared model): whole, as "optim.<o>.opaque.<rest of the key>".
        if (!split_state_key(key, k, slot) || k >= params.size() || !own.count(params[k].impl())) {
          out.push_back({"optim." + std::to_string(o) + ".opaque." + key.substr(6),
                         Region::whole(v.sizes()), v, dp0 && lead, ""});
          continue;
        }
        const auto& [m, pname] = owner_of(own, params[k], o);
        const TensorPlace pl = place(m, pname, params[k].sizes());
        const std::string g = names::optim_slot(o, m, pname, slot);
        if (v.dim() > 0 && v.sizes() == params[k].sizes())
          out.push_back({g, pl.region, v, dp0 && pl.primary, pl.layout});
        else
          out.push_back({g, Region::whole(v.sizes()), v, dp0 && pl.lead, ""});
      }
      continue;
    }
    // Note [zero pieces]
    const ZeroOptimizer& z = *s.zero;
    const bool writes = !ctx_.hsdp() || ctx_.dp_replicate->rank() == 0;
    const int64_t r = shard_rank();
    const io::TensorDict sh = z.shard_state_dict();
    for (size_t b = 0; b < z.buckets().size(); ++b) {
      const Bucket& bk = z.buckets()[b];
      const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
      const std::string prefix = "state." + std::to_string(b) + ".";
      for (const auto& [key, v] : sh) {
        if (key.rfind(prefix, 0) != 0 || !v.defined()) continue;
        const std::string slot = key.substr(prefix.size());
        for (size_t j = 0; j < bk.params.size(); ++j) {
          const Tensor& p = z.params()[bk.params[j]].second;
          const int64_t off = bk.offset[j], n = p.numel();
          const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
          if (a >= e) continue;
          const auto& [m, pname] = owner_of(own, p, o);
          const TensorPlace pl = place(m, pname, p.sizes());
          const std::string g = names::optim_slot(o, m, pname, slot);
          if (v.dim() == 0) {
            if (a == off) out.push_back({g, Region::whole({}), v, writes && pl.lead, ""});
            continue;
          }
          out.push_back({g, pl.region.flat(a - off, e - off), v.narrow(0, a - lo, e - a),
                         writes && pl.primary, join_layout(pl.layout, "dp_shard: Flat")});
        }
      }
    }
    if (mid_window)
      for (size_t b = 0; b < s.accum.size(); ++b)
        if (s.accum[b].defined())
          out.push_back(
              {rank_name("grad.accum." + std::to_string(o) + "." + std::to_string(b), world_rank),
               Region::whole(s.accum[b].sizes()), s.accum[b], true, "Partial"});
  }
  if (mid_window)
    for (size_t i = 0; i < models_.size(); ++i)
      for (auto& [n, p] : models_[i]->named_parameters())
        if (p.grad().defined())
          out.push_back({rank_name(names::grad(i, n), world_rank), Region::whole(p.grad().sizes()),
                         p.grad(), true, "Partial"});
}

std::unique_ptr<StrategyState> ReplicatedStrategy::read_pieces(ckpt::CheckpointSource& src,
                                                               bool mid_window, int world_rank) {
  NoGradGuard ng;
  auto st = std::make_unique<ReplicatedState>();
  for (size_t i = 0; i < models_.size(); ++i)
    st->models.push_back(read_model_state(src, i, *models_[i], *this));
  const auto own = owners(models_);
  for (size_t o = 0; o < slots_.size(); ++o) {
    const Slot& s = *slots_[o];
    io::TensorDict meta = read_optimizer_meta(src, o);
    own_group_lists(meta, *s.user, pipelined());
    if (!s.zero) {
      const std::vector<Tensor> params = params_of(*s.user);
      const std::string opaque = "optim." + std::to_string(o) + ".opaque.";
      for (const std::string& n : src.names())
        if (n.rfind(opaque, 0) == 0) meta["state." + n.substr(opaque.size())] = read_whole(src, n);
      for (size_t k = 0; k < params.size(); ++k) {
        if (!own.count(params[k].impl())) continue;  // opaque (above)
        const auto& [m, pname] = owner_of(own, params[k], o);
        const TensorPlace pl = place(m, pname, params[k].sizes());
        for (const auto& [slot, g] : saved_slots(src, o, m, pname)) {
          const ckpt::TensorRecord& r = src.tensor(g);
          const std::string key = "state." + std::to_string(k) + "." + slot;
          meta[key] = r.shape.empty() || r.shape != pl.region.global_shape()
                          ? read_whole(src, g)
                          : read_region(src, g, pl.region, load_dtype(r.dtype, params[k].dtype()),
                                        params[k].device());
        }
      }
      st->optimizers.push_back(std::move(meta));
      st->shards.emplace_back();
      st->accum.emplace_back();
      continue;
    }
    // Note [zero pieces]: each bucket shard's slots filled part by part.
    const ZeroOptimizer& z = *s.zero;
    const int64_t r = shard_rank();
    io::TensorDict sh;
    for (size_t b = 0; b < z.buckets().size(); ++b) {
      const Bucket& bk = z.buckets()[b];
      const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
      const Tensor& leaf = z.shard_params().at(z.shard_index(b));
      const std::string prefix = "state." + std::to_string(b) + ".";
      std::string step_from;
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const Tensor& p = z.params()[bk.params[j]].second;
        const int64_t off = bk.offset[j], n = p.numel();
        const auto& [m, pname] = owner_of(own, p, o);
        const TensorPlace pl = place(m, pname, p.sizes());
        for (const auto& [slot, g] : saved_slots(src, o, m, pname)) {
          const ckpt::TensorRecord& rec = src.tensor(g);
          if (rec.shape.empty()) {
            Tensor v = read_whole(src, g);
            auto it = sh.find(prefix + slot);
            if (it == sh.end()) {
              sh[prefix + slot] = v;
              step_from = g;
            } else {
              ACCEL_CHECK(it->second.item<double>() == v.item<double>(), IoError, "load_state", "'",
                          g, "' is ", v.item<double>(), ", but '", step_from, "' of the same ",
                          "ZeRO bucket is ", it->second.item<double>());
            }
            continue;
          }
          const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
          Tensor& buf = sh[prefix + slot];
          if (!buf.defined())
            buf = zeros({bk.shard_numel}, TensorOptions(leaf.dtype(), leaf.device()));
          if (a >= e) continue;
          ACCEL_CHECK(rec.shape == pl.region.global_shape(), ValueError, "load_state",
                      "checkpoint tensor '", g, "' has shape ", shape_str(rec.shape),
                      ", this run's is ", shape_str(pl.region.global_shape()));
          src.read(g, pl.region.flat(a - off, e - off), buf.narrow(0, a - lo, e - a));
        }
      }
    }
    st->shards.push_back(std::move(sh));
    st->optimizers.push_back(std::move(meta));  // param groups: the schedulers' lr
    std::vector<Tensor> accum;
    if (mid_window)
      for (size_t b = 0; b < z.buckets().size(); ++b) {
        const std::string g =
            rank_name("grad.accum." + std::to_string(o) + "." + std::to_string(b), world_rank);
        if (!src.contains(g)) {
          accum.clear();
          break;
        }
        const Tensor& leaf = z.shard_params().at(z.shard_index(b));
        accum.push_back(read_whole(src, g).to(leaf.device(), leaf.dtype()));
      }
    st->accum.push_back(std::move(accum));
  }
  st->grads.resize(models_.size());
  for (size_t i = 0; i < models_.size() && mid_window; ++i)
    for (auto& [n, p] : models_[i]->named_parameters()) {
      const std::string g = rank_name(names::grad(i, n), world_rank);
      if (!src.contains(g)) continue;
      const ckpt::TensorRecord& rec = src.tensor(g);
      ACCEL_CHECK(rec.shape == p.sizes() && is_floating(rec.dtype), ShapeError, "load_state", "'",
                  g, "' is ", rec.dtype, " ", shape_str(rec.shape), ", parameter ", p.shape_str());
      st->grads[i].emplace_back(
          p, read_region(src, g, Region::whole(rec.shape), p.dtype(), p.device()));
    }
  st->has_grads = mid_window;
  return st;
}

}  // namespace accel::dist
