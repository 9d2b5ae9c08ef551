// FsdpStrategy ("fsdp", zero_stage 3): the one ZeRO-3 engine of the Accelerator, one
// dist::FullyShardedModel per prepared model (parallel/fsdp.h, Note [unit lifecycle]); checkpoints
// as pieces of format 2 (Note [format-2 strategy seam] in accelerate/strategy.h).
#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <unordered_map>

#include "io/safetensors.h"
#include "core/error.h"
#include "accelerate/checkpoint.h"
#include "parallel/fsdp.h"
#include "accelerate/strategy.h"
#include "accelerate/strategies/fsdp_options.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"
#include "parallel/checkpoint/names.h"

namespace accel::dist {

namespace {

// Buffers and frozen parameters: replicated, written by rank 0 like a plain model file.
io::TensorDict replicated_state(const nn::Module& m) {
  io::TensorDict d = m.state_handles();  // trainable parameters are released: not read
  std::set<std::string> trainable;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) {
      d.erase(name);
      trainable.insert(name);
    }
  // Note [tied parameters] in nn/module.cc: a trainable parameter's other names too.
  for (auto& [alias, name] : m.tied_aliases())
    if (trainable.count(name)) d.erase(alias);
  return d;
}

// alias -> name of the tied trainable parameters (Note [tied tensors in files] in
// io/safetensors.cc): the metadata of a streamed export, which writes each once.
io::Metadata trainable_aliases(const nn::Module& m) {
  io::Metadata out;
  std::set<std::string> trainable;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) trainable.insert(name);
  for (auto& [alias, name] : m.tied_aliases())
    if (trainable.count(name)) out.emplace(alias, name);
  return out;
}

// What read_pieces() found, applied by swapping (Note [checkpoint loading] in
// accelerate/accelerator_state.cc): after apply_state every field holds what it replaced.
struct Loaded final : StrategyState {
  std::vector<std::vector<std::pair<size_t, Tensor>>> slices;  // per model: (param, values)
  std::vector<io::TensorDict> replicated;                      // per model
  std::vector<io::TensorDict> optimizers;                      // per stepping optimizer
  std::vector<std::vector<std::pair<size_t, Tensor>>> grads;   // per model: window gradients
  bool has_grads = false;
};

class FsdpStrategy final : public Strategy, public StrategyCheckpoint {
 public:
  explicit FsdpStrategy(const StrategyContext& ctx)
      : ctx_(ctx), options_(ctx.options_as<FsdpStrategyOptions>("fsdp").fsdp) {
    options_.find_unused_parameters =
        options_.find_unused_parameters || ctx.ddp.find_unused_parameters;
    // Note [mesh support]: sharded over dp_shard, replicated across dp_replicate (HSDP).
    if (ctx.hsdp()) options_.replicate = ctx.dp_replicate;
  }

  std::string_view name() const override { return "fsdp"; }
  bool takes_deferred_models() const override { return true; }  // unit by unit
  StrategyCheckpoint& checkpoint() override { return *this; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    for (auto& [name, p] : model->named_parameters())  // frozen ones are replicated
      if (!p.requires_grad()) broadcast_in_place(*ctx_.group, p, 0);
    models_.push_back(model);
    sharded_.push_back(std::make_unique<FullyShardedModel>(model, ctx_.shard_group(), options_));
    sharded_.back()->set_auto_sync(sync_);
  }

  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override {
    std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> where;
    for (size_t m = 0; m < sharded_.size(); ++m)
      for (size_t k = 0; k < sharded_[m]->parameters().size(); ++k)
        where.emplace(sharded_[m]->parameters()[k].second.impl(), std::make_pair(m, k));
    Stepping s;
    std::vector<optim::ParamGroup> groups;
    for (size_t g = 0; g < user->num_param_groups(); ++g) {
      optim::ParamGroup sg;
      sg.lr = user->lr(g);
      sg.weight_decay = user->weight_decay(g);
      for (const Tensor& p : user->params(g)) {
        auto it = where.find(p.impl());
        ACCEL_CHECK(it != where.end(), ValueError, "prepare", "zero_stage 3: parameter group ", g,
                    " holds a tensor of shape ", p.shape_str(),
                    " that is not a trainable parameter of a prepared model (prepare the model "
                    "before its optimizer)");
        const auto [m, k] = it->second;
        sg.params.push_back(sharded_[m]->shard_params()[k]);
        s.keys.push_back(std::to_string(m) + ":" + sharded_[m]->parameters()[k].first);
        if (std::find(s.models.begin(), s.models.end(), m) == s.models.end()) s.models.push_back(m);
      }
      groups.push_back(std::move(sg));
    }
    s.opt = std::shared_ptr<optim::Optimizer>(user->rebuild(std::move(groups)));
    s.user = user;
    stepping_.push_back(s);
    return s.opt;
  }

