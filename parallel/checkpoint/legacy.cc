#include "parallel/checkpoint/legacy.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "io/safetensors.h"
#include "parallel/checkpoint_files.h"
#include "parallel/checkpoint_records.h"
#include "parallel/checkpoint/legacy_parts.h"
#include "parallel/checkpoint/names.h"
#include "parallel/checkpoint/read_pieces.h"

namespace accel::dist::ckpt {

namespace legacy {

std::string indexed(const std::string& stem, size_t i) {
  return i == 0 ? stem : stem + "_" + std::to_string(i);
}
std::string rank_file(const std::string& stem, size_t i, int64_t rank) {
  return indexed(stem, i) + "_rank" + std::to_string(rank) + ".safetensors";
}

}  // namespace legacy

namespace {

using json = nlohmann::json;
using legacy::indexed;
using legacy::LocalPart;
using legacy::LocalPiece;
using legacy::LocalTensor;
namespace records = ckpt_records;
constexpr const char* kOp = "checkpoint";
// At most this many data files are held open at once (a ZeRO-3 checkpoint of a large world has
// one shard file per rank and model); past it the cache is emptied and files reopen on demand.
constexpr size_t kMaxOpenFiles = 64;
// A piece's bytes are read through one buffer of at most this size.
constexpr uint64_t kReadWindowBytes = uint64_t(4) << 20;
constexpr int64_t kMaxModels = 4096;

// The names format 1's ZeRO-3 save gave its files (Note [format-1 checkpoints as pieces]).
std::string plain_file(size_t m) { return indexed("model", m) + ".safetensors"; }
std::string shard_file(size_t m, int64_t rank) { return legacy::rank_file("fsdp_model", m, rank); }
std::string tp_folder(int64_t t) { return "tp" + std::to_string(t); }

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& why) {
  ACCEL_THROW(IoError, kOp, "'", file, "': ", field, " ", why);
}

int64_t count_field(const json& s, const char* key, int64_t lo, int64_t hi,
                    const std::string& file) {
  if (!s.contains(key) || !s[key].is_number_integer()) bad(file, key, "must be an integer");
  const int64_t v = s[key].get<int64_t>();
  if (v < lo || v > hi)
    bad(file, key,
        std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// The "tp" record of format 1 (written by the tp strategy the composition replaced), checked with
// the strategy's rules (Note [checkpoint record validation]): {"size": T dividing world_size,
// "models": one {name: {"dim", "chunks"}} per model, "inner": the record of the strategy inside
// tp}.
struct TpShardRecord {
  int64_t dim = 0, chunks = 1;
};
struct TpRecord {
  int64_t size = 1;
  std::vector<std::map<std::string, TpShardRecord>> models;
  json inner = json::object();
};

TpRecord parse_tp(const json& state, int64_t world, size_t num_models, const std::string& file) {
  TpRecord r;
  if (!state.contains("tp")) return r;
  const json& tp = state["tp"];
  if (!tp.is_object()) bad(file, "tp", "must be an object");
  if (!tp.contains("size") || !tp["size"].is_number_unsigned())
    bad(file, "tp.size", "must be a count");
  const uint64_t size = tp["size"].get<uint64_t>();
  if (size < 1 || size > uint64_t(world) || world % int64_t(size) != 0)
    bad(file, "tp.size",
        std::to_string(size) + " does not divide world_size " + std::to_string(world));
  r.size = int64_t(size);
  if (!tp.contains("inner") || !tp["inner"].is_object()) bad(file, "tp.inner", "must be an object");
  r.inner = tp["inner"];
  if (!tp.contains("models") || !tp["models"].is_array() || tp["models"].size() != num_models)
    bad(file, "tp.models", "must list " + std::to_string(num_models) + " model(s)");
  for (size_t i = 0; i < num_models; ++i) {
    const json& m = tp["models"][i];
    const std::string where = "tp.models[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(file, where, "must be an object");
    std::map<std::string, TpShardRecord> shards;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const json& s = *it;
      const std::string f = where + "." + it.key();
      if (!s.is_object() || !s.contains("dim") || !s["dim"].is_number_unsigned() ||
          !s.contains("chunks") || !s["chunks"].is_number_unsigned())
        bad(file, f, "must be {\"dim\": count, \"chunks\": count}");
      const uint64_t dim = s["dim"].get<uint64_t>(), chunks = s["chunks"].get<uint64_t>();
      if (dim >= 64 || chunks < 1 || chunks > 4096) bad(file, f, "has dim or chunks out of range");
      shards[it.key()] = TpShardRecord{int64_t(dim), int64_t(chunks)};
    }
    r.models.push_back(std::move(shards));
  }
  return r;
}

// Model m's tensors as one folder holds them, by their names in the model.
using LocalModel = std::map<std::string, LocalTensor>;

class LegacySource final : public CheckpointSource, public legacy::Files {
 public:
  LegacySource(std::string dir, const LegacyContext* ctx);

  const json& meta() const override { return meta_; }
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [n, t] : tensors_) out.push_back(n);
    return out;
  }
  const TensorRecord& tensor(const std::string& name) const override {
    auto it = tensors_.find(name);
    ACCEL_CHECK(it != tensors_.end(), IoError, kOp, "checkpoint '", dir_, "' holds no tensor '",
                name, "'");
    return it->second;
  }
  void read(const std::string& name, const Region& want, const Tensor& dst) override;

