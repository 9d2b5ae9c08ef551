// Sharded ZeRO-3 checkpoints; see parallel/fsdp_checkpoint.h, Note [fsdp checkpoints].
#include "parallel/fsdp_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "io/safetensors.h"
#include "core/error.h"
#include "parallel/checkpoint_files.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {
std::string indexed(const char* stem, size_t i) {
  return i == 0 ? std::string(stem) : std::string(stem) + "_" + std::to_string(i);
}
std::string state_key(size_t k, const std::string& slot) {
  return "state." + std::to_string(k) + "." + slot;
}
}  // namespace

std::string fsdp_model_file(size_t model, int rank) {
  return indexed("fsdp_model", model) + "_rank" + std::to_string(rank) + ".safetensors";
}
std::string fsdp_optimizer_file(size_t opt, int rank) {
  return indexed("fsdp_optimizer", opt) + "_rank" + std::to_string(rank) + ".safetensors";
}

std::string fsdp_replicated_file(size_t model) { return indexed("model", model) + ".safetensors"; }

nlohmann::json save_fsdp_state(const std::string& dir,
                               const std::vector<FullyShardedModel*>& models,
                               const std::vector<FsdpOptimizerRef>& optimizers, bool write) {
  NoGradGuard ng;
  const int world = models.empty() ? 1 : models[0]->process_group().size();
  const int rank = models.empty() ? 0 : models[0]->process_group().rank();
  nlohmann::json rec = {{"kind", "fsdp"}, {"world", world}};
  const ProcessGroupPtr rep = models.empty() ? ProcessGroupPtr() : models[0]->replicate_group();
  if (rep && rep->size() > 1) rec["replicate"] = rep->size();
  nlohmann::json ms = nlohmann::json::array();
  for (size_t i = 0; i < models.size(); ++i) {
    FullyShardedModel& m = *models[i];
    io::TensorDict mine;
    const auto own = m.spans();
    std::vector<std::vector<FullyShardedModel::Span>> all;
    for (int q = 0; q < world; ++q) all.push_back(m.spans(q));
    nlohmann::json ps = nlohmann::json::array();
    for (size_t k = 0; k < own.size(); ++k) {
      if (own[k].hi > own[k].lo) mine[own[k].name] = m.shard_params()[k].detach();
      nlohmann::json spans = nlohmann::json::array();
      for (int q = 0; q < world; ++q) spans.push_back({all[size_t(q)][k].lo, all[size_t(q)][k].hi});
      ps.push_back({{"name", own[k].name}, {"shape", own[k].shape}, {"spans", spans}});
    }
    const std::string f = (fs::path(dir) / fsdp_model_file(i, rank)).string();
    if (write) io::save_safetensors(f, mine);
    ms.push_back({{"params", ps}});
  }
  rec["models"] = ms;
  nlohmann::json os = nlohmann::json::array();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    os.push_back({{"params", optimizers[i].param_keys}});
    if (!write) continue;
    const std::string f = (fs::path(dir) / fsdp_optimizer_file(i, rank)).string();
    io::TensorDict d = optimizers[i].stepping->state_dict();
    // Empty slices carry no information; leave them out (the reader knows the spans).
    for (auto it = d.begin(); it != d.end();)
      it = (it->first.rfind("state.", 0) == 0 && it->second.dim() == 1 && it->second.numel() == 0)
               ? d.erase(it)
               : std::next(it);
    io::save_safetensors(f, d);
  }
  rec["optimizers"] = os;
  return rec;
}

