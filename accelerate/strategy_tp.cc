// Note [tp strategy]
// With tp_size > 1 the Accelerator's strategy is a TpStrategy around the data-parallel one the
// config names (ddp replicates over the mesh's "dp" group, fsdp shards over dp_shard and
// replicates over dp_replicate; zero1 / zero2 and programs' own strategies are refused with tp):
//  - prepare_model: dist::parallelize(model, tp group, AcceleratorConfig::tp_plan) first, so the
//    model's parameters become this rank's tp shards (ordinary tensors of the local shapes), then
//    the inner strategy wraps that model as it would any other. The ranks of one tp group are in
//    different dp groups, so the inner strategy's collectives never mix tp shards.
//  - backward, step, zero_grad, memory: the inner strategy's.
//  - gradient norms (grads()): the inner strategy names each gradient it returns
//    (StepGrads::names); a gradient held alike by k ranks of the world (a DDP replica over dp, an
//    HSDP replica over dp_replicate, a tp-replicated parameter over tp) gets the weight 1 / k, so
//    that one weighted sum over the world counts every element of the full model once. The
//    weights are 1 / powers of two for meshes of powers of two: exact in binary.
//  - checkpoints (format 2, Note [format-2 strategy seam] in accelerate/strategy.h): the inner
//    strategy's pieces, each placed in its global tensor by this rank's tp part (set_place), so a
//    checkpoint loads at any tp size; format-1 tp checkpoints (tp<t>/ folders) are read as pieces
//    by ckpt::open_legacy (Note [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h).
//  - get_state_dict / save_model: the inner strategy's full (tp-local) state dict, its sharded
//    parameters all-gathered over tp into their full shapes: the file a 1-process run writes.
//    load_model reads each full tensor, keeps this rank's part, and hands that to the inner.
//
#include "accelerate/strategy_tp.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "accelerate/strategy_base.h"
#include "core/env_contract.h"
#include "core/generator.h"
#include "io/safetensors.h"
#include "autograd/ops.h"
#include "parallel/materialize.h"
#include "parallel/replicated_check.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {

// Rank `rank` of `size`'s part of a full tensor.
Tensor part_of(const Tensor& full, const TpShard& s, int rank, int size, const std::string& name,
               const char* op) {
  ACCEL_CHECK(s.dim >= 0 && s.dim < full.dim() && s.chunks >= 1 && s.unit >= 1 &&
                  full.size(s.dim) % (s.chunks * s.unit) == 0,
              ShapeError, op, "parameter '", name, "' of shape ", full.shape_str(),
              " cannot be split along dim ", s.dim, " into ", s.chunks, " block(s) of units of ",
              s.unit, " over ", size, " tp ranks");
  if (size == 1) return full;
  return tp_piece(full, s, rank, size);  // torch.chunk's piece (Note [uneven tp shards])
}

// A folder only this process can use: mkdtemp creates it atomically with a random name and mode
// 0700, and fails rather than reuse anything already there. (Before: a predictable
// /tmp/accel-tp-load-<pid>-<rank>-<n>, removed and re-created by path, which another user could
// squat with a link, and a root job's converted weights could land in a folder someone else owns.)
std::string private_tmp_dir(int rank) {
  std::string tmpl =
      (fs::temp_directory_path() / ("accel-tp-load-" + std::to_string(rank) + "-XXXXXX")).string();
  ACCEL_CHECK(::mkdtemp(tmpl.data()) != nullptr, IoError, "load_state",
              "cannot create a private temporary folder from '", tmpl, "': ", std::strerror(errno));
  return tmpl;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string_view(v) == "1";
}

struct TpState : StrategyState {
  std::unique_ptr<StrategyState> inner;
};

