// Sharded ZeRO-3 checkpoints; see dist/fsdp_checkpoint.h, Note [fsdp checkpoints].
#include "dist/fsdp_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "autograd/nn/safetensors.h"
#include "core/error.h"
#include "dist/checkpoint.h"

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
                               const std::vector<FsdpOptimizerRef>& optimizers) {
  NoGradGuard ng;
  const int world = models.empty() ? 1 : models[0]->process_group().size();
  const int rank = models.empty() ? 0 : models[0]->process_group().rank();
  nlohmann::json rec = {{"kind", "fsdp"}, {"world", world}};
  nlohmann::json ms = nlohmann::json::array();
  for (size_t i = 0; i < models.size(); ++i) {
    FullyShardedModel& m = *models[i];
    nn::TensorDict mine;
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
    nn::save_safetensors(f, mine);
    ms.push_back({{"params", ps}});
  }
  rec["models"] = ms;
  nlohmann::json os = nlohmann::json::array();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const std::string f = (fs::path(dir) / fsdp_optimizer_file(i, rank)).string();
    nn::TensorDict d = optimizers[i].stepping->state_dict();
    // Empty slices carry no information; leave them out (the reader knows the spans).
    for (auto it = d.begin(); it != d.end();)
      it = (it->first.rfind("state.", 0) == 0 && it->second.dim() == 1 && it->second.numel() == 0)
               ? d.erase(it)
               : std::next(it);
    nn::save_safetensors(f, d);
    os.push_back({{"params", optimizers[i].param_keys}});
  }
  rec["optimizers"] = os;
  return rec;
}

FsdpCheckpointReader::FsdpCheckpointReader(std::string dir, const nlohmann::json& rec)
    : dir_(std::move(dir)) {
  const std::string where = (fs::path(dir_) / kCheckpointStateFile).string();
  try {
    ACCEL_CHECK(rec.is_object() && rec.value("kind", "") == "fsdp", IoError, "load_state", "'",
                where, "' has no ZeRO-3 record");
    world_ = rec.at("world").get<int>();
    ACCEL_CHECK(world_ >= 1, IoError, "load_state", "'", where, "': world ", world_);
    for (const auto& m : rec.at("models")) {
      std::map<std::string, Param> params;
      std::vector<std::string> order;
      for (const auto& p : m.at("params")) {
        Param pp;
        pp.shape = p.at("shape").get<std::vector<int64_t>>();
        const int64_t n = shape_numel(pp.shape);
        for (const auto& sp : p.at("spans")) {
          const int64_t lo = sp.at(0).get<int64_t>(), hi = sp.at(1).get<int64_t>();
          ACCEL_CHECK(0 <= lo && lo <= hi && hi <= n, IoError, "load_state", "'", where,
                      "': span [", lo, ", ", hi, ") of ", p.at("name").get<std::string>(),
                      " outside its ", n, " elements");
          pp.spans.emplace_back(lo, hi);
        }
        ACCEL_CHECK(int(pp.spans.size()) == world_, IoError, "load_state", "'", where,
                    "': ", pp.spans.size(), " spans for ", world_, " ranks");
        const std::string name = p.at("name").get<std::string>();
        order.push_back(name);
        params.emplace(name, std::move(pp));
      }
      models_.push_back(std::move(params));
      model_order_.push_back(std::move(order));
    }
    for (const auto& o : rec.at("optimizers")) {
      std::vector<std::string> ks = o.at("params").get<std::vector<std::string>>();
      std::map<std::string, Key> km;
      for (size_t k = 0; k < ks.size(); ++k) {
        const size_t colon = ks[k].find(':');
        ACCEL_CHECK(colon != std::string::npos, IoError, "load_state", "'", where, "': bad key '",
                    ks[k], "'");
        Key key{size_t(std::stoul(ks[k].substr(0, colon))), ks[k].substr(colon + 1), k};
        ACCEL_CHECK(key.model < models_.size() && models_[key.model].count(key.name), IoError,
                    "load_state", "'", where, "': optimizer parameter '", ks[k],
                    "' is not a saved parameter");
        km.emplace(ks[k], key);
      }
      optimizers_.push_back(std::move(ks));
      keys_.push_back(std::move(km));
    }
  } catch (const nlohmann::json::exception& e) {
    ACCEL_THROW(IoError, "load_state", "'", where, "': malformed ZeRO-3 record: ", e.what());
  } catch (const std::logic_error& e) {  // stoul
    ACCEL_THROW(IoError, "load_state", "'", where, "': malformed ZeRO-3 record: ", e.what());
  }
}

std::vector<std::string> FsdpCheckpointReader::param_names(size_t model) const {
  ACCEL_CHECK(model < models_.size(), ValueError, "load_state", "the checkpoint holds ",
              models_.size(), " sharded models, not ", model + 1);
  return model_order_[model];
}

bool FsdpCheckpointReader::has_param(size_t model, const std::string& name) const {
  return model < models_.size() && models_[model].count(name);
}