FsdpCheckpointReader::FsdpCheckpointReader(std::string dir, const nlohmann::json& rec,
                                           int saved_world)
    : dir_(std::move(dir)),
      rec_(ckpt_records::parse_fsdp_record(rec, saved_world,
                                           (fs::path(dir_) / kCheckpointStateFile).string())) {
  for (const auto& params : rec_.models) {
    std::map<std::string, size_t> idx;
    for (size_t k = 0; k < params.size(); ++k) idx.emplace(params[k].name, k);
    index_.push_back(std::move(idx));
  }
  for (size_t i = 0; i < rec_.optimizers.size(); ++i) {
    std::map<std::string, Key> km;
    for (size_t k = 0; k < rec_.optimizers[i].size(); ++k)
      km.emplace(rec_.optimizer_keys[i][k],
                 Key{rec_.optimizers[i][k].model, rec_.optimizers[i][k].name, k});
    keys_.push_back(std::move(km));
  }
}

FsdpCheckpointReader::~FsdpCheckpointReader() = default;

std::vector<std::string> FsdpCheckpointReader::param_names(size_t model) const {
  ACCEL_CHECK(model < rec_.models.size(), ValueError, "load_state", "the checkpoint holds ",
              rec_.models.size(), " sharded models, not ", model + 1);
  std::vector<std::string> out;
  for (const auto& p : rec_.models[model]) out.push_back(p.name);
  return out;
}

bool FsdpCheckpointReader::has_param(size_t model, const std::string& name) const {
  return model < index_.size() && index_[model].count(name);
}

const ckpt_records::FsdpParamRecord& FsdpCheckpointReader::param(size_t model,
                                                                 const std::string& name) const {
  ACCEL_CHECK(has_param(model, name), ValueError, "load_state", "checkpoint '", dir_,
              "' has no sharded parameter '", name, "' for model ", model);
  return rec_.models[model][index_[model].at(name)];
}

Shape FsdpCheckpointReader::shape(size_t model, const std::string& name) const {
  Shape s;
  for (int64_t d : param(model, name).shape) s.push_back(d);
  return s;
}

const io::SafetensorsFile& FsdpCheckpointReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const std::string path = (fs::path(dir_) / name).string();
    ACCEL_CHECK(fs::exists(path), IoError, "load_state", "checkpoint '", dir_,
                "' lacks shard file '", name, "' (saved by ", rec_.world, " ranks)");
    it = files_.emplace(name, std::make_unique<io::SafetensorsFile>(path)).first;
  }
  return *it->second;
}

int FsdpCheckpointReader::holder(const ckpt_records::FsdpParamRecord& p, int64_t near) const {
  int first = -1;
  for (int q = 0; q < int(p.spans.size()); ++q) {
    const auto [a, b] = p.spans[size_t(q)];
    if (b <= a) continue;
    if (a <= near && near < b) return q;
    if (first < 0) first = q;
  }
  return first;
}

void FsdpCheckpointReader::assemble(const ckpt_records::FsdpParamRecord& p, int64_t lo, int64_t hi,
                                    const std::function<std::string(int)>& file_of,
                                    const std::string& entry, const Tensor& dst) {
  ACCEL_CHECK(0 <= lo && lo <= hi && hi <= p.numel, ValueError, "load_state", "range [", lo, ", ",
              hi, ") outside the ", p.numel, " elements of '", p.name, "'");
  ACCEL_CHECK(dst.defined() && dst.numel() == hi - lo && dst.is_contiguous(), ValueError,
              "load_state", "reading ", hi - lo, " elements of '", p.name,
              "' needs a contiguous destination of as many elements");
  const Tensor flat = dst.view({hi - lo});
  // The spans tile [0, numel) (checked with the record): every element comes from one rank.
  for (int q = 0; q < int(p.spans.size()); ++q) {
    const auto [a, b] = p.spans[size_t(q)];
    const int64_t s = std::max(lo, a), e = std::min(hi, b);
    if (s >= e) continue;
    const io::SafetensorsFile& f = file(file_of(q));
    ACCEL_CHECK(f.contains(entry), IoError, "load_state", "'", f.path(), "' has no slice '", entry,
                "' of ", b - a, " elements (the record gives rank ", q, " elements [", a, ", ", b,
                ") of '", p.name, "')");
    const io::SafetensorsFile::Info& in = f.info(entry);
    ACCEL_CHECK(in.numel == b - a && is_floating(in.dtype), IoError, "load_state", "'", f.path(),
                "': slice '", entry, "' is ", in.dtype, " ", shape_str(in.shape), ", expected ",
                b - a, " floating-point elements");
    f.read_range(entry, s - a, e - a, flat.narrow(0, s - lo, e - s));
  }
}

