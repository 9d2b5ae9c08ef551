// make_strategy, NoStrategy, and what the strategies share (accelerate/strategy_base.h).
#include "accelerate/strategy.h"

#include <filesystem>
#include <optional>
#include <sstream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "io/safetensors.h"
#include "core/error.h"
#include "accelerate/checkpoint.h"
#include "parallel/fsdp.h"
#include "parallel/fsdp_checkpoint.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"
#include "parallel/zero_checkpoint.h"

namespace accel::dist {

namespace fs = std::filesystem;

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

const StrategyRegistration kNone([] {
  StrategySpec s;
  s.name = "none";
  s.make = [](const StrategyContext& ctx) { return std::make_unique<NoStrategy>(ctx); };
  return s;
}());

}  // namespace

std::unique_ptr<Strategy> make_strategy(const StrategySpec& spec, StrategyContext ctx) {
  ACCEL_CHECK(ctx.world_size == 1 || ctx.group != nullptr, DistError, "strategy", "world size ",
              ctx.world_size, " without a process group");
  // Note [one process under ZeRO]: one process needs no strategy, unless the strategy changes
  // what the step computes (ZeRO's 16-bit compute parameters, ZeRO-3's per-unit activation
  // checkpointing: runs_alone): then it runs on a group of one, so the program computes the same
  // at any world size.
  if (ctx.world_size == 1 && !(spec.runs_alone && spec.runs_alone(ctx)))
    return std::make_unique<NoStrategy>(ctx);
  if (!ctx.group) ctx.group = new_gloo_group(std::make_shared<MemoryStore>(), 0, 1);
  return spec.make(ctx);
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
  // The optimizer steps the models' own parameters (not ZeRO shards): name them.
  if (grad_names_models_ != models_.size()) {
    grad_names_.clear();
    for (size_t m = 0; m < models_.size(); ++m)
      for (auto& [name, p] : models_[m]->named_parameters())
        grad_names_.emplace(p.impl(), std::to_string(m) + ":" + name);
    grad_names_models_ = models_.size();
  }
  out.names = name_grads(out.params, grad_names_);
  return out;
}