  // legacy::Files
  int64_t add(const std::string& rel) override;
  const io::SafetensorsFile& open(int64_t i) override;
  bool exists(const std::string& rel) const override {
    struct stat st {};
    return ::lstat(path_of(rel).c_str(), &st) == 0;
  }

 private:
  // A piece read at an offset of its entry (a ZeRO-1/2 bucket slice), by tensor and piece index.
  struct Slice {
    int64_t offset = 0, numel = 0;
  };
  std::string path_of(const std::string& rel) const {
    return (std::filesystem::path(dir_) / rel).string();
  }
  void check_folders(int64_t tp_size);
  const io::SafetensorsFile& checked_file(const std::string& name, const TensorRecord& rec,
                                          const PieceRecord& p);
  LocalModel read_part(const std::string& base, size_t m, const records::FsdpRecord* fsdp,
                       std::map<std::string, std::string>& aliases);
  void join(std::vector<LocalPart>& parts, const TpRecord& tp);
  void add_aliases(const json& state, const std::string& file, size_t num_models);

  std::string dir_;
  json meta_;
  std::map<std::string, TensorRecord> tensors_;
  std::map<std::pair<std::string, size_t>, Slice> slices_;
  std::vector<std::string> files_;  // paths relative to dir_ ("tp1/model.safetensors")
  std::map<std::string, int64_t> file_ids_;
  std::map<int64_t, std::unique_ptr<io::SafetensorsFile>> open_;
};

