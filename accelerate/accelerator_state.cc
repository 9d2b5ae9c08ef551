// Accelerator::save_state / load_state: the checkpoint protocol of the facade (Note [atomic
// checkpoints] in accelerate/checkpoint.h, Note [checkpoint loading] below). What the models and
// optimizers hold is the strategy's to write and read (accelerate/strategy.h); the facade writes
// schedulers, loader positions, RNG, registered objects, the scaler and its counters.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "core/generator.h"
#include "core/warning.h"
#include "accelerate/accelerator.h"
#include "accelerate/checkpoint.h"
#include "accelerate/strategy_base.h"
#include "parallel/checkpoint/legacy.h"
#include "parallel/checkpoint/names.h"
#include "parallel/checkpoint/reader.h"
#include "parallel/checkpoint/writer.h"
#include "parallel/parallelize.h"

namespace accel {

namespace fs = std::filesystem;

namespace {
std::string rank_file(const std::string& stem, int rank, const char* ext) {
  return stem + "_rank" + std::to_string(rank) + ext;
}
std::string indexed(const char* stem, size_t i, const char* ext) {
  return i == 0 ? std::string(stem) + ext : std::string(stem) + "_" + std::to_string(i) + ext;
}
bool is_format2(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(fs::path(dir) / dist::ckpt::kIndexFile, ec)) &&
         !fs::exists(fs::symlink_status(fs::path(dir) / dist::kCheckpointStateFile, ec));
}
Tensor text_tensor(const std::string& text) {
  Tensor t = empty({int64_t(text.size())}, TensorOptions(kUInt8));
  if (!text.empty()) std::memcpy(t.data_ptr(), text.data(), text.size());
  return t;
}
std::string tensor_text(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), size_t(c.numel()));
}
}  // namespace

// Note [checkpoint loading]
// load_state changes nothing unless the whole checkpoint loads:
//   1. read: every file this rank needs (state.json, checked field by field; model, optimizer
//      and scheduler tensors, ZeRO shards re-sharded as needed, loader positions, RNG state,
//      gradients of an open accumulation window, registered objects) into temporaries. A
//      missing, truncated or malformed file is an IoError naming it. Nothing is touched.
//   2. agree: one all-reduce of "did it work" per rank, so that all ranks load or none does
//      (a rank alone in step 3 would wait in the next collective forever).
//   3. apply, after a snapshot of everything it changes. What can still fail here is a
//      component's own check (a model whose shapes differ, an optimizer with other groups, a
//      registered load function that throws): then the snapshot is restored, again on every
//      rank (agreed as in 2), and the error propagates.
//   4. on every rank, whatever the outcome: Strategy::finish_load (collective work such as
//      gathering ZeRO-3 root units from the new shards), then the memory the load used is
//      handed back to the system.
// The snapshot keeps handles (scheduler, loader, RNG, registered objects, scaler, counters),
// never a copy of the model: the strategy's apply_state swaps the read state with the live one
// (Strategy::apply_state), so what was read holds the old values afterwards and a second
// apply_state undoes the first. A load therefore needs, beyond the training state, only what it
// read (Note [fsdp loading memory] in accelerate/strategy_fsdp.cc, Note [replicated loading memory]
// in accelerate/strategy.cc).
struct Accelerator::CheckpointIo {
  struct Meta {
    int64_t step = 0, optimizer_steps = 0, save_iteration = 0;
    int world_size = 1;
    bool sync_gradients = true;
    size_t num_models = 0, num_optimizers = 0, num_schedulers = 0, num_loaders = 0;
    std::map<std::string, std::string> scaler;
    nlohmann::json json;  // the whole state.json (the strategy reads its record from it)
  };

  struct Loaded {
    std::string path;
    Meta meta;
    std::unique_ptr<dist::StrategyState> strategy;  // models, optimizers, gradients
    std::vector<io::TensorDict> schedulers;
    std::vector<data::LoaderPosition> loaders;  // Note [global loader position]
    std::string rng;
    // Said once by rank 0 when applied (Note [generator state in checkpoints]).
    std::string rng_note;
    std::vector<std::map<std::string, std::string>> customs;  // parallel to customs_
  };

  struct Snapshot {
    bool strategy_applied = false;  // the strategy's apply_state ran (and must be undone)
    std::vector<io::TensorDict> schedulers;
    std::vector<data::StateDict> loaders;
    std::string rng;
    std::vector<std::map<std::string, std::string>> customs;
    std::map<std::string, std::string> scaler;
    int64_t step = 0, optimizer_steps = 0, save_iteration = 0;
    bool sync_gradients = true;
  };