class TpStrategy final : public Strategy, public StrategyCheckpoint {
 public:
  TpStrategy(std::unique_ptr<Strategy> inner, TpStrategyContext c)
      : inner_(std::move(inner)), c_(std::move(c)), T_(c_.tp->size()), t_(c_.tp->rank()) {
    // Note [format-2 strategy seam]: the inner strategy's tensors are this rank's tp parts.
    inner_->checkpoint().set_place([this](size_t m, const std::string& name, const Shape& local) {
      TensorPlace p;
      p.lead = t_ == 0;
      const TpShard* s = nullptr;
      if (m < shards_.size()) {
        const auto it = shards_[m].find(name);
        if (it != shards_[m].end() && size_t(it->second.dim) < local.size()) s = &it->second;
      }
      if (!s) {
        p.region = Region::whole(local);
        p.primary = t_ == 0;
        p.layout = "tp: Replicate";
        return p;
      }
      // The global length along the cut comes from the plan (uneven pieces: not T x the local
      // size; Note [uneven tp shards] in parallel/tensor_parallel.cc), cut in whole units.
      Shape full = local;
      full[size_t(s->dim)] = s->full > 0 ? s->full : local[size_t(s->dim)] * T_;
      p.region = Region::whole(full).shard(s->dim, s->chunks, T_, t_, s->unit);
      ACCEL_CHECK(p.region.local_shape() == local, ValueError, "checkpoint", "the tp piece of '",
                  name, "' has shape ", local, ", its cut of ", full, " over tp ", T_, " gives ",
                  p.region.local_shape());
      p.primary = true;
      p.layout = "tp: " + Placement::shard(s->dim, s->chunks, s->unit).str();
      return p;
    });
  }