LegacySource::LegacySource(std::string dir, const LegacyContext* ctx) : dir_(std::move(dir)) {
  const std::string state_path = path_of(kCheckpointStateFile);
  const std::string text =
      file_io::read_file(state_path, kOp, kMaxIndexBytes, file_io::Links::kRefuse);
  json state;
  try {
    state = json::parse(text);
  } catch (const json::exception& e) {
    ACCEL_THROW(IoError, kOp, "'", state_path, "' is not JSON: ", e.what());
  }
  if (!state.is_object()) bad(state_path, "the file", "must hold a JSON object");
  if (count_field(state, "format", 1, 1000, state_path) != 1)
    bad(state_path, "format", "is " + state["format"].dump() + "; this reader reads format 1");
  const int64_t world = count_field(state, "world_size", 1, records::kMaxRecordWorld, state_path);
  const size_t num_models = size_t(count_field(state, "num_models", 0, kMaxModels, state_path));
  const TpRecord tp = parse_tp(state, world, num_models, state_path);
  check_folders(tp.size);
  size_t num_optimizers = 0;
  if (ctx) {
    num_optimizers = size_t(count_field(state, "num_optimizers", 0, kMaxModels, state_path));
    ACCEL_CHECK(ctx->optimizers.size() == num_optimizers, ValueError, kOp, "checkpoint '", dir_,
                "' holds ", num_optimizers, " optimizer(s), this run prepared ",
                ctx->optimizers.size());
  }

  // The record of the strategy that wrote the model files (inside tp: the inner one, for a world
  // of world_size / T ranks).
  const json& inner = state.contains("tp") ? tp.inner : state;
  std::optional<records::FsdpRecord> fsdp;
  if (inner.contains("fsdp")) {
    fsdp = records::parse_fsdp_record(inner["fsdp"], world / tp.size, state_path);
    if (fsdp->models.size() != num_models)
      bad(state_path, "fsdp.models",
          "lists " + std::to_string(fsdp->models.size()) + " model(s), num_models is " +
              std::to_string(num_models));
    if (ctx && fsdp->optimizers.size() != num_optimizers)
      bad(state_path, "fsdp.optimizers",
          "lists " + std::to_string(fsdp->optimizers.size()) + " optimizer(s), num_optimizers is " +
              std::to_string(num_optimizers));
  }
  meta_ = state;
  meta_["aliases"] = json::object();
  std::vector<LocalPart> parts(size_t(tp.size));
  std::vector<legacy::Folder> folders(size_t(tp.size));
  for (size_t m = 0; m < num_models; ++m) {
    const std::string prefix = names::model(m, "");
    for (int64_t t = 0; t < tp.size; ++t) {
      std::map<std::string, std::string> aliases;
      const std::string base = state.contains("tp") ? tp_folder(t) + "/" : "";
      for (auto& [name, lt] : read_part(base, m, fsdp ? &*fsdp : nullptr, aliases)) {
        lt.model = int64_t(m);
        lt.param = name;
        parts[size_t(t)].emplace(prefix + name, std::move(lt));
      }
      for (const auto& [alias, kept] : aliases)
        folders[size_t(t)].aliases.emplace(prefix + alias, prefix + kept);
    }
  }
  for (const auto& [alias, kept] : folders[0].aliases) meta_["aliases"][alias] = kept;
  for (int64_t t = 0; ctx && t < tp.size; ++t) {
    legacy::Folder& f = folders[size_t(t)];
    f.base = state.contains("tp") ? tp_folder(t) + "/" : "";
    f.record = &inner;
    f.world = world / tp.size;
    f.fsdp = fsdp ? &*fsdp : nullptr;
    f.num_optimizers = num_optimizers;
    f.tp = tp.size > 1;
    f.state_path = state_path;
    legacy::add_optimizers(*this, f, *ctx, parts[size_t(t)]);
  }
  for (size_t m = 0; m < tp.models.size(); ++m)
    for (const auto& [name, sh] : tp.models[m])
      ACCEL_CHECK(parts[0].count(names::model(m, name)), IoError, kOp, "checkpoint '", dir_,
                  "': tp.models[", m, "] says '", name, "' is cut over tp, but '",
                  path_of(tp_folder(0)), "' holds no such tensor");
  join(parts, tp);
  // Saved inside an accumulation window: every rank's own gradients, whole (same mesh only).
  if (ctx && state.contains("sync_gradients") && state["sync_gradients"] == false) {
    std::vector<LocalPart> grads(1);
    for (int64_t t = 0; t < tp.size; ++t)
      legacy::add_window_grads(*this, folders[size_t(t)], num_models, tp.size, t, parts[size_t(t)],
                               grads[0]);
    for (const auto& [name, lt] : grads[0])
      ACCEL_CHECK(!tensors_.count(name), IoError, kOp, "checkpoint '", dir_, "': '", name,
                  "' comes from two places");
    join(grads, TpRecord{});
  }
  add_aliases(state, state_path, num_models);
}

