// make_strategy, NoStrategy, and what the strategies share (dist/strategy_base.h).
#include "dist/strategy.h"

#include <filesystem>
#include <optional>

#include "autograd/nn/safetensors.h"
#include "core/error.h"
#include "dist/checkpoint.h"
#include "dist/fsdp.h"
#include "dist/fsdp_checkpoint.h"
#include "dist/strategy_base.h"
#include "dist/zero_checkpoint.h"

namespace accel::dist {

namespace fs = std::filesystem;

// Defined in dist/strategy_ddp.cc and dist/strategy_zero.cc.
std::unique_ptr<Strategy> make_ddp_strategy(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_zero_strategy(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_fsdp_strategy(const StrategyContext& ctx);  // strategy_fsdp.cc

namespace {

std::string indexed(const char* stem, size_t i, const char* ext) {
  return i == 0 ? std::string(stem) + ext : std::string(stem) + "_" + std::to_string(i) + ext;
}
std::string grads_file(size_t model, int rank) {
  return (model == 0 ? std::string("grads") : "grads_" + std::to_string(model)) + "_rank" +
         std::to_string(rank) + ".safetensors";
}

int64_t state_bytes(const optim::Optimizer& o) {
  int64_t n = 0;
  for (auto& [key, t] : o.state_dict())
    if (key.rfind("state.", 0) == 0 && t.defined()) n += int64_t(t.nbytes());
  return n;
}

// One process: everything local, the user's optimizer steps itself.
class NoStrategy final : public ReplicatedStrategy {
 public:
  using ReplicatedStrategy::ReplicatedStrategy;
  std::string_view name() const override { return "none"; }
  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    models_.push_back(model);
  }
  void backward(const Tensor& loss, bool) override { loss.backward(); }
  void after_step(optim::Optimizer&, bool) override {}
};

}  // namespace

std::unique_ptr<Strategy> make_strategy(const StrategyContext& ctx) {
  ACCEL_CHECK(ctx.world_size == 1 || ctx.group != nullptr, DistError, "strategy", "world size ",
              ctx.world_size, " without a process group");
  // Note [one process under ZeRO]: one process needs no strategy, unless the ZeRO options change
  // what the step computes (16-bit compute parameters, per-unit activation checkpointing): then
  // the strategy runs on a group of one, so the program computes the same at any world size.
  const bool changes_compute =
      (ctx.zero_stage == 1 || ctx.zero_stage == 2) ? ctx.zero.param_dtype.has_value()
      : ctx.zero_stage == 3
          ? ctx.fsdp && (ctx.fsdp->param_dtype || ctx.fsdp->activation_checkpointing)
          : false;
  if (ctx.world_size == 1 && !changes_compute) return std::make_unique<NoStrategy>(ctx);
  StrategyContext c = ctx;
  if (!c.group) c.group = new_gloo_group(std::make_shared<MemoryStore>(), 0, 1);
  switch (c.zero_stage) {
    case 0: return make_ddp_strategy(c);
    case 1:
    case 2: return make_zero_strategy(c);
    case 3: return make_fsdp_strategy(c);
  }
  ACCEL_THROW(ValueError, "strategy", "zero_stage must be in 0..3, got ", ctx.zero_stage);
}

// ---------------------------------------------------------------------------------------------
// ReplicatedStrategy

ReplicatedStrategy::ReplicatedStrategy(const StrategyContext& ctx) : ctx_(ctx) {}
ReplicatedStrategy::~ReplicatedStrategy() = default;

std::shared_ptr<optim::Optimizer> ReplicatedStrategy::prepare_optimizer(
    const std::shared_ptr<optim::Optimizer>& user) {
  auto s = std::make_unique<Slot>();
  s->user = user;
  s->stepping = user;
  slots_.push_back(std::move(s));
  return user;
}

ReplicatedStrategy::Slot& ReplicatedStrategy::slot_of(const optim::Optimizer& stepping) {
  for (auto& s : slots_)
    if (s->stepping.get() == &stepping || s->user.get() == &stepping) return *s;
  ACCEL_THROW(ValueError, "strategy", "an optimizer that was not prepared by this accelerator");
}

StepGrads ReplicatedStrategy::grads(const optim::Optimizer& stepping) {
  StepGrads out;
  for (size_t g = 0; g < stepping.num_param_groups(); ++g)
    for (const Tensor& p : stepping.params(g)) out.params.push_back(p);
  return out;
}

void ReplicatedStrategy::zero_grad(optim::Optimizer& stepping, bool set_to_none) {
  stepping.zero_grad(set_to_none);
}

StrategyMemory ReplicatedStrategy::memory() const {
  StrategyMemory m;
  bool zero = false;
  for (auto& s : slots_) {
    if (!s->zero) continue;
    zero = true;
    const ZeroMemory z = s->zero->memory();
    m.param_bytes += z.param_bytes;
    m.grad_bytes += z.grad_bytes;
    m.optimizer_bytes += z.optimizer_bytes;
    m.gathered_param_bytes += z.gathered_param_bytes;
    m.full_param_bytes += z.full_param_bytes;
    for (auto& a : s->accum) m.grad_bytes += int64_t(a.nbytes());
  }
  if (zero) return m;
  for (auto& model : models_)
    for (auto& p : model->parameters()) {
      m.param_bytes += int64_t(p.nbytes());
      if (p.grad().defined()) m.grad_bytes += int64_t(p.grad().nbytes());
    }
  m.full_param_bytes = m.param_bytes;
  for (auto& s : slots_) m.optimizer_bytes += state_bytes(*s->stepping);
  return m;
}

void ReplicatedStrategy::gather_all() {
  for (auto& s : slots_)
    if (s->zero) s->zero->gather_parameters();
}

void ReplicatedStrategy::broadcast_in_place(const Tensor& t) const {
  if (ctx_.group) dist::broadcast_in_place(*ctx_.group, t, 0);
}

void ReplicatedStrategy::broadcast_frozen(const nn::Module& model, bool buffers) const {
  if (ctx_.world_size <= 1) return;
  NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters())
    if (!p.requires_grad()) broadcast_in_place(p);
  if (buffers)
    for (auto& [name, b] : model.named_buffers()) broadcast_in_place(b);
}

// ---- checkpoints: full models from rank 0, optimizer state plain or in ZeRO shards
// (Note [zero checkpoints] in dist/zero_checkpoint.h) ----

nlohmann::json ReplicatedStrategy::save_state(const std::string& dir, bool mid_window) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  gather_all();
  if (ctx_.rank == 0) {
    for (size_t i = 0; i < models_.size(); ++i)
      nn::save_safetensors(at(indexed("model", i, ".safetensors")), models_[i]->state_dict());
    for (size_t i = 0; i < slots_.size(); ++i)
      nn::save_safetensors(at(indexed("optimizer", i, ".safetensors")),
                           slots_[i]->user->state_dict());
  }
  nlohmann::json zero = nlohmann::json::array();
  bool any_zero = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    if (!s.zero) {
      zero.push_back(nullptr);
      continue;
    }
    any_zero = true;
    const std::string f = at(zero_ckpt::shard_file(i, ctx_.rank));
    nn::save_safetensors(f, s.zero->shard_state_dict());
    fsync_path(f);
    zero_ckpt::write_accum(dir, i, ctx_.rank, s.accum);
    zero.push_back(zero_ckpt::layout(*s.zero));
  }
  // Saved inside an accumulation window the local gradients are state too (they are not
  // synced yet, so every rank keeps its own).
  if (mid_window) {
    for (size_t i = 0; i < models_.size(); ++i) {
      nn::TensorDict grads;
      for (auto& [pname, p] : models_[i]->named_parameters())
        if (p.grad().defined()) grads[pname] = p.grad();
      nn::save_safetensors(at(grads_file(i, ctx_.rank)), grads);
    }
  }
  nlohmann::json record = nlohmann::json::object();
  if (any_zero) record["zero"] = zero;
  return record;
}