const FsdpCheckpointReader::Param& FsdpCheckpointReader::param(size_t model,
                                                               const std::string& name) const {
  ACCEL_CHECK(has_param(model, name), ValueError, "load_state", "checkpoint '", dir_,
              "' has no sharded parameter '", name, "' for model ", model);
  return models_[model].at(name);
}

Shape FsdpCheckpointReader::shape(size_t model, const std::string& name) const {
  return param(model, name).shape;
}

const nn::TensorDict& FsdpCheckpointReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const std::string path = (fs::path(dir_) / name).string();
    ACCEL_CHECK(fs::exists(path), IoError, "load_state", "checkpoint '", dir_,
                "' lacks shard file '", name, "' (saved by ", world_, " ranks)");
    it = files_.emplace(name, nn::load_safetensors(path)).first;
  }
  return it->second;
}

Tensor FsdpCheckpointReader::assemble(const Param& p, int64_t lo, int64_t hi,
                                      const std::function<std::string(int)>& file_of,
                                      const std::function<std::string(int)>& entry_of) {
  ACCEL_CHECK(0 <= lo && lo <= hi && hi <= shape_numel(p.shape), ValueError, "load_state",
              "range [", lo, ", ", hi, ") outside ", shape_numel(p.shape), " elements");
  Tensor out;
  int64_t covered = 0;
  for (int q = 0; q < world_; ++q) {
    const auto [a, b] = p.spans[size_t(q)];
    const int64_t s = std::max(lo, a), e = std::min(hi, b);
    if (s >= e) continue;
    const std::string fname = file_of(q);
    const nn::TensorDict& d = file(fname);
    auto it = d.find(entry_of(q));
    ACCEL_CHECK(it != d.end() && it->second.numel() == b - a, IoError, "load_state", "'",
                (fs::path(dir_) / fname).string(), "' has no slice '", entry_of(q), "' of ", b - a,
                " elements");
    if (!out.defined()) out = empty({hi - lo}, TensorOptions(it->second.dtype()));
    out.narrow(0, s - lo, e - s).copy_(it->second.reshape({-1}).narrow(0, s - a, e - s));
    covered += e - s;
  }
  ACCEL_CHECK(covered == hi - lo, IoError, "load_state", "checkpoint '", dir_,
              "': the ranks' slices cover ", covered, " of ", hi - lo, " requested elements");
  if (!out.defined()) out = empty({0});
  return out;
}

Tensor FsdpCheckpointReader::param_range(size_t model, const std::string& name, int64_t lo,
                                         int64_t hi) {
  const Param& p = param(model, name);
  return assemble(
      p, lo, hi, [&](int q) { return fsdp_model_file(model, q); }, [&](int) { return name; });
}

Tensor FsdpCheckpointReader::full_param(size_t model, const std::string& name) {
  const Param& p = param(model, name);
  return param_range(model, name, 0, shape_numel(p.shape)).view(p.shape);
}

const std::vector<std::string>& FsdpCheckpointReader::optimizer_keys(size_t opt) const {
  ACCEL_CHECK(opt < optimizers_.size(), ValueError, "load_state", "the checkpoint holds ",
              optimizers_.size(), " sharded optimizers, not ", opt + 1);
  return optimizers_[opt];
}

const FsdpCheckpointReader::Key& FsdpCheckpointReader::key(size_t opt, const std::string& k) const {
  (void)optimizer_keys(opt);
  auto it = keys_[opt].find(k);
  ACCEL_CHECK(it != keys_[opt].end(), ValueError, "load_state", "checkpoint '", dir_,
              "': saved optimizer ", opt, " does not step parameter '", k, "'");
  return it->second;
}

std::vector<std::string> FsdpCheckpointReader::slots(size_t opt, const std::string& k) {
  const Key& ky = key(opt, k);
  const Param& p = param(ky.model, ky.name);
  // Any rank with a non-empty span has every slot of the parameter.
  for (int q = 0; q < world_; ++q) {
    if (p.spans[size_t(q)].second <= p.spans[size_t(q)].first) continue;
    const nn::TensorDict& d = file(fsdp_optimizer_file(opt, q));
    const std::string prefix = "state." + std::to_string(ky.index) + ".";
    std::vector<std::string> out;
    for (auto it = d.lower_bound(prefix); it != d.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      std::string slot = it->first.substr(prefix.size());
      if (slot != "step") out.push_back(slot);
    }
    return out;
  }
  return {};
}

int64_t FsdpCheckpointReader::step(size_t opt, const std::string& k) {
  const Key& ky = key(opt, k);
  const Param& p = param(ky.model, ky.name);
  for (int q = 0; q < world_; ++q) {
    if (p.spans[size_t(q)].second <= p.spans[size_t(q)].first) continue;
    const nn::TensorDict& d = file(fsdp_optimizer_file(opt, q));
    auto it = d.find(state_key(ky.index, "step"));
    return it == d.end() ? 0 : int64_t(it->second.item<double>());
  }
  return 0;
}

Tensor FsdpCheckpointReader::slot_range(size_t opt, const std::string& k, const std::string& slot,
                                        int64_t lo, int64_t hi) {
  const Key& ky = key(opt, k);
  const Param& p = param(ky.model, ky.name);
  return assemble(
      p, lo, hi, [&](int q) { return fsdp_optimizer_file(opt, q); },
      [&](int) { return state_key(ky.index, slot); });
}