DType FsdpCheckpointReader::saved_dtype(const ckpt_records::FsdpParamRecord& p, int64_t lo,
                                        const std::function<std::string(int)>& file_of,
                                        const std::string& entry) {
  const int q = holder(p, lo);
  if (q < 0) return kFloat32;  // an empty parameter
  const io::SafetensorsFile& f = file(file_of(q));
  return f.contains(entry) ? f.info(entry).dtype : kFloat32;  // a missing one fails in assemble
}

void FsdpCheckpointReader::read_param(size_t model, const std::string& name, int64_t lo, int64_t hi,
                                      const Tensor& dst) {
  assemble(
      param(model, name), lo, hi, [&](int q) { return fsdp_model_file(model, q); }, name, dst);
}

Tensor FsdpCheckpointReader::param_range(size_t model, const std::string& name, int64_t lo,
                                         int64_t hi) {
  const ckpt_records::FsdpParamRecord& p = param(model, name);
  auto file_of = [&](int q) { return fsdp_model_file(model, q); };
  Tensor out =
      empty({std::max<int64_t>(hi - lo, 0)}, TensorOptions(saved_dtype(p, lo, file_of, name)));
  assemble(p, lo, hi, file_of, name, out);
  return out;
}

Tensor FsdpCheckpointReader::full_param(size_t model, const std::string& name) {
  const ckpt_records::FsdpParamRecord& p = param(model, name);
  return param_range(model, name, 0, p.numel).view(shape(model, name));
}

const std::vector<std::string>& FsdpCheckpointReader::optimizer_keys(size_t opt) const {
  ACCEL_CHECK(opt < rec_.optimizers.size(), ValueError, "load_state", "the checkpoint holds ",
              rec_.optimizers.size(), " sharded optimizers, not ", opt + 1);
  return rec_.optimizer_keys[opt];
}

const FsdpCheckpointReader::Key& FsdpCheckpointReader::key(size_t opt, const std::string& k) const {
  (void)optimizer_keys(opt);
  auto it = keys_[opt].find(k);
  ACCEL_CHECK(it != keys_[opt].end(), ValueError, "load_state", "checkpoint '", dir_,
              "': saved optimizer ", opt, " does not step parameter '", k, "'");
  return it->second;
}

std::vector<std::string> FsdpCheckpointReader::slots(size_t opt, const std::string& k,
                                                     int64_t near) {
  const Key& ky = key(opt, k);
  // Any rank with a non-empty span has every slot of the parameter: ask the one this reader
  // reads from anyway.
  const int q = holder(param(ky.model, ky.name), near);
  if (q < 0) return {};
  const io::SafetensorsFile& f = file(fsdp_optimizer_file(opt, q));
  const std::string prefix = "state." + std::to_string(ky.index) + ".";
  std::vector<std::string> out;
  for (const std::string& name : f.names(prefix)) {
    std::string slot = name.substr(prefix.size());
    if (slot != "step" && slot.find('.') == std::string::npos) out.push_back(slot);
  }
  return out;
}

int64_t FsdpCheckpointReader::step(size_t opt, const std::string& k, int64_t near) {
  const Key& ky = key(opt, k);
  const int q = holder(param(ky.model, ky.name), near);
  if (q < 0) return 0;
  const io::SafetensorsFile& f = file(fsdp_optimizer_file(opt, q));
  const std::string entry = state_key(ky.index, "step");
  if (!f.contains(entry)) return 0;
  const io::SafetensorsFile::Info& in = f.info(entry);
  ACCEL_CHECK(in.numel == 1 && !is_floating(in.dtype) && in.dtype != kBool, IoError, "load_state",
              "'", f.path(), "': ", entry, " must be one integer, got ", in.dtype, " ",
              shape_str(in.shape));
  const int64_t st = f.read(entry).to(kInt64).item<int64_t>();
  ACCEL_CHECK(st >= 0, IoError, "load_state", "'", f.path(), "': ", entry, " is ", st);
  return st;
}