std::vector<std::string> name_grads(const std::vector<Tensor>& params,
                                    const std::map<const void*, std::string>& name_of) {
  std::vector<std::string> names;
  for (const Tensor& p : params) {
    auto it = name_of.find(p.impl());
    if (it == name_of.end()) return {};
    names.push_back(it->second);
  }
  return names;
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
// (Note [zero checkpoints] in parallel/zero_checkpoint.h) ----

nlohmann::json ReplicatedStrategy::save_state(const std::string& dir, bool mid_window) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  if (ctx_.rank == 0) {
    for (size_t i = 0; i < models_.size(); ++i)
      io::save_safetensors(at(indexed("model", i, ".safetensors")), models_[i]->state_dict());
    for (size_t i = 0; i < slots_.size(); ++i)
      io::save_safetensors(at(indexed("optimizer", i, ".safetensors")),
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
    // Note [hsdp checkpoints] in accelerate/strategy_fsdp.cc: one copy of each shard, from the
    // first replica, named by the shard-group rank.
    if (!ctx_.hsdp() || ctx_.dp_replicate->rank() == 0) {
      const std::string f = at(zero_ckpt::shard_file(i, shard_rank()));
      io::save_safetensors(f, s.zero->shard_state_dict());
      fsync_path(f);
    }
    zero_ckpt::write_accum(dir, i, ctx_.rank, s.accum);
    zero.push_back(zero_ckpt::layout(*s.zero));
  }
  // Saved inside an accumulation window the local gradients are state too (they are not
  // synced yet, so every rank keeps its own).
  if (mid_window) {
    for (size_t i = 0; i < models_.size(); ++i) {
      io::TensorDict grads;
      for (auto& [pname, p] : models_[i]->named_parameters())
        if (p.grad().defined()) grads[pname] = p.grad();
      io::save_safetensors(at(grads_file(i, ctx_.rank)), grads);
    }
  }
  nlohmann::json record = nlohmann::json::object();
  if (any_zero) record["zero"] = zero;
  if (any_zero && ctx_.hsdp()) record["zero_world"] = ctx_.shard_group()->size();
  return record;
}

void swap_values(const Tensor& a, const Tensor& b) {
  NoGradGuard ng;
  ACCEL_CHECK(a.sizes() == b.sizes() && a.dtype() == b.dtype(), ValueError, "load_state",
              "cannot swap ", a.shape_str(), " ", a.dtype(), " with ", b.shape_str(), " ",
              b.dtype());
  if (!a.is_contiguous() || !b.is_contiguous()) {
    Tensor tmp = a.clone(), x = a, y = b;
    x.copy_(y);
    y.copy_(tmp);
    return;
  }
  constexpr int64_t kChunk = int64_t(1) << 16;  // 256 KiB of float32: a transient, not a copy
  Tensor fa = a.view({a.numel()}), fb = b.view({b.numel()});
  Tensor tmp;
  for (int64_t i = 0; i < fa.numel(); i += kChunk) {
    const int64_t n = std::min(kChunk, fa.numel() - i);
    Tensor x = fa.narrow(0, i, n), y = fb.narrow(0, i, n);
    if (!tmp.defined())
      tmp = empty({std::min(kChunk, fa.numel())}, TensorOptions(a.dtype(), a.device()));
    Tensor t = tmp.narrow(0, 0, n);
    t.copy_(x);
    x.copy_(y);
    y.copy_(t);
  }
}

DType load_dtype(DType saved, DType live) {
  if (saved == live) return live;
  if (is_floating(saved) && is_floating(live) && dtype_size(live) > dtype_size(saved)) return live;
  return saved;
}

void release_unused_memory() {
  if (Allocator* a = get_allocator(kCPU)) a->empty_cache();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

namespace {

// A model's state from a plain model file, each tensor in the dtype and on the device of the
// model's own when the shapes agree and no precision is lost (as saved otherwise: apply_state
// converts, or names the mismatch).
io::TensorDict read_model_file(const std::string& path, const nn::Module& model) {
  io::SafetensorsFile f(path);
  const io::TensorDict own = model.state_handles();
  io::TensorDict out;
  for (const std::string& name : f.names()) {
    const io::SafetensorsFile::Info& in = f.info(name);
    auto it = own.find(name);
    Tensor t = it != own.end() && it->second.sizes() == in.shape
                   ? empty(in.shape, TensorOptions(load_dtype(in.dtype, it->second.dtype()),
                                                   it->second.device()))
                   : empty(in.shape, TensorOptions(in.dtype));
    f.read_range(name, 0, in.numel, t);
    out[name] = t;
  }
  return out;
}

// A plain optimizer's state dict from its file, each slot in its parameter's dtype and device
// (so the optimizer adopts it without a copy) when the shapes agree.
io::TensorDict read_optimizer_file(const io::SafetensorsFile& f, const optim::Optimizer& opt) {
  std::vector<Tensor> params;
  for (size_t g = 0; g < opt.num_param_groups(); ++g)
    for (const Tensor& p : opt.params(g)) params.push_back(p);
  io::TensorDict out;
  for (const std::string& name : f.names()) {
    const io::SafetensorsFile::Info& in = f.info(name);
    Tensor t = empty(in.shape, TensorOptions(in.dtype));
    if (name.rfind("state.", 0) == 0 && is_floating(in.dtype)) {
      const size_t dot = name.find('.', 6);
      const std::string k = name.substr(6, dot == std::string::npos ? 0 : dot - 6);
      if (!k.empty() && k.size() < 10 && k.find_first_not_of("0123456789") == std::string::npos) {
        const size_t i = size_t(std::stoul(k));
        if (i < params.size() && params[i].sizes() == in.shape)
          t = empty(in.shape,
                    TensorOptions(load_dtype(in.dtype, params[i].dtype()), params[i].device()));
      }
    }
    f.read_range(name, 0, in.numel, t);
    out[name] = t;
  }
  return out;
}

// Module::load_state_dict's strict checks, without loading: ValueError listing every missing,
// unexpected or mis-shaped entry.
void check_model_state(const nn::Module& model, const io::TensorDict& own,
                       const io::TensorDict& state) {
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [n, t] : own) {
    auto it = state.find(n);
    if (it == state.end() || !it->second.defined()) {
      missing.push_back(n);
    } else if (it->second.sizes() != t.sizes()) {
      mismatched.push_back(n + ": checkpoint " + it->second.shape_str() + ", model " +
                           t.shape_str());
    }
  }
  for (const auto& [n, t] : state)
    if (!own.count(n)) unexpected.push_back(n);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::ostringstream os;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    os << "; " << what << " (" << keys.size() << "): ";
    for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << keys[i];
  };
  list("missing keys", missing);
  list("unexpected keys", unexpected);
  list("shape mismatch", mismatched);
  ACCEL_THROW(ValueError, "load_state", "error(s) loading state into ", model.type_name(),
              os.str());
}

}  // namespace

