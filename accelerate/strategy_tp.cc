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
//  - checkpoints: each tp index t writes the inner strategy's files into the sub-folder tp<t>/
//    (its ranks are the inner strategy's world), and state.json records {"tp": {"size": T,
//    "models": [{name: {"dim", "chunks"}} per model: the sharded parameters], "inner": the inner
//    strategy's record}}. Loading at the same tp size reads tp<t>/ with the inner strategy (which
//    re-shards over another dp size); at another tp size (or from / to a run without tp) the
//    checkpoint is converted (Note [tp checkpoint conversion]).
//  - get_state_dict / save_model: the inner strategy's full (tp-local) state dict, its sharded
//    parameters all-gathered over tp into their full shapes: the file a 1-process run writes.
//    load_model reads each full tensor, keeps this rank's part, and hands that to the inner.
//
// Note [tp checkpoint conversion]
// A checkpoint saved at tp size S loads at tp size T != S by rewriting, on each rank, the state
// its tp index needs as a plain 1-process checkpoint in a private temporary folder, which the
// inner strategy then reads as it reads any 1-process checkpoint (re-sharding it over its dp
// group) before the folder is removed:
//   for each state entry of each model (tp-local shapes of this run): its full value, assembled
//   from the S tp sub-folders (each read as its inner strategy wrote it: a plain model file, or a
//   ZeRO-3 reader re-assembling the parameter from its spans), then this rank's part of it;
//   for each optimizer parameter k (same program: same parameter order at every tp size) and
//   slot: the same for slots shaped like their parameter, scalars (step) as they are.
// A parameter (and each of its slots) is held whole only while it is converted, and what is
// written is this rank's tp part of the model and optimizer state (not yet split over dp): the
// peak is that plus one full parameter; nothing is gathered over the network. Not converted:
// ZeRO-1/2 optimizer shards (tp runs refuse those strategies; a ZeRO-1/2 checkpoint of a run
// without tp is refused by name) and the gradients of an open accumulation window.
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
#include "parallel/checkpoint_files.h"
#include "parallel/fsdp_checkpoint.h"
#include "parallel/replicated_check.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {

std::string indexed_name(const char* stem, size_t i, const char* ext) {
  return std::string(stem) + (i == 0 ? "" : "_" + std::to_string(i)) + ext;
}

// The full tensor from the parts of ranks 0..p-1 (rank order) of a shard: the dim holds `chunks`
// blocks, each split over the ranks (a packed [q | k | v] projection: chunks 3).
Tensor assemble(const std::vector<Tensor>& parts, const TpShard& s) {
  if (parts.size() == 1) return parts[0];
  std::vector<Tensor> pieces;  // each part's own block length: uneven tp shards differ
  for (int64_t c = 0; c < s.chunks; ++c)
    for (const Tensor& part : parts) {
      const int64_t n = part.size(s.dim) / s.chunks;
      pieces.push_back(part.narrow(s.dim, c * n, n));
    }
  return cat(pieces, s.dim);
}

// Rank `rank` of `size`'s part of a full tensor (the converse of assemble).
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

// The "tp" record of a state.json (Note [tp strategy]), checked as Note [checkpoint record
// validation] asks: an IoError naming the field for anything a writer of ours cannot have written.
struct TpRecord {
  int size = 1;
  std::vector<std::map<std::string, TpShard>> models;
  nlohmann::json inner = nlohmann::json::object();
};

