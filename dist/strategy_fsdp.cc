// FsdpStrategy: zero_stage 3 through the Accelerator, one dist::FullyShardedModel per prepared
// model (dist/fsdp.h, Note [unit lifecycle]); checkpoints per Note [fsdp checkpoints].
#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <unordered_map>

#include "autograd/nn/safetensors.h"
#include "core/error.h"
#include "dist/checkpoint.h"
#include "dist/fsdp.h"
#include "dist/fsdp_checkpoint.h"
#include "dist/strategy.h"
#include "dist/zero_checkpoint.h"

namespace accel::dist {

namespace {

namespace fs = std::filesystem;

std::string indexed_file(const char* stem, size_t i, const char* ext) {
  return (i == 0 ? std::string(stem) : std::string(stem) + "_" + std::to_string(i)) + ext;
}

// Buffers and frozen parameters: replicated, written by rank 0 like a plain model file.
nn::TensorDict replicated_state(const nn::Module& m) {
  nn::TensorDict d = m.state_handles();  // trainable parameters are released: not read
  std::set<std::string> trainable;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) {
      d.erase(name);
      trainable.insert(name);
    }
  // Note [tied parameters] in autograd/nn/module.cc: a trainable parameter's other names too.
  for (auto& [alias, name] : m.tied_aliases())
    if (trainable.count(name)) d.erase(alias);
  return d;
}

// alias -> name of the tied trainable parameters (Note [tied tensors in files] in
// autograd/nn/safetensors.cc): the metadata of a streamed export, which writes each once.
nn::Metadata trainable_aliases(const nn::Module& m) {
  nn::Metadata out;
  std::set<std::string> trainable;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) trainable.insert(name);
  for (auto& [alias, name] : m.tied_aliases())
    if (trainable.count(name)) out.emplace(alias, name);
  return out;
}

struct Loaded final : StrategyState {
  std::vector<std::vector<std::pair<size_t, Tensor>>> slices;  // per model: (param, values)
  std::vector<nn::TensorDict> replicated;                      // per model
  std::vector<nn::TensorDict> optimizers;                      // per stepping optimizer
  std::vector<std::vector<std::pair<size_t, Tensor>>> grads;   // per model: window gradients
  bool has_grads = false;
};

class FsdpStrategy final : public Strategy {
 public:
  explicit FsdpStrategy(const StrategyContext& ctx) : ctx_(ctx) {
    if (ctx.fsdp) options_ = *ctx.fsdp;
    options_.find_unused_parameters =
        options_.find_unused_parameters || ctx.ddp.find_unused_parameters;
  }