// Note [format-1 checkpoints as pieces]: no link anywhere, no folder but tp<t>/ (t < T) of a tp
// checkpoint, and those hold regular files only.
void LegacySource::check_folders(int64_t tp_size) {
  auto inspect = [&](int dirfd, const std::string& name, const std::string& shown) {
    struct stat st {};
    ACCEL_CHECK(::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0, IoError, kOp,
                "cannot inspect '", shown, "': ", std::strerror(errno));
    ACCEL_CHECK(!S_ISLNK(st.st_mode), IoError, kOp, "'", shown,
                "' is a symbolic link; a checkpoint holds none (refusing to follow it)");
    return st.st_mode;
  };
  file_io::Fd d = file_io::open_dir(dir_, /*create=*/false, kOp);
  std::set<std::string> folders;
  for (const std::string& name : file_io::list_dir(d.get(), dir_, kOp)) {
    if (!S_ISDIR(inspect(d.get(), name, path_of(name)))) continue;
    folders.insert(name);
  }
  for (int64_t t = 0; tp_size > 1 && t < tp_size; ++t) {
    const std::string sub = tp_folder(t);
    ACCEL_CHECK(folders.count(sub), IoError, kOp, "checkpoint '", dir_, "' was saved at tp size ",
                tp_size, " but has no folder '", sub, "'");
    folders.erase(sub);
    const std::string shown = path_of(sub);
    file_io::Fd s = file_io::open_dir(shown, /*create=*/false, kOp);
    for (const std::string& name : file_io::list_dir(s.get(), shown, kOp)) {
      const std::string f = shown + "/" + name;
      ACCEL_CHECK(S_ISREG(inspect(s.get(), name, f)), IoError, kOp, "'", f,
                  "' is not a regular file; a tp folder of a checkpoint holds files only");
    }
  }
  ACCEL_CHECK(folders.empty(), IoError, kOp, "checkpoint '", dir_, "' holds the folder '",
              folders.empty() ? "" : *folders.begin(), "', which no save of format 1 writes",
              tp_size > 1 ? "" : " (tp<t>/ folders belong to checkpoints with a tp record)");
}

int64_t LegacySource::add(const std::string& rel) {
  auto [it, fresh] = file_ids_.emplace(rel, int64_t(files_.size()));
  if (fresh) files_.push_back(rel);
  return it->second;
}

// The data file, opened never through a link (its header checked by SafetensorsFile).
const io::SafetensorsFile& LegacySource::open(int64_t i) {
  auto it = open_.find(i);
  if (it != open_.end()) return *it->second;
  if (open_.size() >= kMaxOpenFiles) open_.clear();
  auto f =
      std::make_unique<io::SafetensorsFile>(path_of(files_[size_t(i)]), file_io::Links::kRefuse);
  return *open_.emplace(i, std::move(f)).first->second;
}

// The piece's file, its entry checked against the record (the file may have been replaced since it
// was first opened): the entry's bytes bound the runs read.
const io::SafetensorsFile& LegacySource::checked_file(const std::string& name,
                                                      const TensorRecord& rec,
                                                      const PieceRecord& p) {
  const io::SafetensorsFile& f = open(p.file);
  const io::SafetensorsFile::Info& info = f.info(p.entry);
  const auto s = slices_.find({name, size_t(&p - rec.pieces.data())});
  if (s != slices_.end()) {
    const Slice& sl = s->second;
    ACCEL_CHECK(info.dtype == rec.dtype && info.shape == Shape{sl.numel} &&
                    sl.offset + p.region.numel() <= sl.numel,
                IoError, kOp, "'", f.path(), "': tensor '", name, "' entry '", p.entry, "' is ",
                info.dtype, " ", shape_str(info.shape), ", expected ", rec.dtype, " (", sl.numel,
                ") holding elements [", sl.offset, ", ", sl.offset + p.region.numel(), ")");
    return f;
  }
  ACCEL_CHECK(info.dtype == rec.dtype && info.shape == p.region.local_shape(), IoError, kOp, "'",
              f.path(), "': tensor '", name, "' entry '", p.entry, "' is ", info.dtype, " ",
              shape_str(info.shape), ", expected ", rec.dtype, " ",
              shape_str(p.region.local_shape()));
  return f;
}

