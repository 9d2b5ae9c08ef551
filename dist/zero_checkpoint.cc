// ZeRO checkpoint files and re-sharding; see dist/zero_checkpoint.h (Note [zero checkpoints]).
#include "dist/zero_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "autograd/nn/safetensors.h"
#include "core/error.h"
#include "dist/checkpoint.h"

namespace accel::dist::zero_ckpt {

namespace fs = std::filesystem;

namespace {

std::string indexed_rank(const char* stem, size_t i, int rank) {
  std::string s = i == 0 ? std::string(stem) : std::string(stem) + "_" + std::to_string(i);
  return s + "_rank" + std::to_string(rank) + ".safetensors";
}

// One optimizer state as flat per-bucket arrays, whatever way it is stored.
class FlatStateSource {
 public:
  virtual ~FlatStateSource() = default;
  // Slot names with state in bucket b (empty: the bucket never stepped) and its step count.
  // `near` is an element of the bucket the caller will read (to open the right file first).
  virtual std::vector<std::string> slots(size_t b, int64_t near) = 0;
  virtual int64_t step(size_t b, int64_t near) = 0;
  // dst (hi - lo elements) := elements [lo, hi) of slot `slot` of bucket b, hi <= used(b).
  virtual void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) = 0;
};

std::string state_key(size_t i, const std::string& slot) {
  return "state." + std::to_string(i) + "." + slot;
}

// Slot names of "state.<i>.<slot>" keys (without "step").
std::vector<std::string> slots_of(const nn::TensorDict& d, size_t i) {
  const std::string prefix = "state." + std::to_string(i) + ".";
  std::vector<std::string> out;
  for (auto it = d.lower_bound(prefix); it != d.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    std::string slot = it->first.substr(prefix.size());
    if (slot != "step" && slot.find('.') == std::string::npos) out.push_back(slot);
  }
  return out;
}

int64_t step_of(const nn::TensorDict& d, size_t i) {
  auto it = d.find(state_key(i, "step"));
  return it == d.end() ? 0 : int64_t(it->second.item<double>());
}

// The per-rank files of a ZeRO checkpoint (opened lazily, each once).
class ZeroFileSource final : public FlatStateSource {
 public:
  ZeroFileSource(std::function<std::string(int)> file_of, int world, std::vector<int64_t> numel)
      : file_of_(std::move(file_of)), world_(world), numel_(std::move(numel)) {}
  std::vector<std::string> slots(size_t b, int64_t near) override {
    return slots_of(file(owner(b, near)), b);
  }
  int64_t step(size_t b, int64_t near) override { return step_of(file(owner(b, near)), b); }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const int64_t sn = numel_[b] / world_;
    for (int64_t q = lo / sn; q < world_ && q * sn < hi; ++q) {
      const int64_t a = std::max(lo, q * sn), e = std::min(hi, (q + 1) * sn);
      if (a >= e) continue;
      const nn::TensorDict& d = file(int(q));
      auto it = d.find(state_key(b, slot));
      ACCEL_CHECK(it != d.end() && it->second.numel() == sn, IoError, "load_state", "'",
                  file_of_(int(q)), "' has no slice of ", state_key(b, slot), " with ", sn,
                  " elements");
      dst.narrow(0, a - lo, e - a).copy_(it->second.reshape({-1}).narrow(0, a - q * sn, e - a));
    }
  }
  int64_t numel(size_t b) const { return numel_[b]; }

 private:
  int owner(size_t b, int64_t near) const {
    return int(std::min<int64_t>(near / (numel_[b] / world_), world_ - 1));
  }
  const nn::TensorDict& file(int q) {
    auto it = files_.find(q);
    if (it == files_.end()) it = files_.emplace(q, nn::load_safetensors(file_of_(q))).first;
    return it->second;
  }
  std::function<std::string(int)> file_of_;
  int world_;
  std::vector<int64_t> numel_;
  std::map<int, nn::TensorDict> files_;
};