// Note [replicated loading memory]
// Every rank holds the whole model, so it reads the whole model file (in the parameters' dtypes)
// and, under ZeRO, only its slices of the optimizer state (by range, from the shard files or the
// plain optimizer file). apply_state swaps the values with the parameters (a bounded buffer) and
// hands the optimizer its new state without a copy; the replaced values stay in the state for a
// rollback. The peak is the training state plus one copy of the parameters.
std::unique_ptr<StrategyState> ReplicatedStrategy::read_state(const std::string& dir,
                                                              const nlohmann::json& saved,
                                                              int saved_world, bool mid_window) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  const int zero_world = zero_ckpt::shard_world(saved, saved_world, at(kCheckpointStateFile));
  const zero_ckpt::Layouts layouts =
      zero_ckpt::read_layouts(saved, slots_.size(), zero_world, at(kCheckpointStateFile));
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
    fsdp = read_fsdp_as_plain(dir, saved.at("fsdp"), saved_world, models_, users);
  }
  for (size_t i = 0; i < models_.size(); ++i)
    st->models.push_back(
        fsdp ? std::move(fsdp->models.at(i))
             : read_model_file(at(indexed("model", i, ".safetensors")), *models_[i]));
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    const ckpt_records::ZeroLayoutRecord* layout =
        (fsdp || i >= layouts.size() || !layouts[i]) ? nullptr : &*layouts[i];
    if (fsdp) {
      io::TensorDict opt = std::move(fsdp->optimizers.at(i));
      if (s.zero) {
        st->shards.push_back(zero_ckpt::read_shard_state(opt, *s.zero, shard_rank()));
        st->optimizers.push_back(zero_ckpt::param_groups_of(opt));
      } else {
        st->optimizers.push_back(std::move(opt));
        st->shards.emplace_back();
      }
      st->accum.emplace_back();
      continue;
    }
    io::SafetensorsFile opt(at(indexed("optimizer", i, ".safetensors")));
    if (s.zero) {
      st->shards.push_back(
          zero_ckpt::read_shard_state(dir, i, layout, zero_world, opt, *s.zero, shard_rank()));
      st->optimizers.push_back(zero_ckpt::param_groups_of(opt));  // the schedulers' lr
      st->accum.push_back(mid_window ? zero_ckpt::read_accum(dir, i, ctx_.rank, *s.zero)
                                     : std::vector<Tensor>{});
    } else {
      // A ZeRO checkpoint into a plain optimizer: cut the flat buffers into per-parameter state.
      st->optimizers.push_back(layout
                                   ? zero_ckpt::read_unsharded_state(
                                         dir, i, *layout, zero_world, *s.user,
                                         zero_ckpt::param_groups_of(opt), ctx_.ddp.bucket_cap_bytes)
                                   : read_optimizer_file(opt, *s.user));
      st->shards.emplace_back();
      st->accum.emplace_back();
    }
  }
  st->grads.resize(models_.size());
  for (size_t i = 0; i < models_.size() && mid_window; ++i) {
    const std::string f = at(grads_file(i, ctx_.rank));
    io::SafetensorsFile grads(f);
    for (auto& [pname, p] : models_[i]->named_parameters()) {
      if (!grads.contains(pname)) continue;
      const io::SafetensorsFile::Info& in = grads.info(pname);
      ACCEL_CHECK(in.shape == p.sizes() && is_floating(in.dtype), ShapeError, "load_state", "'", f,
                  "': gradient of ", pname, " is ", in.dtype, " ", shape_str(in.shape),
                  ", parameter ", p.shape_str());
      Tensor g = empty(p.sizes(), TensorOptions(p.dtype(), p.device()));
      grads.read_range(pname, 0, in.numel, g);
      st->grads[i].emplace_back(p, g);
    }
  }
  st->has_grads = mid_window;
  return st;
}