void FsdpCheckpointReader::read_slot(size_t opt, const std::string& k, const std::string& slot,
                                     int64_t lo, int64_t hi, const Tensor& dst) {
  const Key& ky = key(opt, k);
  assemble(
      param(ky.model, ky.name), lo, hi, [&](int q) { return fsdp_optimizer_file(opt, q); },
      state_key(ky.index, slot), dst);
}

Tensor FsdpCheckpointReader::slot_range(size_t opt, const std::string& k, const std::string& slot,
                                        int64_t lo, int64_t hi) {
  const Key& ky = key(opt, k);
  const ckpt_records::FsdpParamRecord& p = param(ky.model, ky.name);
  auto file_of = [&](int q) { return fsdp_optimizer_file(opt, q); };
  const std::string entry = state_key(ky.index, slot);
  Tensor out =
      empty({std::max<int64_t>(hi - lo, 0)}, TensorOptions(saved_dtype(p, lo, file_of, entry)));
  assemble(p, lo, hi, file_of, entry, out);
  return out;
}

io::TensorDict FsdpCheckpointReader::param_groups(size_t opt) {
  (void)optimizer_keys(opt);
  io::TensorDict out;
  const io::SafetensorsFile& f = file(fsdp_optimizer_file(opt, 0));
  for (const std::string& k : f.names("param_groups.")) out[k] = f.read(k);
  return out;
}

namespace {
// Saved lr / weight decay over `own` groups (same group count and sizes, else the optimizer's
// load_state_dict reports the difference).
io::TensorDict with_saved_groups(const io::TensorDict& own, const io::TensorDict& saved) {
  io::TensorDict out = own;
  for (auto& [k, v] : saved)
    if (k.size() > 3 && (k.ends_with(".lr") || k.ends_with(".weight_decay"))) out[k] = v;
  return out;
}
}  // namespace

io::TensorDict fsdp_shard_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                          const std::vector<std::string>& keys,
                                          const std::vector<FullyShardedModel*>& models,
                                          const io::TensorDict& param_groups) {
  io::TensorDict out = with_saved_groups(param_groups, reader.param_groups(opt));
  // Per model: name -> (span, shard leaf).
  std::vector<std::map<std::string, std::pair<FullyShardedModel::Span, Tensor>>> at(models.size());
  for (size_t m = 0; m < models.size(); ++m) {
    const auto spans = models[m]->spans();
    for (size_t k = 0; k < spans.size(); ++k)
      at[m].emplace(spans[k].name, std::make_pair(spans[k], models[m]->shard_params()[k]));
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t colon = keys[k].find(':');
    const size_t m = size_t(std::stoul(keys[k].substr(0, colon)));
    const auto& [sp, leaf] = at.at(m).at(keys[k].substr(colon + 1));
    const std::vector<std::string> slots = reader.slots(opt, keys[k], sp.lo);
    if (slots.empty()) continue;
    out[state_key(k, "step")] =
        scalar_tensor(reader.step(opt, keys[k], sp.lo), TensorOptions(kInt64));
    for (const std::string& slot : slots) {
      // In the leaf's dtype and on its device: the optimizer keeps it as it is.
      Tensor t = empty({sp.hi - sp.lo}, TensorOptions(leaf.dtype(), leaf.device()));
      reader.read_slot(opt, keys[k], slot, sp.lo, sp.hi, t);
      out[state_key(k, slot)] = t;
    }
  }
  return out;
}