  std::string_view name() const override { return "fsdp"; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    for (auto& [name, p] : model->named_parameters())  // frozen ones are replicated
      if (!p.requires_grad()) broadcast_in_place(*ctx_.group, p, 0);
    models_.push_back(model);
    sharded_.push_back(std::make_unique<FullyShardedModel>(model, ctx_.group, options_));
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

  StepGrads grads(const optim::Optimizer& stepping) override {
    const Stepping& s = find(stepping);
    for (size_t m : s.models) sharded_[m]->prepare_step();
    StepGrads g;
    g.sharded = true;
    for (size_t i = 0; i < stepping.num_param_groups(); ++i)
      for (const Tensor& p : stepping.params(i)) g.params.push_back(p);
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

  nn::TensorDict full_state_dict(size_t index) override {
    return sharded_.at(index)->full_state_dict();
  }

  // ---- checkpoints ----

  nlohmann::json save_state(const std::string& dir, bool mid_window) override {
    auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
    if (ctx_.rank == 0)
      for (size_t i = 0; i < models_.size(); ++i)
        nn::save_safetensors(at(fsdp_replicated_file(i)), replicated_state(*models_[i]));
    std::vector<FullyShardedModel*> ms;
    for (auto& m : sharded_) ms.push_back(m.get());
    std::vector<FsdpOptimizerRef> os;
    for (auto& s : stepping_) os.push_back({s.opt.get(), s.keys});
    nlohmann::json rec = {{"fsdp", save_fsdp_state(dir, ms, os)}};
    if (mid_window)
      for (size_t i = 0; i < sharded_.size(); ++i) {
        // An open accumulation window keeps full gradients per rank (Note [unit lifecycle]).
        nn::TensorDict g;
        for (auto& [name, p] : sharded_[i]->parameters())
          if (p.grad().defined()) g[name] = p.grad();
        nn::save_safetensors(at(grads_file(i)), g);
      }
    for (size_t i = 0; i < sharded_.size(); ++i) fsync_path(at(fsdp_model_file(i, ctx_.rank)));
    for (size_t i = 0; i < stepping_.size(); ++i) fsync_path(at(fsdp_optimizer_file(i, ctx_.rank)));
    return rec;
  }

  std::unique_ptr<StrategyState> read_state(const std::string& dir, const nlohmann::json& saved,
                                            int saved_world, bool mid_window) override {
    auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
    if (!(saved.is_object() && saved.contains("fsdp")))
      return read_plain(dir, saved, saved_world, mid_window);
    FsdpCheckpointReader reader(dir, saved.at("fsdp"));
    ACCEL_CHECK(reader.world() == saved_world, IoError, "load_state", "checkpoint '", dir,
                "': the ZeRO-3 record says ", reader.world(), " ranks, state.json ", saved_world);
    ACCEL_CHECK(reader.num_models() == sharded_.size(), ValueError, "load_state", "checkpoint '",
                dir, "' holds ", reader.num_models(), " sharded models, this run prepared ",
                sharded_.size());
    ACCEL_CHECK(reader.num_optimizers() == stepping_.size(), ValueError, "load_state",
                "checkpoint '", dir, "' holds ", reader.num_optimizers(),
                " sharded optimizers, this run prepared ", stepping_.size());
    auto out = std::make_unique<Loaded>();
    for (size_t m = 0; m < sharded_.size(); ++m) {
      std::vector<std::pair<size_t, Tensor>> slices;
      const auto spans = sharded_[m]->spans();
      ACCEL_CHECK(reader.param_names(m).size() == spans.size(), ValueError, "load_state",
                  "checkpoint '", dir, "': model ", m, " has ", reader.param_names(m).size(),
                  " trainable parameters, this one ", spans.size());
      for (size_t k = 0; k < spans.size(); ++k) {
        const auto& sp = spans[k];
        ACCEL_CHECK(
            reader.has_param(m, sp.name) && reader.shape(m, sp.name) == sp.shape, ValueError,
            "load_state", "checkpoint '", dir, "': parameter '", sp.name, "' of model ", m,
            reader.has_param(m, sp.name) ? " has shape " + shape_str(reader.shape(m, sp.name)) +
                                               ", the model " + shape_str(sp.shape)
                                         : std::string(" is missing"));
        slices.emplace_back(k, reader.param_range(m, sp.name, sp.lo, sp.hi));
      }
      out->slices.push_back(std::move(slices));
      out->replicated.push_back(nn::load_safetensors(at(fsdp_replicated_file(m))));
    }
    std::vector<FullyShardedModel*> ms;
    for (auto& m : sharded_) ms.push_back(m.get());
    for (size_t i = 0; i < stepping_.size(); ++i)
      out->optimizers.push_back(
          fsdp_shard_optimizer_state(reader, i, stepping_[i].keys, ms, own_groups(i)));
    if (mid_window) {
      ACCEL_CHECK(saved_world == ctx_.world_size, ValueError, "load_state", "checkpoint '", dir,
                  "' was saved inside an accumulation window by ", saved_world,
                  " processes; its unsharded window gradients resume only with ", saved_world);
      out->has_grads = true;
      for (size_t m = 0; m < sharded_.size(); ++m) {
        nn::TensorDict g = nn::load_safetensors(at(grads_file(m)));
        std::vector<std::pair<size_t, Tensor>> gs;
        const auto& ps = sharded_[m]->parameters();
        for (size_t k = 0; k < ps.size(); ++k) {
          auto it = g.find(ps[k].first);
          if (it == g.end()) continue;
          ACCEL_CHECK(it->second.sizes() == ps[k].second.sizes(), ShapeError, "load_state", "'",
                      at(grads_file(m)), "': gradient of ", ps[k].first, " has shape ",
                      it->second.shape_str());
          gs.emplace_back(k, it->second);
        }
        out->grads.push_back(std::move(gs));
      }
    }
    return out;
  }

  std::unique_ptr<StrategyState> snapshot() override {
    NoGradGuard ng;
    auto out = std::make_unique<Loaded>();
    for (size_t m = 0; m < sharded_.size(); ++m) {
      std::vector<std::pair<size_t, Tensor>> slices;
      for (size_t k = 0; k < sharded_[m]->shard_params().size(); ++k)
        slices.emplace_back(k, sharded_[m]->shard_params()[k].detach().clone());
      out->slices.push_back(std::move(slices));
      nn::TensorDict rep = replicated_state(*models_[m]);
      for (auto& [k, v] : rep) v = v.clone();
      out->replicated.push_back(std::move(rep));
      std::vector<std::pair<size_t, Tensor>> gs;
      const auto& ps = sharded_[m]->parameters();
      for (size_t k = 0; k < ps.size(); ++k)
        if (ps[k].second.grad().defined()) gs.emplace_back(k, ps[k].second.grad());
      out->grads.push_back(std::move(gs));
    }
    out->has_grads = true;
    for (auto& s : stepping_) {
      nn::TensorDict d = s.opt->state_dict();
      for (auto& [k, v] : d) v = v.clone();
      out->optimizers.push_back(std::move(d));
    }
    return out;
  }

  void apply_state(const StrategyState& state) override {
    const auto& l = dynamic_cast<const Loaded&>(state);
    NoGradGuard ng;
    for (size_t m = 0; m < sharded_.size(); ++m) {
      for (const auto& [k, v] : l.slices[m]) {
        Tensor leaf = sharded_[m]->shard_params()[k];
        ACCEL_CHECK(leaf.numel() == v.numel(), ValueError, "load_state", "shard of ",
                    sharded_[m]->parameters()[k].first, " holds ", leaf.numel(),
                    " elements, the checkpoint slice ", v.numel());
        if (v.numel() > 0) leaf.detach().copy_(v.reshape({v.numel()}));
      }
      // Replicated tensors are copied in place (trainable ones are released: never touched).
      nn::Module& mod = *models_[m];
      const nn::TensorDict own = replicated_state(mod);
      for (const auto& [name, v] : own) {
        auto it = l.replicated[m].find(name);
        ACCEL_CHECK(it != l.replicated[m].end() && it->second.sizes() == v.sizes(), ValueError,
                    "load_state", "model ", m, ": '", name, "' is missing or of another shape");
        Tensor(v).copy_(it->second);
      }
      sharded_[m]->zero_grad();
      if (l.has_grads)
        for (const auto& [k, g] : l.grads[m]) {
          Tensor p = sharded_[m]->parameters()[k].second;
          p.set_grad(g.to(p.device(), p.dtype()));
        }
      sharded_[m]->refresh_root();
    }
    for (size_t i = 0; i < stepping_.size(); ++i)
      stepping_[i].opt->load_state_dict(l.optimizers[i]);
  }

  // Every rank gathers each unit in turn (collective); rank 0 writes it and drops it. A failure
  // of rank 0's file (bad path, full disk) does not leave the others waiting in a gather: rank 0
  // keeps taking part, and the outcome is agreed on at the end (IoError on every rank).
  void save_model(size_t index, const std::string& path) override {
    FullyShardedModel& f = *sharded_.at(index);
    const nn::TensorDict rep = replicated_state(*models_.at(index));
    std::vector<nn::SafetensorsWriter::Entry> entries;
    for (const auto& [name, shape, dtype] : f.full_parameter_order())
      entries.push_back({name, dtype, shape});
    for (const auto& [name, t] : rep) entries.push_back({name, t.dtype(), t.sizes()});
    std::unique_ptr<nn::SafetensorsWriter> w;
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
        w = std::make_unique<nn::SafetensorsWriter>(path, entries,
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
  nn::TensorDict own_groups(size_t i) const {
    nn::TensorDict own;
    for (auto& [k, v] : stepping_[i].opt->state_dict())
      if (k.rfind("param_groups.", 0) == 0) own[k] = v;
    return own;
  }

  // A checkpoint of another strategy (one process, DDP, ZeRO-1/2): whole parameters and plain
  // per-parameter optimizer state (ZeRO-1/2 shards assembled first), cut into this rank's slices.
  std::unique_ptr<StrategyState> read_plain(const std::string& dir, const nlohmann::json& saved,
                                            int saved_world, bool mid_window) {
    auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
    ACCEL_CHECK(!mid_window, ValueError, "load_state", "checkpoint '", dir,
                "' was saved inside an accumulation window without zero_stage 3; resume it "
                "with the strategy that saved it");
    zero_ckpt::check_record(saved, stepping_.size(), at(kCheckpointStateFile));
    auto out = std::make_unique<Loaded>();
    for (size_t m = 0; m < sharded_.size(); ++m) {
      const std::string f = at(indexed_file("model", m, ".safetensors"));
      nn::TensorDict full = nn::load_safetensors(f);
      std::vector<std::pair<size_t, Tensor>> slices;
      const auto spans = sharded_[m]->spans();
      for (size_t k = 0; k < spans.size(); ++k) {
        auto it = full.find(spans[k].name);
        ACCEL_CHECK(it != full.end() && it->second.sizes() == spans[k].shape, ValueError,
                    "load_state", "'", f, "': parameter '", spans[k].name, "' ",
                    it == full.end() ? std::string("is missing")
                                     : "has shape " + it->second.shape_str() + ", the model " +
                                           shape_str(spans[k].shape));
        slices.emplace_back(
            k, it->second.reshape({-1}).narrow(0, spans[k].lo, spans[k].hi - spans[k].lo));
        full.erase(it);
      }
      out->slices.push_back(std::move(slices));
      out->replicated.push_back(std::move(full));
    }
    for (size_t i = 0; i < stepping_.size(); ++i) {
      const Stepping& s = stepping_[i];
      nn::TensorDict opt = nn::load_safetensors(at(indexed_file("optimizer", i, ".safetensors")));
      if (const nlohmann::json* layout = zero_ckpt::layout_of(saved, i))
        opt = zero_ckpt::read_unsharded_state(dir, i, *layout, saved_world, *s.user, opt,
                                              ctx_.ddp.bucket_cap_bytes);
      // The stepping optimizer's parameter k is the user's parameter k (prepare_optimizer).
      nn::TensorDict d = own_groups(i);
      for (auto& [k, v] : zero_ckpt::param_groups_of(opt))
        if (k.ends_with(".lr") || k.ends_with(".weight_decay")) d[k] = v;
      std::unordered_map<std::string, FullyShardedModel::Span> span_of;
      for (size_t m = 0; m < sharded_.size(); ++m)
        for (auto& sp : sharded_[m]->spans())
          span_of.emplace(std::to_string(m) + ":" + sp.name, sp);
      for (size_t k = 0; k < s.keys.size(); ++k) {
        const FullyShardedModel::Span& sp = span_of.at(s.keys[k]);
        const std::string prefix = "state." + std::to_string(k) + ".";
        for (auto it = opt.lower_bound(prefix); it != opt.end() && it->first.rfind(prefix, 0) == 0;
             ++it) {
          const std::string slot = it->first.substr(prefix.size());
          if (slot == "step") {
            d[it->first] = it->second;
            continue;
          }
          ACCEL_CHECK(it->second.numel() == shape_numel(sp.shape), ValueError, "load_state",
                      "optimizer ", i, ": ", it->first, " has ", it->second.numel(),
                      " elements, parameter '", sp.name, "' ", shape_numel(sp.shape));
          d[it->first] = it->second.reshape({-1}).narrow(0, sp.lo, sp.hi - sp.lo).clone();
        }
      }
      out->optimizers.push_back(std::move(d));
    }
    return out;
  }

  std::string grads_file(size_t i) const {
    return indexed_file("fsdp_grads", i, "") + "_rank" + std::to_string(ctx_.rank) + ".safetensors";
  }

  StrategyContext ctx_;
  FsdpOptions options_;
  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::unique_ptr<FullyShardedModel>> sharded_;
  std::vector<Stepping> stepping_;
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp_strategy(const StrategyContext& ctx) {
  return std::make_unique<FsdpStrategy>(ctx);
}

}  // namespace accel::dist