// Model m's tensors as the folder `base` ("" or "tp<t>/") holds them; `aliases` receives the tied
// names its plain file records (Note [tied tensors in files] in io/safetensors.cc).
LocalModel LegacySource::read_part(const std::string& base, size_t m,
                                   const records::FsdpRecord* fsdp,
                                   std::map<std::string, std::string>& aliases) {
  LocalModel out;
  if (fsdp) {
    std::optional<DType> model_dtype;
    for (const records::FsdpParamRecord& p : fsdp->models[m]) {
      LocalTensor lt;
      for (int64_t s : p.shape) lt.shape.push_back(s);
      lt.flat = true;
      for (size_t q = 0; q < p.spans.size(); ++q) {
        const auto [lo, hi] = p.spans[q];
        if (hi == lo) continue;
        const int64_t id = add(base + shard_file(m, int64_t(q)));
        const io::SafetensorsFile& f = open(id);
        ACCEL_CHECK(f.contains(p.name), IoError, kOp, "'", f.path(), "' holds no '", p.name,
                    "', whose elements [", lo, ", ", hi, ") state.json places there");
        const io::SafetensorsFile::Info& info = f.info(p.name);
        ACCEL_CHECK(info.shape == Shape{hi - lo}, IoError, kOp, "'", f.path(), "': '", p.name,
                    "' is ", shape_str(info.shape), ", its span in state.json is [", lo, ", ", hi,
                    ") of ", shape_str(lt.shape));
        ACCEL_CHECK(!lt.typed || info.dtype == lt.dtype, IoError, kOp, "'", f.path(), "': '",
                    p.name, "' is ", info.dtype, ", its other spans are ", lt.dtype);
        lt.dtype = info.dtype;
        lt.typed = true;
        lt.pieces.push_back({id, p.name, lo, hi});
      }
      if (lt.typed && !model_dtype) model_dtype = lt.dtype;
      out.emplace(p.name, std::move(lt));
    }
    // A parameter of no elements is written by no rank: it takes the model's parameter dtype.
    for (auto& [name, lt] : out)
      if (!lt.typed && model_dtype) lt.dtype = *model_dtype;
  }
  // The plain model file: the whole model, or ZeRO-3's replicated part (buffers, frozen).
  const int64_t id = add(base + plain_file(m));
  const io::SafetensorsFile& f = open(id);
  for (const std::string& name : f.names()) {
    const io::SafetensorsFile::Info& info = f.info(name);
    LocalTensor lt;
    lt.dtype = info.dtype;
    lt.typed = true;
    lt.shape = info.shape;
    lt.pieces.push_back({id, name});
    ACCEL_CHECK(out.emplace(name, std::move(lt)).second, IoError, kOp, "'", f.path(), "' holds '",
                name, "', which state.json's ZeRO-3 record says is sharded");
  }
  for (const auto& [key, value] : f.metadata())
    if (!f.contains(key) && f.contains(value)) aliases.emplace(key, value);
  return out;
}