void ReplicatedStrategy::apply_state(StrategyState& state) {
  auto* st = dynamic_cast<ReplicatedState*>(&state);
  ACCEL_CHECK(st != nullptr && st->models.size() == models_.size() &&
                  st->optimizers.size() == slots_.size() && st->shards.size() == slots_.size() &&
                  st->accum.size() == slots_.size() && st->grads.size() == models_.size(),
              ValueError, "load_state", "a state read by another strategy or accelerator");
  NoGradGuard ng;
  // 1. checks (nothing changes when one fails)
  std::vector<io::TensorDict> own;
  for (size_t i = 0; i < models_.size(); ++i) {
    // A tied tensor (Note [tied parameters] in nn/module.cc) is loaded and swapped once,
    // under its first name: the file may hold it under that name, under an alias, or (as our
    // files record it) once with the aliases in its metadata.
    const std::map<std::string, std::string> aliases = models_[i]->tied_aliases();
    io::TensorDict& loaded = st->models[i];
    for (const auto& [alias, first] : aliases) {
      auto a = loaded.find(alias);
      if (a == loaded.end()) continue;
      if (!loaded.count(first)) loaded.emplace(first, a->second);
      loaded.erase(a);
    }
    io::TensorDict o;
    for (auto& [n, t] : models_[i]->state_dict())
      if (!aliases.count(n)) o.emplace(n, t.detach());
    check_model_state(*models_[i], o, st->models[i]);
    for (auto& [n, t] : o) {
      Tensor& v = st->models[i].at(n);
      if (v.dtype() != t.dtype() || v.device() != t.device()) v = v.to(t.device(), t.dtype());
    }
    own.push_back(std::move(o));
  }
  // 2. optimizers: each load is all or nothing; the earlier ones are undone when one fails.
  std::vector<std::pair<io::TensorDict, io::TensorDict>> old;  // (user, shard)
  try {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = *slots_[i];
      old.emplace_back(s.user->state_dict(),
                       s.zero ? s.zero->shard_state_dict() : io::TensorDict{});
      s.user->load_state_dict(std::move(st->optimizers[i]));
      if (s.zero) {
        try {
          s.zero->load_shard_state_dict(std::move(st->shards[i]));
        } catch (...) {
          s.user->load_state_dict(std::move(old.back().first));
          throw;
        }
      }
    }
  } catch (...) {
    for (size_t i = 0; i + 1 < old.size(); ++i) {
      slots_[i]->user->load_state_dict(std::move(old[i].first));
      if (slots_[i]->zero) slots_[i]->zero->load_shard_state_dict(std::move(old[i].second));
    }
    throw;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    st->optimizers[i] = std::move(old[i].first);
    st->shards[i] = std::move(old[i].second);
    std::swap(slots_[i]->accum, st->accum[i]);
  }
  // 3. values (cannot fail after the checks).
  for (size_t i = 0; i < models_.size(); ++i)
    for (auto& [n, t] : own[i]) swap_values(t, st->models[i].at(n));
  for (size_t i = 0; i < models_.size(); ++i) {
    std::vector<std::pair<Tensor, Tensor>> had;
    for (auto& [pname, p] : models_[i]->named_parameters()) had.emplace_back(p, p.grad());
    models_[i]->zero_grad(true);
    if (st->has_grads)
      for (const auto& [p, g] : st->grads[i]) Tensor(p).set_grad(g);
    st->grads[i] = std::move(had);
  }
  st->has_grads = true;
}

io::TensorDict ReplicatedStrategy::full_state_dict(size_t index) {
  ACCEL_CHECK(index < models_.size(), IndexError, "get_state_dict", "model ", index, " of ",
              models_.size(), " prepared");
  io::TensorDict d = models_[index]->state_dict();
  for (auto& [k, v] : d) v = v.clone();
  return d;
}

void read_into(const io::SafetensorsCheckpoint& src, const std::string& name, int64_t lo,
               int64_t hi, const Tensor& dst) {
  NoGradGuard ng;
  if (dst.is_contiguous()) {
    src.read_range(name, lo, hi, dst);
    return;
  }
  Tensor tmp = empty(dst.sizes(), TensorOptions(dst.dtype(), dst.device()));
  src.read_range(name, lo, hi, tmp);
  Tensor d = dst;
  d.copy_(tmp);
}

// Every rank holds the whole model: it reads every tensor whole, into the model's own.
void ReplicatedStrategy::load_model(size_t index, const io::SafetensorsCheckpoint& src,
                                    std::exception_ptr& err) {
  ACCEL_CHECK(index < models_.size(), IndexError, "load_model", "model ", index, " of ",
              models_.size(), " prepared");
  try {
    for (auto& [name, t] : models_[index]->state_handles()) {
      if (!src.contains(name)) continue;
      // A model built under nn::DeferredInit and prepared in one process gets its memory here,
      // as an unprepared one does in Accelerator::load_model.
      if (nn::is_deferred(t)) t.storage()->materialize();
      read_into(src, name, 0, t.numel(), t);
    }
  } catch (...) {
    if (!err) err = std::current_exception();
  }
}

void ReplicatedStrategy::save_model(size_t index, const std::string& path) {
  ACCEL_CHECK(index < models_.size(), IndexError, "save_model", "model ", index, " of ",
              models_.size(), " prepared");
  if (ctx_.rank == 0) io::save_safetensors(path, models_[index]->state_dict());
}

}  // namespace accel::dist