nn::TensorDict FsdpCheckpointReader::param_groups(size_t opt) {
  (void)optimizer_keys(opt);
  nn::TensorDict out;
  for (auto& [k, v] : file(fsdp_optimizer_file(opt, 0)))
    if (k.rfind("param_groups.", 0) == 0) out[k] = v;
  return out;
}

namespace {
// Saved lr / weight decay over `own` groups (same group count and sizes, else the optimizer's
// load_state_dict reports the difference).
nn::TensorDict with_saved_groups(const nn::TensorDict& own, const nn::TensorDict& saved) {
  nn::TensorDict out = own;
  for (auto& [k, v] : saved)
    if (k.size() > 3 && (k.ends_with(".lr") || k.ends_with(".weight_decay"))) out[k] = v;
  return out;
}
}  // namespace

nn::TensorDict fsdp_shard_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                          const std::vector<std::string>& keys,
                                          const std::vector<FullyShardedModel*>& models,
                                          const nn::TensorDict& param_groups) {
  nn::TensorDict out = with_saved_groups(param_groups, reader.param_groups(opt));
  std::vector<std::map<std::string, FullyShardedModel::Span>> spans(models.size());
  for (size_t m = 0; m < models.size(); ++m)
    for (auto& sp : models[m]->spans()) spans[m].emplace(sp.name, sp);
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t colon = keys[k].find(':');
    const size_t m = size_t(std::stoul(keys[k].substr(0, colon)));
    const FullyShardedModel::Span& sp = spans.at(m).at(keys[k].substr(colon + 1));
    const std::vector<std::string> slots = reader.slots(opt, keys[k]);
    if (slots.empty()) continue;
    out[state_key(k, "step")] = scalar_tensor(reader.step(opt, keys[k]), TensorOptions(kInt64));
    for (const std::string& slot : slots)
      out[state_key(k, slot)] = reader.slot_range(opt, keys[k], slot, sp.lo, sp.hi);
  }
  return out;
}

nn::TensorDict fsdp_full_optimizer_state(FsdpCheckpointReader& reader, size_t opt,
                                         const std::vector<std::string>& keys,
                                         const nn::TensorDict& param_groups) {
  nn::TensorDict out = with_saved_groups(param_groups, reader.param_groups(opt));
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t colon = keys[k].find(':');
    const size_t m = size_t(std::stoul(keys[k].substr(0, colon)));
    const Shape shape = reader.shape(m, keys[k].substr(colon + 1));
    const std::vector<std::string> slots = reader.slots(opt, keys[k]);
    if (slots.empty()) continue;
    out[state_key(k, "step")] = scalar_tensor(reader.step(opt, keys[k]), TensorOptions(kInt64));
    for (const std::string& slot : slots)
      out[state_key(k, slot)] =
          reader.slot_range(opt, keys[k], slot, 0, shape_numel(shape)).view(shape);
  }
  return out;
}

PlainState read_fsdp_as_plain(const std::string& dir, const nlohmann::json& record,
                              const std::vector<std::shared_ptr<nn::Module>>& models,
                              const std::vector<const optim::Optimizer*>& optimizers) {
  FsdpCheckpointReader reader(dir, record);
  ACCEL_CHECK(reader.num_models() == models.size(), ValueError, "load_state", "checkpoint '", dir,
              "' holds ", reader.num_models(), " sharded models, this run prepared ",
              models.size());
  ACCEL_CHECK(reader.num_optimizers() == optimizers.size(), ValueError, "load_state",
              "checkpoint '", dir, "' holds ", reader.num_optimizers(),
              " sharded optimizers, this run prepared ", optimizers.size());
  PlainState out;
  std::unordered_map<const TensorImpl*, std::string> key_of;
  for (size_t m = 0; m < models.size(); ++m) {
    nn::TensorDict d = nn::load_safetensors((fs::path(dir) / fsdp_replicated_file(m)).string());
    for (const std::string& name : reader.param_names(m)) d[name] = reader.full_param(m, name);
    out.models.push_back(std::move(d));
    for (auto& [name, p] : models[m]->named_parameters())
      key_of.emplace(p.impl(), std::to_string(m) + ":" + name);
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const optim::Optimizer& o = *optimizers[i];
    std::vector<std::string> keys;
    for (size_t g = 0; g < o.num_param_groups(); ++g)
      for (const Tensor& p : o.params(g)) {
        auto it = key_of.find(p.impl());
        ACCEL_CHECK(it != key_of.end(), ValueError, "load_state", "optimizer ", i,
                    " steps a tensor of shape ", p.shape_str(),
                    " that is no parameter of a prepared model");
        keys.push_back(it->second);
      }
    nn::TensorDict own;
    for (auto& [k, v] : o.state_dict())
      if (k.rfind("param_groups.", 0) == 0) own[k] = v;
    out.optimizers.push_back(fsdp_full_optimizer_state(reader, i, keys, own));
  }
  return out;
}

}  // namespace accel::dist