TpRecord parse_tp_record(const nlohmann::json& saved, int saved_world, size_t num_models,
                         const std::string& file) {
  TpRecord r;
  if (!saved.is_object() || !saved.contains("tp")) return r;
  const nlohmann::json& tp = saved.at("tp");
  auto bad = [&](const std::string& field, const std::string& why) {
    ACCEL_THROW(IoError, "load_state", "'", file, "': tp.", field, " ", why);
  };
  if (!tp.is_object()) bad("", "must be an object");
  if (!tp.contains("size") || !tp["size"].is_number_unsigned()) bad("size", "must be a count");
  const uint64_t size = tp["size"].get<uint64_t>();
  if (size < 1 || size > uint64_t(saved_world) || saved_world % int(size) != 0)
    bad("size",
        std::to_string(size) + " does not divide world_size " + std::to_string(saved_world));
  r.size = int(size);
  if (!tp.contains("inner") || !tp["inner"].is_object()) bad("inner", "must be an object");
  r.inner = tp["inner"];
  if (!tp.contains("models") || !tp["models"].is_array() || tp["models"].size() != num_models)
    bad("models", "must list " + std::to_string(num_models) + " model(s)");
  for (size_t i = 0; i < num_models; ++i) {
    const nlohmann::json& m = tp["models"][i];
    const std::string where = "models[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(where, "must be an object");
    std::map<std::string, TpShard> shards;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const nlohmann::json& s = *it;
      const std::string f = where + "." + it.key();
      if (!s.is_object() || !s.contains("dim") || !s["dim"].is_number_unsigned() ||
          !s.contains("chunks") || !s["chunks"].is_number_unsigned())
        bad(f, "must be {\"dim\": count, \"chunks\": count}");
      const uint64_t dim = s["dim"].get<uint64_t>(), chunks = s["chunks"].get<uint64_t>();
      if (dim >= 64 || chunks < 1 || chunks > 4096) bad(f, "has dim or chunks out of range");
      shards[it.key()] = TpShard{int64_t(dim), int64_t(chunks)};
    }
    r.models.push_back(std::move(shards));
  }
  return r;
}

// `saved` without its "tp" entry, the inner strategy's record in its place.
nlohmann::json inner_record(const nlohmann::json& saved, const TpRecord& r) {
  nlohmann::json out = saved.is_object() ? saved : nlohmann::json::object();
  out.erase("tp");
  for (auto it = r.inner.begin(); it != r.inner.end(); ++it) out[it.key()] = *it;
  return out;
}

std::string tp_dir(const std::string& dir, int t) {
  return (fs::path(dir) / ("tp" + std::to_string(t))).string();
}

// One saved tp index's state, as its inner strategy wrote it (Note [tp checkpoint conversion]).
class SavedPart {
 public:
  SavedPart(std::string dir, const nlohmann::json& inner, int saved_dp) : dir_(std::move(dir)) {
    ACCEL_CHECK(!inner.contains("zero"), ValueError, "load_state", "checkpoint '", dir_,
                "' holds ZeRO-1/2 optimizer shards, which do not convert to another tp size; "
                "load it at its own tp size (or in one process without tp_size) and save again");
    if (inner.contains("fsdp"))
      fsdp_ = std::make_unique<FsdpCheckpointReader>(dir_, inner.at("fsdp"), saved_dp);
  }
  std::string at(const std::string& f) const { return (fs::path(dir_) / f).string(); }

  // The saved (tp-local) value of state entry `name` of model m.
  Tensor entry(size_t m, const std::string& name) {
    if (fsdp_ && fsdp_->has_param(m, name)) return fsdp_->full_param(m, name);
    // Plain checkpoints and the replicated part of ZeRO-3 ones (fsdp_replicated_file) alike.
    io::SafetensorsFile& f = plain(indexed_name("model", m, ".safetensors"));
    ACCEL_CHECK(f.contains(name), IoError, "load_state", "'", f.path(), "' has no '", name, "'");
    const io::SafetensorsFile::Info& in = f.info(name);
    Tensor t = empty(in.shape, TensorOptions(in.dtype));
    f.read_range(name, 0, in.numel, t);
    return t;
  }