// The global tensors from their parts at the T tp indexes (Note [format-1 checkpoints as pieces]):
// a tensor of a parameter that tp.models cuts is the parts joined along its dim, any other tp
// index 0's.
void LegacySource::join(std::vector<LocalPart>& parts, const TpRecord& tp) {
  const int64_t T = tp.size;
  auto where = [&](int64_t t, const LocalTensor& lt) {
    return lt.pieces.empty() ? path_of(T > 1 ? tp_folder(t) : "")
                             : path_of(files_[size_t(lt.pieces[0].file)]);
  };
  for (int64_t t = 1; t < T; ++t)
    for (const auto& [name, lt] : parts[size_t(t)])
      ACCEL_CHECK(parts[0].count(name), IoError, kOp, "'", where(t, lt), "' holds '", name,
                  "', which '", path_of(tp_folder(0)), "' does not");
  for (auto& [global, lt0] : parts[0]) {
    TensorRecord r;
    r.dtype = lt0.dtype;
    r.shape = lt0.shape;
    const TpShardRecord* s = nullptr;
    if (T > 1 && lt0.model >= 0 && size_t(lt0.model) < tp.models.size()) {
      const auto it = tp.models[size_t(lt0.model)].find(lt0.param);
      if (it != tp.models[size_t(lt0.model)].end()) s = &it->second;
    }
    std::vector<Region> boxes;  // per tp index whose pieces are read
    if (!s) {
      boxes.push_back(Region::whole(r.shape));
    } else {
      const std::string rule = "tp.models[" + std::to_string(lt0.model) + "]." + lt0.param;
      ACCEL_CHECK(s->dim < int64_t(r.shape.size()), IoError, kOp, "checkpoint '", dir_, "': ", rule,
                  " cuts dimension ", s->dim, " of '", global, "' of ", shape_str(r.shape));
      int64_t along = 0;
      for (int64_t t = 0; t < T; ++t) {
        const auto it = parts[size_t(t)].find(global);
        ACCEL_CHECK(it != parts[size_t(t)].end(), IoError, kOp, "'", path_of(tp_folder(t)),
                    "' holds no '", global, "', which ", rule, " says is cut over tp");
        const LocalTensor& lt = it->second;
        Shape other = lt.shape;
        if (other.size() == r.shape.size()) other[size_t(s->dim)] = r.shape[size_t(s->dim)];
        ACCEL_CHECK(lt.dtype == r.dtype && other == r.shape, IoError, kOp, "'", where(t, lt),
                    "': '", global, "' is ", lt.dtype, " ", shape_str(lt.shape), " but ", r.dtype,
                    " ", shape_str(lt0.shape), " at tp 0");
        along += lt.shape[size_t(s->dim)];
      }
      r.shape[size_t(s->dim)] = along;
      r.layout =
          "tp: Shard(" + std::to_string(s->dim) + ", chunks=" + std::to_string(s->chunks) + ")";
      for (int64_t t = 0; t < T; ++t) {
        const LocalTensor& lt = parts[size_t(t)].at(global);
        Region box;
        try {
          box = Region::whole(r.shape).shard(s->dim, s->chunks, T, t);
        } catch (const Error& e) {
          ACCEL_THROW(IoError, kOp, "checkpoint '", dir_, "': '", global, "' of ",
                      shape_str(r.shape), " does not cut as ", rule, " says: ", e.what());
        }
        ACCEL_CHECK(box.box_shape() == lt.shape, IoError, kOp, "'", where(t, lt), "': '", global,
                    "' is ", shape_str(lt.shape), "; tp index ", t, " of ", T, " of ",
                    shape_str(r.shape), " cut {dim ", s->dim, ", chunks ", s->chunks, "} is ",
                    shape_str(box.box_shape()));
        boxes.push_back(std::move(box));
      }
    }
    if (lt0.flat) r.layout += std::string(r.layout.empty() ? "" : ", ") + "dp_shard: Flat";
    for (size_t t = 0; t < boxes.size(); ++t) {
      const LocalTensor& lt = t == 0 ? lt0 : parts[t].at(global);
      for (const LocalPiece& p : lt.pieces) {
        if (p.entry_numel >= 0)
          slices_[{global, r.pieces.size()}] = Slice{p.entry_offset, p.entry_numel};
        r.pieces.push_back({p.file, p.entry, p.hi < 0 ? boxes[t] : boxes[t].flat(p.lo, p.hi), {}});
      }
    }
    tensors_.emplace(global, std::move(r));
  }
}