  void backward(const Tensor& loss, bool sync) override {
    for (auto& m : sharded_) m->begin_backward(sync);
    std::exception_ptr err;
    try {
      loss.backward();
    } catch (...) {
      err = std::current_exception();
    }
    for (auto& m : sharded_) m->end_backward(err);
    if (err) std::rethrow_exception(err);
  }

  void set_sync(bool sync) override {
    sync_ = sync;
    for (auto& m : sharded_) m->set_auto_sync(sync);
  }

  StepGrads grads(const optim::Optimizer& stepping) override {
    const Stepping& s = find(stepping);
    for (size_t m : s.models) sharded_[m]->prepare_step();
    StepGrads g;
    g.sharded = true;
    g.shard_group = ctx_.shard_group();
    for (size_t i = 0; i < stepping.num_param_groups(); ++i)
      for (const Tensor& p : stepping.params(i)) g.params.push_back(p);
    // Shard leaf k of a model is its parameter k's slice: name each by its parameter.
    if (grad_names_models_ != sharded_.size()) {
      grad_names_.clear();
      for (size_t m = 0; m < sharded_.size(); ++m) {
        const auto& leaves = sharded_[m]->shard_params();
        const auto& params = sharded_[m]->parameters();
        for (size_t k = 0; k < leaves.size() && k < params.size(); ++k)
          grad_names_.emplace(leaves[k].impl(), std::to_string(m) + ":" + params[k].first);
      }
      grad_names_models_ = sharded_.size();
    }
    g.names = name_grads(g.params, grad_names_);
    return g;
  }

  void after_step(optim::Optimizer& stepping, bool stepped) override {
    if (!stepped) return;
    for (size_t m : find(stepping).models) sharded_[m]->after_step();
  }

  void zero_grad(optim::Optimizer& stepping, bool) override {
    for (size_t m : find(stepping).models) sharded_[m]->zero_grad();
  }

  StrategyMemory memory() const override {
    StrategyMemory out;
    for (auto& m : sharded_) {
      const FsdpMemory f = m->memory();
      out.param_bytes += f.shard_bytes;
      out.grad_bytes += f.grad_shard_bytes + f.unsharded_grad_bytes;
      out.gathered_param_bytes += f.gathered_bytes;
      out.full_param_bytes += f.full_param_bytes;
    }
    for (auto& s : stepping_)
      for (auto& [key, t] : s.opt->state_dict())
        if (key.rfind("state.", 0) == 0 && t.defined()) out.optimizer_bytes += int64_t(t.nbytes());
    return out;
  }

  io::TensorDict full_state_dict(size_t index) override {
    return sharded_.at(index)->full_state_dict();
  }

  // ---- checkpoints ----

  // Note [hsdp checkpoints]
  // Under HSDP the R replicas of a shard are equal, so only the ranks of replica 0 (dp_replicate
  // coordinate 0) write their spans as pieces. Nobody gathers the model. A load on any mesh reads
  // its own spans from those pieces (read_pieces). Window gradients (saved mid-window) are per
  // rank: every rank writes its own, and they resume only on the same mesh.
  bool writes_shards() const { return !ctx_.hsdp() || ctx_.dp_replicate->rank() == 0; }