  // Optimizer o's slots of parameter k (key "<model>:<name>" for ZeRO-3 files): name -> value.
  std::map<std::string, Tensor> slots(size_t o, size_t k, const std::string& key) {
    std::map<std::string, Tensor> out;
    if (fsdp_) {
      for (const std::string& s : fsdp_->slots(o, key)) {
        if (s == "step") continue;
        const auto colon = key.find(':');
        const Shape shape = fsdp_->shape(std::stoul(key.substr(0, colon)), key.substr(colon + 1));
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        out[s] = fsdp_->slot_range(o, key, s, 0, n).reshape(shape);
      }
      if (!fsdp_->slots(o, key).empty())  // as fsdp_full_optimizer_state writes it
        out["step"] = scalar_tensor(fsdp_->step(o, key), TensorOptions(kInt64));
      return out;
    }
    io::SafetensorsFile& f = plain(indexed_name("optimizer", o, ".safetensors"));
    const std::string prefix = "state." + std::to_string(k) + ".";
    for (const std::string& n : f.names()) {
      if (n.rfind(prefix, 0) != 0) continue;
      const io::SafetensorsFile::Info& in = f.info(n);
      Tensor t = empty(in.shape, TensorOptions(in.dtype));
      f.read_range(n, 0, in.numel, t);
      out[n.substr(prefix.size())] = t;
    }
    return out;
  }

  // Optimizer o's "param_groups.*" entries.
  io::TensorDict param_groups(size_t o) {
    if (fsdp_) return fsdp_->param_groups(o);
    io::SafetensorsFile& f = plain(indexed_name("optimizer", o, ".safetensors"));
    io::TensorDict out;
    for (const std::string& n : f.names()) {
      if (n.rfind("param_groups.", 0) != 0) continue;
      const io::SafetensorsFile::Info& in = f.info(n);
      Tensor t = empty(in.shape, TensorOptions(in.dtype));
      f.read_range(n, 0, in.numel, t);
      out[n] = t;
    }
    return out;
  }

 private:
  io::SafetensorsFile& plain(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end())
      it = files_.emplace(name, std::make_unique<io::SafetensorsFile>(at(name))).first;
    return *it->second;
  }
  std::string dir_;
  std::unique_ptr<FsdpCheckpointReader> fsdp_;
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> files_;
};

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

}  // namespace

bool is_tp_checkpoint(const nlohmann::json& saved) {
  return saved.is_object() && saved.contains("tp");
}