io::TensorDict fsdp_full_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                         const std::vector<std::string>& keys,
                                         const std::vector<Tensor>& params,
                                         const io::TensorDict& param_groups) {
  ACCEL_CHECK(params.size() == keys.size(), ValueError, "load_state", keys.size(), " keys for ",
              params.size(), " parameters");
  io::TensorDict out = with_saved_groups(param_groups, reader.param_groups(opt));
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t colon = keys[k].find(':');
    const size_t m = size_t(std::stoul(keys[k].substr(0, colon)));
    const Shape shape = reader.shape(m, keys[k].substr(colon + 1));
    const std::vector<std::string> slots = reader.slots(opt, keys[k]);
    if (slots.empty()) continue;
    out[state_key(k, "step")] = scalar_tensor(reader.step(opt, keys[k]), TensorOptions(kInt64));
    for (const std::string& slot : slots) {
      Tensor t = empty(shape, TensorOptions(params[k].dtype(), params[k].device()));
      reader.read_slot(opt, keys[k], slot, 0, shape_numel(shape), t);
      out[state_key(k, slot)] = t;
    }
  }
  return out;
}

PlainState read_fsdp_as_plain(const std::string& dir, const nlohmann::json& record, int saved_world,
                              const std::vector<std::shared_ptr<nn::Module>>& models,
                              const std::vector<const optim::Optimizer*>& optimizers) {
  FsdpCheckpointReader reader(dir, record, saved_world);
  ACCEL_CHECK(reader.num_models() == models.size(), ValueError, "load_state", "checkpoint '", dir,
              "' holds ", reader.num_models(), " sharded models, this run prepared ",
              models.size());
  ACCEL_CHECK(reader.num_optimizers() == optimizers.size(), ValueError, "load_state",
              "checkpoint '", dir, "' holds ", reader.num_optimizers(),
              " sharded optimizers, this run prepared ", optimizers.size());
  PlainState out;
  std::unordered_map<const TensorImpl*, std::string> key_of;
  for (size_t m = 0; m < models.size(); ++m) {
    io::TensorDict d = io::load_safetensors((fs::path(dir) / fsdp_replicated_file(m)).string());
    std::map<std::string, Tensor> own;
    for (auto& [name, p] : models[m]->named_parameters()) own.emplace(name, p);
    for (const std::string& name : reader.param_names(m)) {
      const Shape shape = reader.shape(m, name);
      auto it = own.find(name);
      // A parameter the model lacks or has in another shape: read as saved, so that the
      // model's load_state_dict names the mismatch.
      Tensor t = it != own.end() && it->second.sizes() == shape
                     ? empty(shape, TensorOptions(it->second.dtype(), it->second.device()))
                     : empty(shape, TensorOptions(reader.param_range(m, name, 0, 0).dtype()));
      reader.read_param(m, name, 0, shape_numel(shape), t);
      d[name] = t;
    }
    out.models.push_back(std::move(d));
    for (auto& [name, p] : models[m]->named_parameters())
      key_of.emplace(p.impl(), std::to_string(m) + ":" + name);
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const optim::Optimizer& o = *optimizers[i];
    std::vector<std::string> keys;
    std::vector<Tensor> params;
    for (size_t g = 0; g < o.num_param_groups(); ++g)
      for (const Tensor& p : o.params(g)) {
        auto it = key_of.find(p.impl());
        ACCEL_CHECK(it != key_of.end(), ValueError, "load_state", "optimizer ", i,
                    " steps a tensor of shape ", p.shape_str(),
                    " that is no parameter of a prepared model");
        keys.push_back(it->second);
        params.push_back(p);
      }
    io::TensorDict own;
    for (auto& [k, v] : o.state_dict())
      if (k.rfind("param_groups.", 0) == 0) own[k] = v;
    out.optimizers.push_back(fsdp_full_optimizer_state(reader, i, keys, params, own));
  }
  return out;
}

}  // namespace accel::dist
