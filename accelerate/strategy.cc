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
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"

namespace accel::dist {

namespace {

int64_t state_bytes(const optim::Optimizer& o) {
  int64_t n = 0;
  for (auto& [key, t] : o.state_dict())
    if (key.rfind("state.", 0) == 0 && t.defined()) n += int64_t(t.nbytes());
  return n;
}

// One process: everything local, the user's optimizer steps itself.
class NoStrategy final : public ReplicatedStrategy {
 public:
  bool takes_partial_backwards() const override { return true; }  // nothing to sync
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

// ---- checkpoints (format 2: accelerate/strategy_pieces.cc) ----

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
// Every rank holds the whole model, so read_pieces reads the whole model (in the parameters'
// dtypes) and, under ZeRO, only its slices of the optimizer state. apply_state swaps the values
// with the parameters (a bounded buffer) and hands the optimizer its new state without a copy;
// the replaced values stay in the state for a rollback. The peak is the training state plus one
// copy of the parameters.
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