std::string convert_tp_checkpoint(const TpConversion& c) {
  const TpRecord rec = parse_tp_record(c.saved, c.saved_world, c.models.size(),
                                       (fs::path(c.dir) / kCheckpointStateFile).string());
  const nlohmann::json inner = inner_record(c.saved, rec);
  const int S = rec.size, saved_dp = c.saved_world / S;
  std::vector<std::unique_ptr<SavedPart>> parts;
  for (int s = 0; s < S; ++s)
    parts.push_back(
        std::make_unique<SavedPart>(S == 1 ? c.dir : tp_dir(c.dir, s), inner, saved_dp));
  // How the saved run split model m's parameter `name` (null: whole at every saved tp index).
  auto saved_shard = [&](size_t m, const std::string& name) -> const TpShard* {
    if (S == 1 || m >= rec.models.size()) return nullptr;
    const auto it = rec.models[m].find(name);
    return it == rec.models[m].end() ? nullptr : &it->second;
  };
  // The full value of model m's entry `name` from every saved tp index.
  auto full_value = [&](size_t m, const std::string& name) {
    const TpShard* s = saved_shard(m, name);
    if (!s) return parts[0]->entry(m, name);
    std::vector<Tensor> ps;
    for (auto& p : parts) ps.push_back(p->entry(m, name));
    return assemble(ps, *s);
  };
  auto mine = [&](size_t m, const std::string& name, const Tensor& full) {
    const auto it = c.shards[m].find(name);
    return it == c.shards[m].end() ? full
                                   : part_of(full, it->second, c.rank, c.size, name, "load_state");
  };
  const std::string tmp = private_tmp_dir(c.world_rank);
  try {
    for (size_t m = 0; m < c.models.size(); ++m) {
      io::TensorDict out;
      for (const auto& [name, t] : c.models[m]->state_dict())
        out[name] = mine(m, name, full_value(m, name));
      io::save_safetensors((fs::path(tmp) / indexed_name("model", m, ".safetensors")).string(),
                           out);
    }
    for (size_t o = 0; o < c.optimizers.size(); ++o) {
      // Parameter k of the optimizer -> (model, name), by identity with the models' parameters.
      std::map<const void*, std::pair<size_t, std::string>> owner;
      for (size_t m = 0; m < c.models.size(); ++m)
        for (auto& [name, p] : c.models[m]->named_parameters())
          owner.emplace(p.impl(), std::make_pair(m, name));
      io::TensorDict out = parts[0]->param_groups(o);
      size_t k = 0;
      for (size_t g = 0; g < c.optimizers[o]->num_param_groups(); ++g) {
        for (const Tensor& p : c.optimizers[o]->params(g)) {
          const auto w = owner.find(p.impl());
          ACCEL_CHECK(w != owner.end(), ValueError, "load_state", "optimizer ", o, "'s parameter ",
                      k, " is not a parameter of a prepared model");
          const auto& [m, name] = w->second;
          const std::string key = std::to_string(m) + ":" + name;
          const TpShard* shard = saved_shard(m, name);
          const bool saved_sharded = shard != nullptr;
          std::vector<std::map<std::string, Tensor>> ss;
          for (int s = 0; s < (saved_sharded ? S : 1); ++s)
            ss.push_back(parts[size_t(s)]->slots(o, k, key));
          for (const auto& [slot, v0] : ss[0]) {
            Tensor full_slot = v0;
            if (saved_sharded && v0.dim() > 0) {
              std::vector<Tensor> ps;
              for (auto& s : ss) {
                ACCEL_CHECK(s.count(slot), IoError, "load_state", "checkpoint '", c.dir,
                            "': slot '", slot, "' of '", name, "' is missing at some tp index");
                ps.push_back(s.at(slot));
              }
              full_slot = assemble(ps, *shard);
            }
            out["state." + std::to_string(k) + "." + slot] =
                v0.dim() > 0 ? mine(m, name, full_slot) : full_slot;
          }
          ++k;
        }
      }
      io::save_safetensors((fs::path(tmp) / indexed_name("optimizer", o, ".safetensors")).string(),
                           out);
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return tmp;
}

namespace {

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
    if (inner_->name() != "fsdp" && nn::is_deferred(*model)) nn::materialize(*model);
    inner_->prepare_model(model);
    models_.push_back(model);
  }
  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override {
    users_.push_back(user);
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
  nlohmann::json save_state(const std::string& dir, bool mid_window) override {
    const std::string sub = tp_dir(dir, t_);
    fs::create_directories(sub);
    const nlohmann::json inner = inner_->checkpoint().save_state(sub, mid_window);
    fsync_path(sub);
    nlohmann::json models = nlohmann::json::array();
    for (const auto& shards : shards_) {
      nlohmann::json m = nlohmann::json::object();
      for (const auto& [name, s] : shards) m[name] = {{"dim", s.dim}, {"chunks", s.chunks}};
      models.push_back(m);
    }
    return {{"tp", {{"size", T_}, {"models", models}, {"inner", inner}}}};
  }

  std::unique_ptr<StrategyState> read_state(const std::string& dir, const nlohmann::json& saved,
                                            int saved_world, bool mid_window) override {
    const TpRecord rec = parse_tp_record(saved, saved_world, models_.size(),
                                         (fs::path(dir) / kCheckpointStateFile).string());
    auto st = std::make_unique<TpState>();
    if (rec.size == T_) {
      st->inner = inner_->checkpoint().read_state(tp_dir(dir, t_), inner_record(saved, rec),
                                                  saved_world / T_, mid_window);
      return st;
    }
    ACCEL_CHECK(!mid_window, ValueError, "load_state", "checkpoint '", dir,
                "' was saved inside a gradient accumulation window at tp_size ", rec.size,
                "; its gradients only resume at that tp_size, not at ", T_);
    TpConversion c;
    c.dir = dir;
    c.saved = saved;
    c.saved_world = saved_world;
    c.models = models_;
    c.shards = shards_;
    c.rank = t_;
    c.size = T_;
    c.world_rank = c_.world_rank;
    for (auto& u : users_) c.optimizers.push_back(u.get());
    const std::string tmp = convert_tp_checkpoint(c);
    try {
      st->inner = inner_->checkpoint().read_state(tmp, nlohmann::json::object(), 1, false);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return st;
  }

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
  std::vector<std::shared_ptr<optim::Optimizer>> users_;
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