// A plain optimizer's per-parameter state (state.<k>.<slot>) laid out in buckets.
class PlainSource final : public FlatStateSource {
 public:
  PlainSource(const nn::TensorDict& d, std::vector<Bucket> buckets)
      : d_(d), buckets_(std::move(buckets)) {}
  std::vector<std::string> slots(size_t b, int64_t) override {
    std::vector<std::string> out;
    for (size_t k : buckets_[b].params)
      for (auto& s : slots_of(d_, k))
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return out;
  }
  int64_t step(size_t b, int64_t) override {
    int64_t st = 0;
    for (size_t k : buckets_[b].params) st = std::max(st, step_of(d_, k));
    return st;
  }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const Bucket& bk = buckets_[b];
    dst.zero_();  // a parameter without this slot (never stepped) contributes zeros
    for (size_t j = 0; j < bk.params.size(); ++j) {
      auto it = d_.find(state_key(bk.params[j], slot));
      if (it == d_.end()) continue;
      const int64_t off = bk.offset[j], n = it->second.numel();
      const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
      if (a < e)
        dst.narrow(0, a - lo, e - a).copy_(it->second.reshape({-1}).narrow(0, a - off, e - a));
    }
  }

 private:
  const nn::TensorDict& d_;
  std::vector<Bucket> buckets_;
};

// Shard-optimizer state for rank r of `buckets` (the new layout) from `src`.
nn::TensorDict shard_state(FlatStateSource& src, const std::vector<Bucket>& buckets, int r,
                           const nn::TensorDict& param_groups) {
  nn::TensorDict out = param_groups;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    const int64_t lo = r * bk.shard_numel, hi = std::min(lo + bk.shard_numel, bk.used);
    std::vector<std::string> slots = src.slots(b, std::min(lo, bk.used - 1));
    if (slots.empty()) continue;
    out[state_key(b, "step")] =
        scalar_tensor(src.step(b, std::min(lo, bk.used - 1)), TensorOptions(kInt64));
    for (const std::string& slot : slots) {
      Tensor t = zeros({bk.shard_numel});
      if (lo < hi) src.read(b, slot, lo, hi, t.narrow(0, 0, hi - lo));
      out[state_key(b, slot)] = t;
    }
  }
  return out;
}

// Plain per-parameter state for `params` laid out in `buckets` from `src`.
nn::TensorDict unsharded_state(FlatStateSource& src, const std::vector<Bucket>& buckets,
                               const std::vector<Tensor>& params,
                               const nn::TensorDict& param_groups) {
  nn::TensorDict out = param_groups;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    std::vector<std::string> slots = src.slots(b, 0);
    if (slots.empty()) continue;
    const int64_t st = src.step(b, 0);
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const size_t k = bk.params[j];
      const Tensor& p = params[k];
      out[state_key(k, "step")] = scalar_tensor(st, TensorOptions(kInt64));
      for (const std::string& slot : slots) {
        Tensor t = zeros({p.numel()});
        src.read(b, slot, bk.offset[j], bk.offset[j] + p.numel(), t);
        out[state_key(k, slot)] = t.view(p.sizes());
      }
    }
  }
  return out;
}

// The bucket layout of an optimizer in the checkpoint, checked against `buckets` (this run's
// layout of the same parameters).
std::vector<int64_t> saved_numel(const nlohmann::json& layout, const std::vector<Bucket>& buckets,
                                 const std::string& path) {
  const auto& saved = layout.at("buckets");
  bool same = saved.size() == buckets.size();
  std::vector<int64_t> numel;
  for (size_t b = 0; same && b < buckets.size(); ++b) {
    same = saved[b].at(0).get<int64_t>() == buckets[b].used;
    numel.push_back(saved[b].at(1).get<int64_t>());
  }
  ACCEL_CHECK(same, ValueError, "load_state", "checkpoint '", path, "' holds ZeRO state in ",
              saved.size(), " buckets that do not match this run's ", buckets.size(),
              " (the parameters, their param groups or ddp.bucket_cap_bytes differ)");
  return numel;
}

}  // namespace

std::string shard_file(size_t optimizer, int rank) {
  return indexed_rank("zero_optimizer", optimizer, rank);
}
std::string accum_file(size_t optimizer, int rank) {
  return indexed_rank("zero_grads", optimizer, rank);
}

nlohmann::json layout(const ZeroOptimizer& zero) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const Bucket& bk : zero.buckets()) buckets.push_back({bk.used, bk.numel});
  return {{"stage", zero.stage()}, {"buckets", buckets}};
}