  // ---- format 2 (Note [format-2 strategy seam] in accelerate/strategy.h): each trainable
  // parameter's span [lo, hi) is the Flat range of its place; its slots likewise; the scalar
  // slots (step) written by the rank whose span starts the parameter; replicated state (buffers,
  // frozen parameters) by dp rank 0; window gradients (whole, per rank) by every rank. ----
  void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank) override {
    namespace names = ckpt::names;
    NoGradGuard ng;
    const bool dp0 = ctx_.rank == 0, writes = writes_shards();
    const bool lead = place(size_t(-1), "", {}).lead;
    std::unordered_map<std::string, std::pair<size_t, size_t>> at_key;  // "m:name" -> (m, k)
    std::vector<std::vector<FullyShardedModel::Span>> spans;
    for (size_t m = 0; m < sharded_.size(); ++m) {
      spans.push_back(sharded_[m]->spans());
      for (size_t k = 0; k < spans[m].size(); ++k) {
        const auto& sp = spans[m][k];
        at_key.emplace(std::to_string(m) + ":" + sp.name, std::make_pair(m, k));
        const TensorPlace pl = place(m, sp.name, sp.shape);
        out.push_back({names::model(m, sp.name), pl.region.flat(sp.lo, sp.hi),
                       sharded_[m]->shard_params()[k].detach(), writes && pl.primary,
                       pl.layout.empty() ? "dp_shard: Flat" : pl.layout + ", dp_shard: Flat"});
      }
      const auto aliases = models_[m]->tied_aliases();
      for (auto& [n, t] : replicated_state(*models_[m])) {
        if (aliases.count(n)) continue;
        const TensorPlace pl = place(m, n, t.sizes());
        out.push_back({names::model(m, n), pl.region, t.detach(), dp0 && pl.primary, pl.layout});
      }
    }
    for (size_t i = 0; i < stepping_.size(); ++i) {
      const Stepping& s = stepping_[i];
      optimizer_meta_entries(out, i, s.user->state_dict(), dp0 && lead, !pipelined());
      for (const auto& [key, v] : s.opt->state_dict()) {
        if (key.rfind("state.", 0) != 0 || !v.defined()) continue;
        const size_t dot = key.find('.', 6);
        const size_t k = std::stoul(key.substr(6, dot - 6));
        const std::string slot = key.substr(dot + 1);
        const auto [m, kk] = at_key.at(s.keys.at(k));
        const FullyShardedModel::Span& sp = spans[m][kk];
        const TensorPlace pl = place(m, sp.name, sp.shape);
        const std::string g = names::optim_slot(i, m, sp.name, slot);
        if (v.dim() == 0)
          out.push_back(
              {g, Region::whole({}), v, writes && pl.lead && sp.lo == 0 && sp.hi > 0, ""});
        else
          out.push_back({g, pl.region.flat(sp.lo, sp.hi), v, writes && pl.primary, ""});
      }
    }
    if (mid_window)
      for (size_t m = 0; m < sharded_.size(); ++m)
        for (auto& [name, p] : sharded_[m]->parameters())
          if (p.grad().defined())
            out.push_back({rank_name(names::grad(m, name), world_rank),
                           Region::whole(p.grad().sizes()), p.grad(), true, "Partial"});
  }

  std::unique_ptr<StrategyState> read_pieces(ckpt::CheckpointSource& src, bool mid_window,
                                             int world_rank) override {
    namespace names = ckpt::names;
    NoGradGuard ng;
    auto out = std::make_unique<Loaded>();
    std::unordered_map<std::string, std::pair<size_t, size_t>> at_key;
    std::vector<std::vector<FullyShardedModel::Span>> spans;
    for (size_t m = 0; m < sharded_.size(); ++m) {
      spans.push_back(sharded_[m]->spans());
      std::vector<std::pair<std::string, Shape>> want;
      for (const auto& sp : spans[m])
        want.emplace_back(sp.name, place(m, sp.name, sp.shape).region.global_shape());
      for (auto& [n, t] : replicated_state(*models_[m]))
        want.emplace_back(n, place(m, n, t.sizes()).region.global_shape());
      check_model_shapes(src, m, want);
      std::vector<std::pair<size_t, Tensor>> slices;
      for (size_t k = 0; k < spans[m].size(); ++k) {
        const auto& sp = spans[m][k];
        at_key.emplace(std::to_string(m) + ":" + sp.name, std::make_pair(m, k));
        const std::string g = names::model(m, sp.name);
        ACCEL_CHECK(src.contains(g), ValueError, "load_state", "the checkpoint has no parameter '",
                    sp.name, "' of model ", m);
        const Tensor& leaf = sharded_[m]->shard_params()[k];
        slices.emplace_back(
            k, read_region(src, g, place(m, sp.name, sp.shape).region.flat(sp.lo, sp.hi),
                           leaf.dtype(), leaf.device()));
      }
      out->slices.push_back(std::move(slices));
      io::TensorDict rep;
      for (auto& [n, t] : replicated_state(*models_[m])) {
        const std::string g = names::model(m, n);
        if (src.contains(g))
          rep[n] = read_region(src, g, place(m, n, t.sizes()).region, t.dtype(), t.device());
      }
      out->replicated.push_back(std::move(rep));
    }
    for (size_t i = 0; i < stepping_.size(); ++i) {
      const Stepping& s = stepping_[i];
      io::TensorDict d = own_groups(i);
      for (auto& [k, v] : read_optimizer_meta(src, i))
        if (k.ends_with(".lr") || k.ends_with(".weight_decay")) d[k] = v;
      for (size_t k = 0; k < s.keys.size(); ++k) {
        const auto [m, kk] = at_key.at(s.keys[k]);
        const FullyShardedModel::Span& sp = spans[m][kk];
        const Tensor& leaf = sharded_[m]->shard_params()[kk];
        const Region region = place(m, sp.name, sp.shape).region;
        for (const auto& [slot, g] : saved_slots(src, i, m, sp.name)) {
          const ckpt::TensorRecord& r = src.tensor(g);
          d["state." + std::to_string(k) + "." + slot] =
              r.shape.empty()
                  ? read_whole(src, g)
                  : read_region(src, g, region.flat(sp.lo, sp.hi), leaf.dtype(), leaf.device());
        }
      }
      out->optimizers.push_back(std::move(d));
    }
    out->grads.resize(sharded_.size());
    out->has_grads = mid_window;
    for (size_t m = 0; m < sharded_.size() && mid_window; ++m) {
      const auto& ps = sharded_[m]->parameters();
      for (size_t k = 0; k < ps.size(); ++k) {
        const std::string g = rank_name(names::grad(m, ps[k].first), world_rank);
        if (!src.contains(g)) continue;
        const ckpt::TensorRecord& r = src.tensor(g);
        ACCEL_CHECK(r.shape == ps[k].second.sizes() && is_floating(r.dtype), IoError, "load_state",
                    "'", g, "' is ", r.dtype, " ", shape_str(r.shape), ", the parameter ",
                    ps[k].second.shape_str());
        out->grads[m].emplace_back(k, read_region(src, g, Region::whole(r.shape),
                                                  ps[k].second.dtype(), ps[k].second.device()));
      }
    }
    return out;
  }

  // Note [fsdp loading memory]
  // read_pieces reads only the elements of this rank's spans (of the parameters and of every
  // optimizer slot) from the pieces that hold them: a new tensor per parameter
  // slice in the leaf's dtype (one shard of parameters in all) and the optimizer state itself
  // (which the optimizer adopts without a copy). apply_state swaps the slices with the live
  // shards through a bounded buffer, so no copy of the model is ever made for the rollback, and
  // the old optimizer state is kept by handle only. The load's peak is therefore the training
  // state plus one parameter shard (plus the old optimizer state when the run had one).
  //
  // Swaps (Loaded's comment): checks first, so that it throws with nothing changed; afterwards
  // `state` holds what was replaced. No collective (finish_load re-gathers the root units).
  void apply_state(StrategyState& state) override {
    auto* lp = dynamic_cast<Loaded*>(&state);
    ACCEL_CHECK(lp != nullptr && lp->slices.size() == sharded_.size() &&
                    lp->replicated.size() == sharded_.size() &&
                    lp->grads.size() == sharded_.size() &&
                    lp->optimizers.size() == stepping_.size(),
                ValueError, "load_state", "a state read by another strategy or accelerator");
    Loaded& l = *lp;
    NoGradGuard ng;
    // 1. checks
    std::vector<io::TensorDict> own_rep;
    for (size_t m = 0; m < sharded_.size(); ++m) {
      for (const auto& [k, v] : l.slices[m]) {
        const Tensor& leaf = sharded_[m]->shard_params().at(k);
        ACCEL_CHECK(leaf.numel() == v.numel() && leaf.dtype() == v.dtype(), ValueError,
                    "load_state", "shard of ", sharded_[m]->parameters()[k].first, " holds ",
                    leaf.numel(), " elements of ", leaf.dtype(), ", the checkpoint slice ",
                    v.numel(), " of ", v.dtype());
      }
      io::TensorDict own = replicated_state(*models_[m]);
      for (const auto& [name, v] : own) {
        auto it = l.replicated[m].find(name);
        ACCEL_CHECK(it != l.replicated[m].end() && it->second.sizes() == v.sizes() &&
                        it->second.dtype() == v.dtype(),
                    ValueError, "load_state", "model ", m, ": '", name,
                    "' is missing or of another shape");
      }
      own_rep.push_back(std::move(own));
    }
    // 2. optimizers (each load is all or nothing; undo the earlier ones when one fails)
    std::vector<io::TensorDict> old;
    try {
      for (size_t i = 0; i < stepping_.size(); ++i) {
        old.push_back(stepping_[i].opt->state_dict());
        stepping_[i].opt->load_state_dict(std::move(l.optimizers[i]));
      }
    } catch (...) {
      for (size_t i = 0; i + 1 < old.size(); ++i)
        stepping_[i].opt->load_state_dict(std::move(old[i]));
      throw;
    }
    for (size_t i = 0; i < stepping_.size(); ++i) l.optimizers[i] = std::move(old[i]);
    // 3. values and gradients (cannot fail after the checks)
    for (size_t m = 0; m < sharded_.size(); ++m) {
      for (const auto& [k, v] : l.slices[m])
        if (v.numel() > 0) swap_values(sharded_[m]->shard_params()[k], v);
      for (const auto& [name, v] : own_rep[m]) swap_values(v, l.replicated[m].at(name));
      std::vector<std::pair<size_t, Tensor>> had;
      const auto& ps = sharded_[m]->parameters();
      for (size_t k = 0; k < ps.size(); ++k)
        if (ps[k].second.grad().defined()) had.emplace_back(k, ps[k].second.grad());
      sharded_[m]->zero_grad();
      if (l.has_grads)
        for (const auto& [k, g] : l.grads[m]) {
          Tensor p = ps[k].second;
          p.set_grad(g);
        }
      l.grads[m] = std::move(had);
    }
    l.has_grads = true;
  }

  void finish_load() override {
    for (auto& m : sharded_) m->refresh_root();
  }
  // Note [streaming model loads] in accelerate/accelerator.cc: this rank's span of every trainable
  // parameter, straight into its shard; buffers and frozen parameters whole; then the root
  // units are gathered from the new shards (collective, also after a failed read).
  void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                  std::exception_ptr& err) override {
    FullyShardedModel& f = *sharded_.at(index);
    try {
      const auto spans = f.spans();
      for (size_t k = 0; k < spans.size(); ++k)
        if (src.contains(spans[k].name) && spans[k].hi > spans[k].lo)
          read_into(src, spans[k].name, spans[k].lo, spans[k].hi, f.shard_params()[k]);
      for (auto& [name, t] : replicated_state(*models_.at(index)))
        if (src.contains(name)) read_into(src, name, 0, t.numel(), t);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    try {
      f.refresh_root();
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }

  // Every rank gathers each unit in turn (collective); rank 0 writes it and drops it. A failure
  // of rank 0's file (bad path, full disk) does not leave the others waiting in a gather: rank 0
  // keeps taking part, and the outcome is agreed on at the end (IoError on every rank).
  void save_model(size_t index, const std::string& path) override {
    FullyShardedModel& f = *sharded_.at(index);
    const io::TensorDict rep = replicated_state(*models_.at(index));
    std::vector<io::SafetensorsWriter::Entry> entries;
    for (const auto& [name, shape, dtype] : f.full_parameter_order())
      entries.push_back({name, dtype, shape});
    for (const auto& [name, t] : rep) entries.push_back({name, t.dtype(), t.sizes()});
    std::unique_ptr<io::SafetensorsWriter> w;
    std::exception_ptr err;
    auto attempt = [&](const std::function<void()>& fn) {
      if (err) return;
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
        w.reset();  // removes the temporary file
      }
    };
    if (ctx_.rank == 0)
      attempt([&] {
        w = std::make_unique<io::SafetensorsWriter>(path, entries,
                                                    trainable_aliases(*models_.at(index)));
      });
    f.for_each_full_parameter([&](const std::string&, const Tensor& t) {
      if (w) attempt([&] { w->write(t); });
    });
    if (w)
      attempt([&] {
        for (const auto& [name, t] : rep) w->write(t);
        w->commit();
      });
    Tensor failed = full({1}, err ? 1.0 : 0.0, TensorOptions(kFloat32, ctx_.device));
    ctx_.group->all_reduce(failed, ReduceOp::Max);
    if (err) std::rethrow_exception(err);
    ACCEL_CHECK(failed.item<double>() == 0, IoError, "save_model", "rank 0 could not write '", path,
                "'");
  }

 private:
  struct Stepping {
    std::shared_ptr<optim::Optimizer> opt;
    std::shared_ptr<optim::Optimizer> user;
    std::vector<std::string> keys;  // "<model>:<name>" per parameter, in the optimizer's order
    std::vector<size_t> models;     // prepared models it steps
  };
  const Stepping& find(const optim::Optimizer& o) const {
    for (auto& s : stepping_)
      if (s.opt.get() == &o) return s;
    ACCEL_THROW(ValueError, "fsdp", "optimizer was not prepared by this strategy");
  }
  io::TensorDict own_groups(size_t i) const {
    io::TensorDict own;
    for (auto& [k, v] : stepping_[i].opt->state_dict())
      if (k.rfind("param_groups.", 0) == 0) own[k] = v;
    return own;
  }

  StrategyContext ctx_;
  FsdpOptions options_;
  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::unique_ptr<FullyShardedModel>> sharded_;
  // Shard leaf impl -> "<model>:<name>" for grads(), built once per set of prepared models.
  std::map<const void*, std::string> grad_names_;
  size_t grad_names_models_ = 0;
  std::vector<Stepping> stepping_;
  bool sync_ = true;  // Strategy::set_sync: what a plain loss.backward() does
};

StrategySpec fsdp_spec() {
  StrategySpec s;
  s.name = "fsdp";
  s.zero_stage = 3;
  s.make = [](const StrategyContext& ctx) { return std::make_unique<FsdpStrategy>(ctx); };
  // Note [one process under ZeRO]: 16-bit compute parameters and per-unit activation
  // checkpointing change what a step computes.
  s.runs_alone = [](const StrategyContext& ctx) {
    const FsdpOptions& o = ctx.options_as<FsdpStrategyOptions>("fsdp").fsdp;
    return o.param_dtype.has_value() || o.activation_checkpointing;
  };
  s.options = FsdpStrategyOptions::from;
  return s;
}

const StrategyRegistration kFsdp(fsdp_spec());

}  // namespace

}  // namespace accel::dist