  static Meta read_meta(const std::string& file) {
    const std::string text = dist::read_file(file);
    Meta m;
    try {
      const nlohmann::json s = nlohmann::json::parse(text);
      ACCEL_CHECK(s.is_object(), IoError, "load_state", "'", file, "' is not a JSON object");
      auto field = [&](const char* key, bool (nlohmann::json::*is)() const noexcept,
                       const char* want) -> const nlohmann::json& {
        ACCEL_CHECK(s.contains(key), IoError, "load_state", "'", file, "' has no \"", key, "\"");
        const nlohmann::json& v = s[key];
        ACCEL_CHECK((v.*is)(), IoError, "load_state", "'", file, "': \"", key, "\" must be ", want,
                    ", got ", v.type_name());
        return v;
      };
      auto count = [&](const char* key) {
        return field(key, &nlohmann::json::is_number_unsigned, "a count").get<size_t>();
      };
      ACCEL_CHECK(
          field("format", &nlohmann::json::is_number_integer, "an integer").get<int64_t>() == 1,
          IoError, "load_state", "'", file, "': unsupported checkpoint format ",
          s["format"].dump());
      m.step = field("step", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.optimizer_steps =
          field("optimizer_steps", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.save_iteration =
          field("save_iteration", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.world_size = field("world_size", &nlohmann::json::is_number_unsigned, "a count").get<int>();
      ACCEL_CHECK(m.world_size >= 1, IoError, "load_state", "'", file, "': world_size ",
                  m.world_size);
      m.sync_gradients =
          field("sync_gradients", &nlohmann::json::is_boolean, "a boolean").get<bool>();
      m.num_models = count("num_models");
      m.num_optimizers = count("num_optimizers");
      m.num_schedulers = count("num_schedulers");
      m.num_loaders = count("num_loaders");
      const nlohmann::json& sc = field("scaler", &nlohmann::json::is_object, "an object");
      for (auto it = sc.begin(); it != sc.end(); ++it) {
        ACCEL_CHECK(it->is_string(), IoError, "load_state", "'", file, "': scaler.", it.key(),
                    " must be a string");
        m.scaler[it.key()] = it->get<std::string>();
      }
      m.json = s;
    } catch (const nlohmann::json::exception& e) {
      ACCEL_THROW(IoError, "load_state", "'", file,
                  "' is not a valid checkpoint state: ", e.what());
    }
    return m;
  }

  // The mesh a checkpoint was saved on (format 2's "mesh"): window gradients resume only on an
  // equal one (Note [format-2 facade]).
  static nlohmann::json mesh_json(const Accelerator& acc) {
    nlohmann::json dims = nlohmann::json::array();
    for (const auto& d : acc.mesh_->dims()) dims.push_back({d.name, d.size});
    return {{"world", acc.world_size_},
            {"dims", dims},
            {"data_parallel", std::string(acc.strategy_->name())}};
  }

  // Note [format-2 facade]
  // save_state writes format 2 (Note [format-2 checkpoints] in parallel/checkpoint/reader.h):
  // the strategy's pieces (Note [format-2 strategy seam] in accelerate/strategy.h), each
  // scheduler's state dict as whole tensors "sched.<s>.<key>" (rank 0's), the generator state as
  // "rng.default" (Note [generator state in checkpoints]: Replicate, or sharded over the world
  // when the ranks' states differ), registered objects as today's per-rank JSON
  // files (custom_<name>_rank<r>.json, listed in "extra_files"), and the index's meta: counters,
  // scaler, sync_gradients, counts, the mesh, each loader's global position (Note [global loader
  // position]: it resumes at any dp size) and the tied aliases. index.json is the completing
  // file of the commit protocol (Note [atomic checkpoints]). load_state reads a format-2 folder
  // on any mesh through ckpt::open_checkpoint, a format-1 one (state.json) through
  // ckpt::open_legacy and the same read_pieces (its other state from its files, see read()).
  // Gradients of an open accumulation window are each rank's own: they load only on the mesh that
  // saved them (ValueError naming both meshes otherwise).
  static Loaded read2(Accelerator& acc, const std::string& path) {
    Loaded l;
    l.path = path;
    auto src = dist::ckpt::open_checkpoint(path);
    const nlohmann::json& j = src->meta();
    const std::string file = (fs::path(path) / dist::ckpt::kIndexFile).string();
    Meta& m = l.meta;
    try {
      auto field = [&](const nlohmann::json& o, const char* key,
                       bool (nlohmann::json::*is)() const noexcept,
                       const char* want) -> const nlohmann::json& {
        ACCEL_CHECK(o.is_object() && o.contains(key), IoError, "load_state", "'", file,
                    "' has no \"", key, "\"");
        const nlohmann::json& v = o[key];
        ACCEL_CHECK((v.*is)(), IoError, "load_state", "'", file, "': \"", key, "\" must be ", want,
                    ", got ", v.type_name());
        return v;
      };
      using J = nlohmann::json;
      m.step = field(j, "step", &J::is_number_integer, "an integer").get<int64_t>();
      m.optimizer_steps =
          field(j, "optimizer_steps", &J::is_number_integer, "an integer").get<int64_t>();
      m.save_iteration =
          field(j, "save_iteration", &J::is_number_integer, "an integer").get<int64_t>();
      m.sync_gradients = field(j, "sync_gradients", &J::is_boolean, "a boolean").get<bool>();
      const J& counts = field(j, "counts", &J::is_object, "an object");
      m.num_models = field(counts, "models", &J::is_number_unsigned, "a count").get<size_t>();
      m.num_optimizers =
          field(counts, "optimizers", &J::is_number_unsigned, "a count").get<size_t>();
      m.num_schedulers =
          field(counts, "schedulers", &J::is_number_unsigned, "a count").get<size_t>();
      m.num_loaders = field(counts, "loaders", &J::is_number_unsigned, "a count").get<size_t>();
      const J& mesh = field(j, "mesh", &J::is_object, "an object");
      m.world_size = field(mesh, "world", &J::is_number_unsigned, "a count").get<int>();
      const J& sc = field(j, "scaler", &J::is_object, "an object");
      for (auto it = sc.begin(); it != sc.end(); ++it) {
        ACCEL_CHECK(it->is_string(), IoError, "load_state", "'", file, "': scaler.", it.key(),
                    " must be a string");
        m.scaler[it.key()] = it->get<std::string>();
      }
      const J& loaders = field(j, "loaders", &J::is_array, "an array");
      ACCEL_CHECK(loaders.size() == m.num_loaders, IoError, "load_state", "'", file, "' holds ",
                  loaders.size(), " loader positions for ", m.num_loaders, " loaders");
      auto count = [&](size_t theirs, size_t mine, const char* what) {
        ACCEL_CHECK(theirs == mine, ValueError, "load_state", "checkpoint '", path, "' holds ",
                    theirs, " ", what, ", this accelerator prepared ", mine);
      };
      count(m.num_models, acc.models_.size(), "models");
      count(m.num_optimizers, acc.optimizers_.size(), "optimizers");
      count(m.num_schedulers, acc.schedulers_.size(), "schedulers");
      count(m.num_loaders, acc.loaders_.size(), "data loaders");
      ACCEL_CHECK(
          m.sync_gradients || mesh == mesh_json(acc), ValueError, "load_state", "checkpoint '",
          path, "' was saved inside a gradient accumulation window on the mesh ", mesh.dump(),
          "; its per-rank gradients only resume on that mesh, not on ", mesh_json(acc).dump());
      for (size_t i = 0; i < acc.loaders_.size(); ++i) {
        try {
          l.loaders.push_back(
              data::position_from_state(data::state_from_json(loaders[i].dump()), "load_state"));
        } catch (const std::exception& e) {
          ACCEL_THROW(IoError, "load_state", "'", file, "': loaders[", i,
                      "] is not a valid loader position: ", e.what());
        }
      }
      m.json = j;
    } catch (const nlohmann::json::exception& e) {
      ACCEL_THROW(IoError, "load_state", "'", file,
                  "' is not a valid checkpoint index: ", e.what());
    }
    l.strategy = acc.strategy_->checkpoint().read_pieces(*src, !m.sync_gradients, acc.rank_);
    for (size_t i = 0; i < acc.schedulers_.size(); ++i) {
      const std::string prefix = "sched." + std::to_string(i) + ".";
      io::TensorDict d;
      for (const std::string& n : src->names())
        if (n.rfind(prefix, 0) == 0) d[n.substr(prefix.size())] = dist::read_whole(*src, n);
      l.schedulers.push_back(std::move(d));
    }
    read_rng(acc, *src, l, file);
    read_customs(acc, l, path, m.world_size != acc.world_size_);
    return l;
  }

  // Note [generator state in checkpoints]
  // The default generator is the whole random state of a run: dropout under tensor and sequence
  // parallelism draws every rank's mask from it too (Note [dropout under tensor parallelism] in
  // parallel/tp_random.cc: no per-rank tp stream exists, so there is no "rng.tp" to save, and a
  // tp run resumes its dropout exactly at any tp size). save_state compares the ranks' states
  // with one all-reduce (max, exact int64) of the two 32-bit halves of a 64-bit FNV-1a hash of
  // Generator::state(), their negations (the min) and the state's length:
  //  - equal on every rank (every rank seeded alike, the usual case): "rng.default" is a 1-D uint8
  //    tensor of the state's text, Replicate (rank 0 writes it); every rank of any mesh resumes
  //    it exactly.
  //  - not equal (Accelerator::set_seed(seed, device_specific) at dp > 1, a per-rank
  //    manual_seed): "rng.default" has shape [W, S], row r rank r's text padded with spaces to
  //    the longest, Shard(0) over the world (each rank writes its row). On the mesh that saved it
  //    each rank takes its own row (exact). On another, rank r takes row r if r < W, else row 0,
  //    except that the ranks of one tp group (tp > 1) all take their tp rank 0's row: they must
  //    draw alike, or the replicas drift apart (parallel/tp_random.cc's generator check raises
  //    where it sees that: a root called through operator()). Rank 0 says so once: "per-rank
  //    generator states were saved on W ranks; ranks >= W continue from rank 0's" (and names the
  //    tp rule when it applied). Per-rank streams cannot be re-divided exactly: such runs resume
  //    exactly only on the mesh that saved them.
  // Equal hashes of different states (a 2^-64 chance for two ranks) would save rank 0's state
  // for every rank. Format-2 checkpoints of earlier versions hold "rng.default.rank<r>", each
  // rank's own whether alike or not: read as the rows above (entry r is row r), note included.
  struct RngAgreement {
    bool alike = true;
    int64_t width = 0;  // the longest state's length in bytes
  };

  // Collective on every rank of the world.
  static RngAgreement agree_rng(Accelerator& acc, const std::string& state) {
    RngAgreement a;
    a.width = int64_t(state.size());
    if (acc.world_size_ == 1) return a;
    uint64_t h = 14695981039346656037ull;  // FNV-1a 64
    for (unsigned char c : state) h = (h ^ c) * 1099511628211ull;
    const int64_t hi = int64_t(h >> 32), lo = int64_t(h & 0xffffffffu);
    Tensor t = tensor(std::vector<int64_t>{hi, lo, -hi, -lo, a.width}, {5}, TensorOptions(kInt64))
                   .to(acc.device_);
    acc.group_->all_reduce(t, dist::ReduceOp::Max);
    const Tensor c = t.to(kCPU);
    const int64_t* v = c.data<int64_t>();
    a.alike = v[0] == -v[2] && v[1] == -v[3];  // max == min for both halves
    a.width = v[4];
    return a;
  }

  static dist::ckpt::StateEntry rng_entry(const Accelerator& acc, const RngAgreement& a,
                                          const std::string& state) {
    if (a.alike)
      return {dist::ckpt::names::kRngDefault, dist::Region::whole({int64_t(state.size())}),
              text_tensor(state), acc.is_main_process(), "Replicate"};
    std::string row = state;
    row.resize(size_t(a.width), ' ');
    return {dist::ckpt::names::kRngDefault,
            dist::Region::whole({acc.world_size_, a.width}).shard(0, 1, acc.world_size_, acc.rank_),
            text_tensor(row).reshape({1, a.width}), true, "world: Shard(0)"};
  }

  // This rank's generator state from a format-2 checkpoint into l.rng (and l.rng_note).
  static void read_rng(Accelerator& acc, dist::ckpt::CheckpointSource& src, Loaded& l,
                       const std::string& file) {
    const int saved = l.meta.world_size;
    // Per-rank states: "rng.default" [W, S], or earlier versions' "rng.default.rank<r>".
    const bool replicated_or_rows = src.contains(dist::ckpt::names::kRngDefault);
    const bool same_mesh = l.meta.json.at("mesh") == mesh_json(acc);
    // The ranks a model step cuts one model over (tp) draw alike: on another mesh they all take
    // the row of their group's first rank (coordinate 0 along every such dimension).
    std::string cut;  // the dimensions, joined by " x "
    int mine = acc.rank_;
    for (const std::string& d : dist::registered_model_dims())
      if (!same_mesh && acc.mesh_->has_dim(d) && acc.mesh_->size(d) > 1) {
        mine = acc.mesh_->group_ranks(d, mine).front();
        cut += (cut.empty() ? "" : " x ") + d;
      }
    const int row = mine < saved ? mine : 0;
    const std::string name = replicated_or_rows
                                 ? std::string(dist::ckpt::names::kRngDefault)
                                 : dist::rank_name(dist::ckpt::names::kRngDefault, row);
    const dist::ckpt::TensorRecord& r = src.tensor(name);
    const bool rows = replicated_or_rows && r.shape.size() == 2;
    ACCEL_CHECK(r.dtype == kUInt8 && (r.shape.size() == 1 || rows) &&
                    uint64_t(r.shape.back()) <= dist::kMaxRngFileBytes &&
                    (!rows || r.shape[0] == saved),
                IoError, "load_state", "'", file, "': '", name, "' is ", r.dtype, " ",
                shape_str(r.shape), ", not a generator state (of a world of ", saved, ")");
    if (rows) {
      const dist::Region want = dist::Region::whole(r.shape).shard(0, 1, saved, row);
      l.rng = tensor_text(dist::read_region(src, name, want, kUInt8, kCPU));
      l.rng.erase(l.rng.find_last_not_of(' ') + 1);  // the padding
    } else {
      l.rng = tensor_text(dist::read_whole(src, name));
    }
    Generator probe(0);
    try {
      probe.set_state(l.rng);
    } catch (const std::exception& e) {
      ACCEL_THROW(IoError, "load_state", "'", file, "': '", name,
                  "' is not a valid generator state: ", e.what());
    }
    if (replicated_or_rows && !rows) return;  // one state for every rank
    std::string note;
    if (acc.world_size_ > saved)
      note = "ranks >= " + std::to_string(saved) + " continue from rank 0's";
    if (!cut.empty())
      note += std::string(note.empty() ? "" : "; ") + "the ranks of each " + cut +
              " group continue from their " + cut + " rank 0's row (a " + cut +
              " group draws alike: Note [dropout under tensor parallelism])";
    if (!note.empty())
      l.rng_note =
          "per-rank generator states were saved on " + std::to_string(saved) + " ranks; " + note;
  }

  // Registered objects: this rank's file, or rank 0's when the checkpoint had fewer ranks.
  static void read_customs(Accelerator& acc, Loaded& l, const std::string& path, bool reshard) {
    auto at = [&](const std::string& f) { return (fs::path(path) / f).string(); };
    for (auto& c : acc.customs_) {
      std::string f = at(rank_file("custom_" + c.name, acc.rank_, ".json"));
      if (reshard && !fs::exists(f)) f = at(rank_file("custom_" + c.name, 0, ".json"));
      ACCEL_CHECK(fs::exists(f), IoError, "load_state", "checkpoint '", path,
                  "' has no state for '", c.name, "' (", f, ")");
      try {
        l.customs.push_back(
            nlohmann::json::parse(dist::read_file(f)).get<std::map<std::string, std::string>>());
      } catch (const nlohmann::json::exception& e) {
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid state of '", c.name,
                    "': ", e.what());
      }
    }
  }

  // Format 2's files (Note [format-2 facade]), written into `tmp` by every rank; index.json last.
  static void save2(Accelerator& acc, const std::string& tmp,
                    const std::function<void(const std::function<void()>&)>& agree) {
    std::vector<dist::ckpt::StateEntry> entries;
    nlohmann::json meta;
    // Collective: before the first step that can fail on one rank alone.
    const std::string rng_state = default_generator().state();
    const RngAgreement rng = agree_rng(acc, rng_state);
    agree([&] {
      acc.strategy_->checkpoint().state_entries(entries, !acc.sync_gradients_, acc.rank_);
      for (size_t i = 0; i < acc.schedulers_.size(); ++i)
        for (auto& [k, v] : acc.schedulers_[i]->state_dict())
          entries.push_back({"sched." + std::to_string(i) + "." + k, dist::Region::whole(v.sizes()),
                             v, acc.is_main_process(), ""});
      entries.push_back(rng_entry(acc, rng, rng_state));
      for (auto& c : acc.customs_) {
        nlohmann::json j = c.save();
        dist::write_file_durable(
            (fs::path(tmp) / rank_file("custom_" + c.name, acc.rank_, ".json")).string(), j.dump());
      }
      if (!acc.is_main_process()) return;
      meta["step"] = acc.step_;
      meta["optimizer_steps"] = acc.optimizer_steps_;
      meta["save_iteration"] = acc.save_iteration_;
      meta["sync_gradients"] = acc.sync_gradients_;
      meta["mixed_precision"] =
          std::string(dist::mixed_precision_name(acc.config_.mixed_precision));
      meta["zero_stage"] = acc.config_.zero_stage;
      meta["scaler"] = acc.scaler_.state_dict();
      meta["counts"] = {{"models", acc.models_.size()},
                        {"optimizers", acc.optimizers_.size()},
                        {"schedulers", acc.schedulers_.size()},
                        {"loaders", acc.loaders_.size()}};
      meta["mesh"] = mesh_json(acc);
      nlohmann::json loaders = nlohmann::json::array();
      for (auto& ld : acc.loaders_)
        loaders.push_back(nlohmann::json::parse(data::state_to_json(ld->state_dict())));
      meta["loaders"] = loaders;
      nlohmann::json aliases = nlohmann::json::object();
      for (size_t i = 0; i < acc.models_.size(); ++i)
        for (const auto& [alias, first] : acc.models_[i]->tied_aliases())
          aliases[dist::ckpt::names::model(i, alias)] = dist::ckpt::names::model(i, first);
      meta["aliases"] = aliases;
      std::vector<std::string> customs, extra;
      for (auto& c : acc.customs_) {
        customs.push_back(c.name);
        for (int r = 0; r < acc.world_size_; ++r)
          extra.push_back(rank_file("custom_" + c.name, r, ".json"));
      }
      meta["custom"] = customs;
      meta["extra_files"] = extra;
    });
    // Every rank's data file is durable when rank 0 writes the index (save_pieces' messages).
    agree([&] { dist::ckpt::save_pieces(tmp, acc.group_.get(), acc.rank_, entries, meta); });
    dist::run_checkpoint_hook("rank_files");
  }

  // Step 1 of Note [checkpoint loading]: reads, checks, changes nothing.
  static Loaded read(Accelerator& acc, const std::string& path) {
    if (is_format2(path)) {
      dist::refuse_checkpoint_links(path, "load_state");
      return read2(acc, path);
    }
    auto at = [&](const std::string& f) { return (fs::path(path) / f).string(); };
    Loaded l;
    l.path = path;
    dist::refuse_checkpoint_links(path, "load_state");
    l.meta = read_meta(at(dist::kCheckpointStateFile));
    const Meta& m = l.meta;
    auto count = [&](size_t theirs, size_t mine, const char* what) {
      ACCEL_CHECK(theirs == mine, ValueError, "load_state", "checkpoint '", path, "' holds ",
                  theirs, " ", what, ", this accelerator prepared ", mine);
    };
    // Format 1 (state.json): another mesh reads its regions from the pieces open_legacy gives
    // (below); ranks without an RNG file of their own take rank 0's. Loaders resume at their global
    // position at any world and dp size.
    const bool reshard = m.world_size != acc.world_size_;
    ACCEL_CHECK(!reshard || m.sync_gradients, ValueError, "load_state", "checkpoint '", path,
                "' was saved inside a gradient accumulation window by ", m.world_size,
                " processes; its per-rank gradients only resume with ", m.world_size);
    count(m.num_models, acc.models_.size(), "models");
    count(m.num_optimizers, acc.optimizers_.size(), "optimizers");
    count(m.num_schedulers, acc.schedulers_.size(), "schedulers");
    count(m.num_loaders, acc.loaders_.size(), "data loaders");
    // A rank's own file, or rank 0's when the checkpoint had fewer ranks.
    auto rank_or_first = [&](const std::string& stem, const char* ext) {
      std::string f = at(rank_file(stem, acc.rank_, ext));
      return (!reshard || fs::exists(f)) ? f : at(rank_file(stem, 0, ext));
    };
    // Models, optimizers and window gradients: format 1's files as the pieces format 2 names
    // (Note [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h), read by the same
    // seam as format 2 on any mesh (tp at any size, tp x ZeRO-3 included).
    // The saved mesh against this one along every dimension a model step cuts (format 1 records
    // {"<dim>": {"size": n}}; absent: 1).
    const std::vector<std::string> cut = dist::registered_model_dims();
    for (size_t i = 0; !m.sync_gradients && i < cut.size(); ++i) {
      const std::string& d = cut[i];
      const nlohmann::json& rec = m.json.contains(d) ? m.json[d] : nlohmann::json();
      const int saved = rec.is_object() && rec.contains("size") && rec["size"].is_number_unsigned()
                            ? rec["size"].get<int>()
                            : 1;
      const int now = acc.mesh_->has_dim(d) ? acc.mesh_->size(d) : 1;
      ACCEL_CHECK(saved == now, ValueError, "load_state", "checkpoint '", path,
                  "' was saved inside a gradient accumulation window at ", d, "_size ", saved,
                  "; its per-rank gradients only resume at that ", d, "_size, not at ", now);
    }
    {
      std::vector<const optim::Optimizer*> users;
      for (auto& o : acc.optimizers_) users.push_back(&o->optimizer());
      auto src = dist::ckpt::open_legacy(
          path, dist::ckpt::legacy_context(acc.models_, users, acc.config_.ddp.bucket_cap_bytes));
      l.strategy = acc.strategy_->checkpoint().read_pieces(*src, !m.sync_gradients, acc.rank_);
    }
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      l.schedulers.push_back(io::load_safetensors(at(indexed("scheduler", i, ".safetensors"))));
    for (size_t i = 0; i < acc.loaders_.size(); ++i) {
      // The global position, written once (Note [global loader position] in data/sampler.cc);
      // checkpoints of earlier versions hold each rank's loader state instead: rank 0's converts
      // to the same global position.
      std::string f = at(indexed("loader", i, ".json"));
      if (!fs::exists(f)) f = at(rank_file(indexed("loader", i, ""), 0, ".json"));
      try {
        l.loaders.push_back(
            data::position_from_state(data::state_from_json(dist::read_file(f)), "load_state"));
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& e) {  // ValueError of state_from_json, position_from_state
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid loader state: ", e.what());
      }
    }
    {
      const std::string f = rank_or_first("rng", ".txt");
      l.rng = dist::read_file(f, dist::kMaxRngFileBytes);
      Generator probe(0);
      try {
        probe.set_state(l.rng);
      } catch (const std::exception& e) {
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid generator state: ", e.what());
      }
    }
    read_customs(acc, l, path, reshard);
    return l;
  }

  // Step 3 of Note [checkpoint loading].
  static void apply(Accelerator& acc, Loaded& l, Snapshot& s) {
    acc.strategy_->checkpoint().apply_state(*l.strategy);
    s.strategy_applied = true;
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      acc.schedulers_[i]->load_state_dict(l.schedulers[i]);
    for (size_t i = 0; i < acc.loaders_.size(); ++i)
      acc.loaders_[i]->resume(l.loaders[i], acc.is_main_process() ? "load_state" : nullptr);
    default_generator().set_state(l.rng);
    if (!l.rng_note.empty() && acc.is_main_process()) ACCEL_WARN_ONCE("load_state", l.rng_note);
    acc.sync_gradients_ = l.meta.sync_gradients;
    for (size_t i = 0; i < acc.customs_.size(); ++i) acc.customs_[i].load(l.customs[i]);
    acc.scaler_.load_state_dict(l.meta.scaler);
    acc.step_ = l.meta.step;
    acc.optimizer_steps_ = l.meta.optimizer_steps;
    acc.save_iteration_ = l.meta.save_iteration + 1;
  }

  static Snapshot snapshot(Accelerator& acc) {
    Snapshot s;
    for (auto& sc : acc.schedulers_) s.schedulers.push_back(sc->state_dict());
    for (auto& ld : acc.loaders_) s.loaders.push_back(ld->state_dict());
    s.rng = default_generator().state();
    for (auto& c : acc.customs_) s.customs.push_back(c.save());
    s.scaler = acc.scaler_.state_dict();
    s.step = acc.step_;
    s.optimizer_steps = acc.optimizer_steps_;
    s.save_iteration = acc.save_iteration_;
    s.sync_gradients = acc.sync_gradients_;
    return s;
  }

  static void restore(Accelerator& acc, const Snapshot& s, Loaded& l) {
    if (s.strategy_applied) acc.strategy_->checkpoint().apply_state(*l.strategy);  // swaps back
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      acc.schedulers_[i]->load_state_dict(s.schedulers[i]);
    for (size_t i = 0; i < acc.loaders_.size(); ++i) acc.loaders_[i]->load_state_dict(s.loaders[i]);
    default_generator().set_state(s.rng);
    for (size_t i = 0; i < acc.customs_.size(); ++i) acc.customs_[i].load(s.customs[i]);
    acc.scaler_.load_state_dict(s.scaler);
    acc.step_ = s.step;
    acc.optimizer_steps_ = s.optimizer_steps;
    acc.save_iteration_ = s.save_iteration;
    acc.sync_gradients_ = s.sync_gradients;
  }

  // Step 2: the ranks whose `failed` was true (collective; every rank gets the same list).
  static std::vector<int> failed_ranks(Accelerator& acc, bool failed) {
    if (acc.world_size_ == 1) return failed ? std::vector<int>{0} : std::vector<int>{};
    Tensor flags = zeros({acc.world_size_}, TensorOptions(kFloat32, acc.device_));
    if (failed) flags.narrow(0, acc.rank_, 1).fill_(1.0);
    acc.group_->all_reduce(flags, dist::ReduceOp::Sum);
    std::vector<int> out;
    for (int r = 0; r < acc.world_size_; ++r)
      if (flags.narrow(0, r, 1).item<double>() > 0) out.push_back(r);
    return out;
  }

  // Rethrows this rank's own error, or names the ranks that failed.
  [[noreturn]] static void rethrow(const std::exception_ptr& err, const std::vector<int>& failed,
                                   const char* op, const std::string& dir, const char* what) {
    if (err) std::rethrow_exception(err);
    std::string ranks;
    for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    ACCEL_THROW(IoError, op, "rank(s) ", ranks, " could not ", what, " checkpoint '", dir,
                "'; no rank changed anything");
  }
};

std::string Accelerator::save_state(const std::string& dir) {
  const bool automatic = dir.empty();
  const std::string final_dir =
      automatic ? (fs::path(checkpoints_dir()) /
                   (std::string(dist::kCheckpointPrefix) + std::to_string(save_iteration_)))
                      .string()
                : fs::path(dir).lexically_normal().string();
  const std::string name = fs::path(final_dir).filename().string();
  ACCEL_CHECK(!name.empty() && name != "." && name != "..", ValueError, "save_state",
              "bad checkpoint directory '", dir, "'");
  std::string parent = fs::path(final_dir).parent_path().string();
  if (parent.empty()) parent = ".";
  const std::string tmp = dist::checkpoint_tmp_dir(final_dir);

  // Every rank checks what the save would replace (Note [what save_state replaces]), then the
  // main process creates the temporary folder (after the checks: it deletes a stale one). After
  // each step all ranks agree, so that a refusal or a failure on one rank stops every rank there
  // rather than leaving the others waiting in a barrier.
  auto agree = [&](const std::function<void()>& step) {
    std::exception_ptr err;
    try {
      step();
    } catch (...) {
      err = std::current_exception();
    }
    const std::vector<int> failed = CheckpointIo::failed_ranks(*this, bool(err));
    if (!failed.empty()) CheckpointIo::rethrow(err, failed, "save_state", final_dir, "start");
  };
  agree([&] { dist::check_save_target(final_dir); });
  agree([&] {
    if (is_main_process()) dist::begin_checkpoint_dir(tmp);
  });
  dist::run_checkpoint_hook("begin");

  CheckpointIo::save2(*this, tmp, agree);
  if (is_main_process()) {
    dist::run_checkpoint_hook("state");
    dist::commit_checkpoint_dir(tmp, final_dir);
    dist::run_checkpoint_hook("commit");
  }
  wait_for_everyone();
  if (is_main_process()) {
    dist::write_latest(parent, name);
    dist::run_checkpoint_hook("latest");
    if (automatic) dist::rotate_checkpoints(parent, config_.total_limit, final_dir);
    dist::run_checkpoint_hook("rotate");
  }
  ++save_iteration_;
  wait_for_everyone();
  return final_dir;
}

std::string Accelerator::load_state(const std::string& dir) {
  const std::string where = dir.empty() ? checkpoints_dir() : dir;
  std::exception_ptr err;
  std::optional<CheckpointIo::Loaded> loaded;
  try {
    loaded = CheckpointIo::read(*this, dist::resolve_checkpoint_dir(where));
  } catch (...) {
    err = std::current_exception();
  }
  std::vector<int> failed = CheckpointIo::failed_ranks(*this, bool(err));
  if (!failed.empty()) CheckpointIo::rethrow(err, failed, "load_state", where, "read");

  CheckpointIo::Snapshot before = CheckpointIo::snapshot(*this);
  try {
    CheckpointIo::apply(*this, *loaded, before);
  } catch (...) {
    err = std::current_exception();
  }
  failed = CheckpointIo::failed_ranks(*this, bool(err));
  if (!failed.empty()) {
    try {
      CheckpointIo::restore(*this, before, *loaded);
    } catch (...) {  // the state came from these very objects; keep the error that matters
    }
  }
  // Step 4: collective on every rank, applied or undone.
  strategy_->checkpoint().finish_load();
  update_sync();  // the loaded (or kept) sync_gradients
  const std::string path = loaded->path;
  loaded.reset();  // what was replaced (or what was read) goes
  dist::release_unused_memory();
  if (!failed.empty()) CheckpointIo::rethrow(err, failed, "load_state", where, "load");
  return path;
}

}  // namespace accel