void check_record(const nlohmann::json& s, size_t num_optimizers, const std::string& file) {
  if (!s.is_object() || !s.contains("zero")) return;
  const nlohmann::json& z = s["zero"];
  bool well_formed = z.is_array() && z.size() == num_optimizers;
  for (size_t i = 0; well_formed && i < z.size(); ++i) {
    const nlohmann::json& e = z[i];
    if (e.is_null()) continue;
    well_formed = e.is_object() && e.contains("buckets") && e["buckets"].is_array();
    if (!well_formed) break;
    for (const auto& b : e["buckets"])
      well_formed = well_formed && b.is_array() && b.size() == 2 && b[0].is_number_integer() &&
                    b[1].is_number_integer() && b[1].get<int64_t>() > 0;
  }
  ACCEL_CHECK(well_formed, IoError, "load_state", "'", file, "': malformed ZeRO layout");
}

const nlohmann::json* layout_of(const nlohmann::json& s, size_t optimizer) {
  if (!s.is_object() || !s.contains("zero")) return nullptr;
  const nlohmann::json& e = s["zero"].at(optimizer);
  return e.is_null() ? nullptr : &e;
}

nn::TensorDict param_groups_of(const nn::TensorDict& d) {
  nn::TensorDict out;
  for (auto& [k, v] : d)
    if (k.rfind("param_groups.", 0) == 0) out[k] = v;
  return out;
}

nn::TensorDict read_shard_state(const std::string& dir, size_t i,
                                const nlohmann::json* saved_layout, int saved_world,
                                const nn::TensorDict& plain, const ZeroOptimizer& zero, int rank) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  const std::vector<Bucket>& buckets = zero.buckets();
  if (!saved_layout) {
    PlainSource src(plain, buckets);
    return shard_state(src, buckets, rank, {});
  }
  std::vector<int64_t> numel = saved_numel(*saved_layout, buckets, dir);
  // The same world size: the same padding and slices, this rank's file as it is.
  bool same = true;
  for (size_t b = 0; b < buckets.size(); ++b)
    same = same && numel[b] == buckets[b].numel && numel[b] / saved_world == buckets[b].shard_numel;
  if (same) return nn::load_safetensors(at(shard_file(i, rank)));  // the same slices
  ZeroFileSource src([&](int q) { return at(shard_file(i, q)); }, saved_world, numel);
  return shard_state(src, buckets, rank, {});
}

nn::TensorDict read_unsharded_state(const std::string& dir, size_t i,
                                    const nlohmann::json& saved_layout, int saved_world,
                                    const optim::Optimizer& user, const nn::TensorDict& saved,
                                    size_t cap_bytes) {
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  NamedParams named;
  std::vector<size_t> group_of;
  std::vector<Tensor> params;
  for (size_t g = 0; g < user.num_param_groups(); ++g)
    for (const Tensor& p : user.params(g)) {
      named.emplace_back("p", p);
      group_of.push_back(g);
      params.push_back(p);
    }
  const std::vector<Bucket> buckets = assign_buckets(
      named, cap_bytes, 1, user.num_param_groups() > 1 ? group_of : std::vector<size_t>{});
  std::vector<int64_t> numel = saved_numel(saved_layout, buckets, dir);
  ZeroFileSource src([&](int q) { return at(shard_file(i, q)); }, saved_world, numel);
  return unsharded_state(src, buckets, params, param_groups_of(saved));
}

std::vector<Tensor> read_accum(const std::string& dir, size_t i, int rank,
                               const ZeroOptimizer& zero) {
  std::vector<Tensor> out;
  // Stage 1 keeps a window in the parameters' .grad, unless mixed precision accumulates shards.
  if (zero.stage() < 2 && !zero.mixed_precision()) return out;
  const std::string f = (fs::path(dir) / accum_file(i, rank)).string();
  if (!fs::exists(f)) return out;
  nn::TensorDict g = nn::load_safetensors(f);
  const std::vector<Tensor> shards = zero.gradient_shards();
  for (size_t b = 0; b < shards.size(); ++b) {
    auto it = g.find("bucket." + std::to_string(b));
    ACCEL_CHECK(it != g.end() && it->second.numel() == shards[b].numel(), IoError, "load_state",
                "'", f, "' has no gradient shard for bucket ", b);
    out.push_back(it->second.to(shards[b].device(), shards[b].dtype()));
  }
  return out;
}

void write_accum(const std::string& dir, size_t i, int rank, const std::vector<Tensor>& accum) {
  if (accum.empty()) return;
  nn::TensorDict g;
  for (size_t b = 0; b < accum.size(); ++b) g["bucket." + std::to_string(b)] = accum[b];
  const std::string f = (fs::path(dir) / accum_file(i, rank)).string();
  nn::save_safetensors(f, g);
  fsync_path(f);
}

}  // namespace accel::dist::zero_ckpt