std::unique_ptr<StrategyState> ReplicatedStrategy::read_state(const std::string& dir,
                                                              const nlohmann::json& saved,
                                                              int saved_world, bool mid_window) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  zero_ckpt::check_record(saved, slots_.size(), at(kCheckpointStateFile));
  gather_all();  // stage 3: the full shapes
  auto st = std::make_unique<ReplicatedState>();
  // A ZeRO-3 checkpoint (Note [fsdp checkpoints]) is read as a plain one: whole parameters and
  // per-parameter optimizer state, assembled from the ranks' slices.
  std::optional<PlainState> fsdp;
  if (saved.is_object() && saved.contains("fsdp")) {
    ACCEL_CHECK(!mid_window, ValueError, "load_state", "checkpoint '", dir,
                "' was saved by zero_stage 3 inside an accumulation window; its unsharded window "
                "gradients only resume under zero_stage 3 with ",
                saved_world, " processes");
    std::vector<const optim::Optimizer*> users;
    for (auto& s : slots_) users.push_back(s->user.get());
    fsdp = read_fsdp_as_plain(dir, saved.at("fsdp"), models_, users);
  }
  for (size_t i = 0; i < models_.size(); ++i)
    st->models.push_back(fsdp ? fsdp->models.at(i)
                              : nn::load_safetensors(at(indexed("model", i, ".safetensors"))));
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    nn::TensorDict opt = fsdp ? fsdp->optimizers.at(i)
                              : nn::load_safetensors(at(indexed("optimizer", i, ".safetensors")));
    const nlohmann::json* layout = fsdp ? nullptr : zero_ckpt::layout_of(saved, i);
    if (s.zero) {
      st->shards.push_back(
          zero_ckpt::read_shard_state(dir, i, layout, saved_world, opt, *s.zero, ctx_.rank));
      st->optimizers.push_back(zero_ckpt::param_groups_of(opt));  // the schedulers' lr
      st->accum.push_back(mid_window ? zero_ckpt::read_accum(dir, i, ctx_.rank, *s.zero)
                                     : std::vector<Tensor>{});
    } else {
      // A ZeRO checkpoint into a plain optimizer: cut the flat buffers into per-parameter state.
      st->optimizers.push_back(layout ? zero_ckpt::read_unsharded_state(dir, i, *layout,
                                                                        saved_world, *s.user, opt,
                                                                        ctx_.ddp.bucket_cap_bytes)
                                      : std::move(opt));
      st->shards.emplace_back();
      st->accum.emplace_back();
    }
  }
  st->grads.resize(models_.size());
  for (size_t i = 0; i < models_.size() && mid_window; ++i) {
    const std::string f = at(grads_file(i, ctx_.rank));
    nn::TensorDict grads = nn::load_safetensors(f);
    for (auto& [pname, p] : models_[i]->named_parameters()) {
      auto it = grads.find(pname);
      if (it == grads.end()) continue;
      ACCEL_CHECK(it->second.sizes() == p.sizes(), ShapeError, "load_state", "'", f,
                  "': gradient of ", pname, " has shape ", it->second.shape_str(), ", parameter ",
                  p.shape_str());
      st->grads[i].emplace_back(p, it->second.to(p.device(), p.dtype()));
    }
  }
  return st;
}