  std::string_view name() const override { return inner_->name(); }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    ACCEL_CHECK(!c_.plan.empty(), ValueError, "prepare", "tp_size ", T_,
                " splits every prepared model over its tp group, but AcceleratorConfig::tp_plan "
                "is empty: give the module-name patterns and their styles "
                "(parallel/tensor_parallel.h; models::gpt_tp_plan() for examples/models.h's Gpt)");
    {
      // Every rank of the tp group cuts its shards from the same full values: tp rank 0's, as
      // DDP starts every replica from rank 0's (a model built with another seed on some rank
      // would otherwise be a mix of several initialisations).
      NoGradGuard ng;
      for (auto& [name, p] : model->named_parameters()) {
        // A deferred parameter has no value yet: every rank materialises its own piece from the
        // same replayed generator (Note [deferred parts] in nn/module.cc).
        if (nn::is_deferred(p)) continue;
        Tensor t = p.contiguous();
        c_.tp->broadcast(t, 0);
        if (!t.is_same(p)) p.copy_(t);
      }
    }
    if (nn::is_deferred(*model)) check_deferred_seeds(*model);
    parallelize(model, c_.tp, c_.plan);
    shards_.push_back(tp_shards(*model));
    same_local_shapes_ = same_local_shapes_ && local_shapes_agree(*model);
    // A deferred model: ZeRO-3 materialises it unit by unit (each module's tp piece, then its
    // shard of that); DDP needs it whole here (each rank's tp pieces, one module at a time).
    if (inner_->name() != "fsdp" && nn::is_deferred(*model)) dist::materialize_local(*model);
    inner_->prepare_model(model);
    models_.push_back(model);
  }
  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override {
    return inner_->prepare_optimizer(user);
  }
  DistributedDataParallel* ddp(const nn::Module& m) const override { return inner_->ddp(m); }
  void backward(const Tensor& loss, bool sync) override { inner_->backward(loss, sync); }
  void set_sync(bool sync) override { inner_->set_sync(sync); }
  void after_step(optim::Optimizer& stepping, bool stepped) override {
    inner_->after_step(stepping, stepped);
  }
  void zero_grad(optim::Optimizer& stepping, bool set_to_none) override {
    inner_->zero_grad(stepping, set_to_none);
  }
  StrategyMemory memory() const override { return inner_->memory(); }
  StrategyCheckpoint& checkpoint() override { return *this; }

  // Note [tp strategy]: weights 1 / (ranks holding the same gradient).
  StepGrads grads(const optim::Optimizer& stepping) override {
    StepGrads g = inner_->grads(stepping);
    ACCEL_CHECK(g.names.size() == g.params.size(), ValueError, "clip_grad_norm_", "strategy '",
                name(), "' does not name its gradients, which tensor parallelism needs");
    const int shard = g.sharded && g.shard_group ? g.shard_group->size() : 1;
    const double holders = g.sharded ? double(c_.dp_size / shard) : double(c_.dp_size);
    g.norm_weights.assign(g.params.size(), 1.0);
    // Under a sharding inner strategy the tp peers' spans of a replicated gradient are equal
    // only when their local shapes are (uneven tp shards move the flat offsets: not compared).
    const bool comparable = !g.sharded || same_local_shapes_;
    const bool check_replicated = comparable && (!replicated_checked_ || check_every_step_);
    std::vector<std::string> replicated_names;
    std::vector<Tensor> replicated_grads;
    for (size_t k = 0; k < g.params.size(); ++k) {
      const std::string& key = g.names[k];
      const size_t colon = key.find(':');
      const size_t m = std::stoul(key.substr(0, colon));
      const bool sharded = m < shards_.size() && shards_[m].count(key.substr(colon + 1)) != 0;
      g.norm_weights[k] = 1.0 / (holders * (sharded ? 1.0 : double(T_)));
      if (!sharded && check_replicated) {
        replicated_names.push_back(key.substr(colon + 1));
        replicated_grads.push_back(g.params[k].grad());
      }
    }
    // Note [replicated gradient check]: the tp-replicated gradients must be equal over tp (under
    // ZeRO-3 the tp peers hold the same flat span of each: their units' layouts are equal).
    if (check_replicated) {
      dist::check_replicated_grads(replicated_names, replicated_grads, *c_.tp, "tp",
                                   c_.world.get());
      replicated_checked_ = true;
    }
    g.sharded = true;
    g.shard_group = c_.world;
    return g;
  }

  // ---- checkpoints ----
  void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank) override {
    inner_->checkpoint().state_entries(out, mid_window, world_rank);
  }
  std::unique_ptr<StrategyState> read_pieces(ckpt::CheckpointSource& src, bool mid_window,
                                             int world_rank) override {
    auto st = std::make_unique<TpState>();
    st->inner = inner_->checkpoint().read_pieces(src, mid_window, world_rank);
    return st;
  }

  void apply_state(StrategyState& state) override {
    auto* st = dynamic_cast<TpState*>(&state);
    ACCEL_CHECK(st != nullptr && st->inner, ValueError, "load_state",
                "a state read by another strategy or accelerator");
    inner_->checkpoint().apply_state(*st->inner);
  }
  void finish_load() override { inner_->checkpoint().finish_load(); }

  io::TensorDict full_state_dict(size_t index) override {
    io::TensorDict d = inner_->checkpoint().full_state_dict(index);
    NoGradGuard ng;
    for (auto& [name, t] : d) {
      const auto it = shards_.at(index).find(name);
      if (it == shards_[index].end()) continue;
      t = tp_gather(t.contiguous(), it->second, c_.tp).contiguous();  // uneven pieces padded
    }
    return d;
  }

  void save_model(size_t index, const std::string& path) override {
    const io::TensorDict d = full_state_dict(index);
    if (c_.world_rank == 0) io::save_safetensors(path, d);
  }

  void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                  std::exception_ptr& err) override {
    // This rank's part of every entry the file holds, as a file the inner strategy reads; on an
    // error an empty one, so that the inner strategy's collectives still run and no peer waits.
    const std::string tmp = private_tmp_dir(c_.world_rank);
    const std::string f = (fs::path(tmp) / "model.safetensors").string();
    io::TensorDict out;
    try {
      for (const auto& [name, t] : models_.at(index)->state_dict()) {
        if (!src.contains(name)) continue;
        const io::SafetensorsFile::Info& in = src.info(name);
        Tensor whole = empty(in.shape, TensorOptions(in.dtype));
        src.read_range(name, 0, in.numel, whole);
        const auto it = shards_[index].find(name);
        out[name] = it == shards_[index].end()
                        ? whole
                        : part_of(whole, it->second, t_, T_, name, "load_model");
      }
    } catch (...) {
      if (!err) err = std::current_exception();
      out.clear();
    }
    try {
      io::save_safetensors(f, out);
      const io::SafetensorsCheckpoint local(f);
      inner_->checkpoint().load_model(index, local, err);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }

  // The full shape of prepared model `index`'s entry `name` whose local shape is `local`.
  Shape full_shape(size_t index, const std::string& name, const Shape& local) const override {
    Shape out = local;
    if (index >= shards_.size()) return out;
    const auto it = shards_[index].find(name);
    if (it != shards_[index].end() && size_t(it->second.dim) < out.size())
      out[size_t(it->second.dim)] = it->second.full;  // uneven pieces: not T x the local size
    return out;
  }

 private:
  std::unique_ptr<Strategy> inner_;
  TpStrategyContext c_;
  int T_ = 1, t_ = 0;
  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::map<std::string, TpShard>> shards_;
  // Note [replicated gradient check]: at the first step, or every step when asked.
  bool replicated_checked_ = false;
  bool same_local_shapes_ = true;  // every tp peer holds parameters of the same shapes

  // A deferred model's pieces are drawn on each rank from its own generator (no broadcast): the
  // tp peers must have built it from one state, or the pieces would be of different models. The
  // default generator's state after construction stands for the construction's: one MIN / MAX
  // all-reduce over tp of a hash of it; a ValueError on every rank otherwise.
  void check_deferred_seeds(nn::Module& model) const {
    if (T_ == 1) return;
    Device dev = kCPU;
    for (const Tensor& p : model.parameters()) dev = p.device();
    std::string state;
    {
      Generator& gen = default_generator();
      std::lock_guard<std::mutex> lk(gen.mutex());
      state = gen.state();
    }
    const double h = double(std::hash<std::string>{}(state) >> 11);  // exact in a double
    Tensor lo = full({1}, h, TensorOptions(kFloat64, dev)), hi = lo.clone();
    c_.tp->all_reduce(lo, ReduceOp::Min);
    c_.tp->all_reduce(hi, ReduceOp::Max);
    ACCEL_CHECK(lo.item<double>() == hi.item<double>(), ValueError, "prepare",
                "a model built under nn::DeferredInit is materialised piece by piece on each tp "
                "rank from its own default generator, but the tp ranks' generators differ after "
                "construction: seed every rank alike before building it (manual_seed or "
                "Accelerator::set_seed without device_specific)");
  }

  // Whether the tp peers' parameters have the same local shapes (uneven tp shards: not). One
  // MIN / MAX all-reduce over tp of a fingerprint of the shapes, at prepare.
  bool local_shapes_agree(nn::Module& model) const {
    if (T_ == 1) return true;
    double h = 0;
    int64_t i = 0;
    Device dev = kCPU;
    for (const Tensor& p : model.parameters()) {
      h += double(p.numel()) * double(++i % 1021 + 1);
      dev = p.device();
    }
    Tensor lo = full({1}, h, TensorOptions(kFloat64, dev)), hi = lo.clone();
    c_.tp->all_reduce(lo, ReduceOp::Min);
    c_.tp->all_reduce(hi, ReduceOp::Max);
    return lo.item<double>() == hi.item<double>();
  }
  const bool check_every_step_ = env_flag(env::kVerifyPlacements);
};

}  // namespace

std::unique_ptr<Strategy> make_tp_strategy(std::unique_ptr<Strategy> inner, TpStrategyContext ctx) {
  return std::make_unique<TpStrategy>(std::move(inner), std::move(ctx));
}

}  // namespace accel::dist