// state.json's "aliases": [{alias: name} per model] (Module::tied_aliases(): names of one tensor;
// written since ZeRO-3 shard files keep no record of them). Where one of the two names is a
// tensor here, the other becomes its alias (a plain file keeps the sorted-first name, which may be
// the record's alias: Note [tied tensors in files]); both being tensors (written as copies) adds
// nothing; neither is an IoError naming the field.
void LegacySource::add_aliases(const json& state, const std::string& file, size_t num_models) {
  if (!state.contains("aliases")) return;
  const json& a = state["aliases"];
  if (!a.is_array() || a.size() != num_models)
    bad(file, "aliases", "must list " + std::to_string(num_models) + " object(s)");
  json& known = meta_["aliases"];
  for (size_t m = 0; m < num_models; ++m) {
    const std::string field = "aliases[" + std::to_string(m) + "]";
    if (!a[m].is_object()) bad(file, field, "must be an object");
    for (auto it = a[m].begin(); it != a[m].end(); ++it) {
      if (!it->is_string()) bad(file, field + "." + it.key(), "must be a tensor name");
      const std::string x = names::model(m, it.key()), y = names::model(m, it->get<std::string>());
      const bool hx = tensors_.count(x) != 0, hy = tensors_.count(y) != 0;
      if (!hx && !hy)
        bad(file, field + "." + it.key(),
            "names no tensor of the checkpoint (nor does '" + it->get<std::string>() + "')");
      if (hx && !hy && !known.contains(y)) known[y] = x;
      if (hy && !hx && !known.contains(x)) known[x] = y;
    }
  }
}

// Note [reading a region of a checkpoint] in read_pieces.h, without checksums (format 1 has none).
void LegacySource::read(const std::string& name, const Region& want, const Tensor& dst) {
  const TensorRecord& rec = tensor(name);
  detail::PieceAccess access;
  access.file = [&](const PieceRecord& p) -> const io::SafetensorsFile& {
    return checked_file(name, rec, p);
  };
  access.describe = [&](const PieceRecord& p) {
    return "'" + p.entry + "' in '" + files_[size_t(p.file)] + "'";
  };
  if (!slices_.empty())
    access.entry_offset = [&](const PieceRecord& p) {
      const auto s = slices_.find({name, size_t(&p - rec.pieces.data())});
      return s == slices_.end() ? uint64_t(0) : uint64_t(s->second.offset) * dtype_size(rec.dtype);
    };
  access.window_bytes = kReadWindowBytes;
  detail::read_pieces(dir_, name, rec, want, dst, access);
}

}  // namespace

LegacyContext legacy_context(const std::vector<std::shared_ptr<nn::Module>>& models,
                             const std::vector<const optim::Optimizer*>& optimizers,
                             size_t bucket_cap_bytes) {
  std::map<const void*, std::pair<size_t, std::string>> owner;
  for (size_t m = 0; m < models.size(); ++m)
    for (auto& [name, p] : models[m]->named_parameters())
      owner.emplace(p.impl(), std::make_pair(m, name));
  LegacyContext ctx;
  ctx.bucket_cap_bytes = bucket_cap_bytes;
  for (size_t o = 0; o < optimizers.size(); ++o) {
    std::vector<LegacyParam> ps;
    for (size_t g = 0; g < optimizers[o]->num_param_groups(); ++g)
      for (const Tensor& p : optimizers[o]->params(g)) {
        const auto it = owner.find(p.impl());
        ps.push_back(it == owner.end() ? LegacyParam{0, "", g}
                                       : LegacyParam{it->second.first, it->second.second, g});
      }
    ctx.optimizers.push_back(std::move(ps));
  }
  return ctx;
}

std::unique_ptr<CheckpointSource> open_legacy(const std::string& dir) {
  return std::make_unique<LegacySource>(dir, nullptr);
}

std::unique_ptr<CheckpointSource> open_legacy(const std::string& dir, const LegacyContext& ctx) {
  return std::make_unique<LegacySource>(dir, &ctx);
}

}  // namespace accel::dist::ckpt