std::unique_ptr<StrategyState> ReplicatedStrategy::snapshot() {
  gather_all();
  auto st = std::make_unique<ReplicatedState>();
  NoGradGuard ng;
  for (auto& m : models_) {
    nn::TensorDict d = m->state_dict();
    for (auto& [k, v] : d) v = v.clone();  // loads copy into parameters in place
    st->models.push_back(std::move(d));
    std::vector<std::pair<Tensor, Tensor>> g;
    for (auto& [pname, p] : m->named_parameters()) g.emplace_back(p, p.grad());
    st->grads.push_back(std::move(g));
  }
  for (auto& s : slots_) {
    st->optimizers.push_back(s->user->state_dict());
    st->shards.push_back(s->zero ? s->zero->shard_state_dict() : nn::TensorDict{});
    st->accum.push_back(s->accum);
  }
  return st;
}

void ReplicatedStrategy::apply_state(const StrategyState& state) {
  const auto* st = dynamic_cast<const ReplicatedState*>(&state);
  ACCEL_CHECK(st != nullptr && st->models.size() == models_.size() &&
                  st->optimizers.size() == slots_.size(),
              ValueError, "load_state", "a state read by another strategy or accelerator");
  gather_all();
  for (size_t i = 0; i < models_.size(); ++i) models_[i]->load_state_dict(st->models[i]);
  // Stage 3 keeps the truth in its parameter slices: refresh them from what was just loaded.
  for (auto& s : slots_)
    if (s->zero) s->zero->reload_shards_from_parameters();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    s.user->load_state_dict(st->optimizers[i]);
    if (s.zero) s.zero->load_shard_state_dict(st->shards[i]);
    s.accum = st->accum[i];
  }
  NoGradGuard ng;
  for (size_t i = 0; i < models_.size(); ++i) {
    models_[i]->zero_grad(true);
    for (const auto& [p, g] : st->grads[i]) Tensor(p).set_grad(g);
  }
}

nn::TensorDict ReplicatedStrategy::full_state_dict(size_t index) {
  ACCEL_CHECK(index < models_.size(), IndexError, "get_state_dict", "model ", index, " of ",
              models_.size(), " prepared");
  gather_all();
  nn::TensorDict d = models_[index]->state_dict();
  for (auto& [k, v] : d) v = v.clone();
  return d;
}

void ReplicatedStrategy::save_model(size_t index, const std::string& path) {
  ACCEL_CHECK(index < models_.size(), IndexError, "save_model", "model ", index, " of ",
              models_.size(), " prepared");
  gather_all();
  if (ctx_.rank == 0) nn::save_safetensors(path, models_[index]->state_dict());
}

}  // namespace accel::dist
