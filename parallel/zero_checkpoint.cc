// ZeRO checkpoint files and re-sharding; see parallel/zero_checkpoint.h (Note [zero checkpoints]).
#include "parallel/zero_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "core/error.h"
#include "parallel/checkpoint_files.h"

namespace accel::dist::zero_ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "load_state";

std::string indexed_rank(const char* stem, size_t i, int rank) {
  std::string s = i == 0 ? std::string(stem) : std::string(stem) + "_" + std::to_string(i);
  return s + "_rank" + std::to_string(rank) + ".safetensors";
}

std::string state_key(size_t i, const std::string& slot) {
  return "state." + std::to_string(i) + "." + slot;
}

// Slot names of "state.<i>.<slot>" tensors of an optimizer file (without "step").
std::vector<std::string> slots_in(const io::SafetensorsFile& f, size_t i) {
  const std::string prefix = "state." + std::to_string(i) + ".";
  std::vector<std::string> out;
  for (const std::string& k : f.names(prefix)) {
    std::string slot = k.substr(prefix.size());
    if (slot != "step" && slot.find('.') == std::string::npos) out.push_back(slot);
  }
  return out;
}

// The step count "state.<i>.step" (0 when absent): one non-negative integer.
int64_t step_in(const io::SafetensorsFile& f, size_t i) {
  const std::string key = state_key(i, "step");
  if (!f.contains(key)) return 0;
  const io::SafetensorsFile::Info& in = f.info(key);
  ACCEL_CHECK(in.numel == 1 && !is_floating(in.dtype) && in.dtype != kBool, IoError, kOp, "'",
              f.path(), "': ", key, " must be one integer, got ", in.dtype, " ",
              shape_str(in.shape));
  const int64_t st = f.read(key).to(kInt64).item<int64_t>();
  ACCEL_CHECK(st >= 0, IoError, kOp, "'", f.path(), "': ", key, " is ", st);
  return st;
}

// A slot slice must be floating and hold `n` elements.
void check_slot(const io::SafetensorsFile& f, const std::string& key, int64_t n) {
  const io::SafetensorsFile::Info& in = f.info(key);
  ACCEL_CHECK(in.numel == n && is_floating(in.dtype), IoError, kOp, "'", f.path(), "': ", key,
              " is ", in.dtype, " ", shape_str(in.shape), ", expected ", n,
              " floating-point elements");
}

// One optimizer state as flat per-bucket arrays, whatever way it is stored.
class FlatStateSource {
 public:
  virtual ~FlatStateSource() = default;
  // Slot names with state in bucket b (empty: the bucket never stepped) and its step count.
  // `near` is an element of the bucket the caller will read (to open the right file first).
  virtual std::vector<std::string> slots(size_t b, int64_t near) = 0;
  virtual int64_t step(size_t b, int64_t near) = 0;
  // dst (hi - lo elements, contiguous) := elements [lo, hi) of slot `slot` of bucket b,
  // hi <= used(b).
  virtual void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) = 0;
};

// The per-rank files of a ZeRO checkpoint, opened lazily (headers only; ranges read on demand).
class ZeroFileSource final : public FlatStateSource {
 public:
  // numel[b] is a checked multiple of `world` (Note [checkpoint record validation]).
  ZeroFileSource(std::function<std::string(int)> file_of, int world, std::vector<int64_t> numel)
      : file_of_(std::move(file_of)), world_(world), numel_(std::move(numel)) {}
  std::vector<std::string> slots(size_t b, int64_t near) override {
    return slots_in(file(owner(b, near)), b);
  }
  int64_t step(size_t b, int64_t near) override { return step_in(file(owner(b, near)), b); }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const int64_t sn = numel_[b] / world_;
    for (int64_t q = lo / sn; q < world_ && q * sn < hi; ++q) {
      const int64_t a = std::max(lo, q * sn), e = std::min(hi, (q + 1) * sn);
      if (a >= e) continue;
      const io::SafetensorsFile& f = file(int(q));
      const std::string key = state_key(b, slot);
      ACCEL_CHECK(f.contains(key), IoError, kOp, "'", f.path(), "' has no slice of ", key,
                  " (bucket ", b, " has state on other ranks)");
      check_slot(f, key, sn);
      f.read_range(key, a - q * sn, e - q * sn, dst.narrow(0, a - lo, e - a));
    }
  }

 private:
  int owner(size_t b, int64_t near) const {
    const int64_t sn = numel_[b] / world_;
    return int(std::clamp<int64_t>(near / sn, 0, world_ - 1));
  }
  const io::SafetensorsFile& file(int q) {
    auto it = files_.find(q);
    if (it == files_.end())
      it = files_.emplace(q, std::make_unique<io::SafetensorsFile>(file_of_(q))).first;
    return *it->second;
  }
  std::function<std::string(int)> file_of_;
  int world_;
  std::vector<int64_t> numel_;
  std::map<int, std::unique_ptr<io::SafetensorsFile>> files_;
};

// Tensors by name, from an optimizer file (read by range) or from a state dict in memory.
struct TensorSource {
  std::string where;
  std::function<bool(const std::string&)> contains;
  std::function<std::vector<std::string>(const std::string&)> names;  // with a prefix
  std::function<std::pair<DType, int64_t>(const std::string&)> info;  // dtype, numel
  std::function<void(const std::string&, int64_t, int64_t, const Tensor&)> read_range;
};

TensorSource source_of(const io::SafetensorsFile& f) {
  TensorSource s;
  s.where = f.path();
  s.contains = [&f](const std::string& k) { return f.contains(k); };
  s.names = [&f](const std::string& p) { return f.names(p); };
  s.info = [&f](const std::string& k) {
    const auto& in = f.info(k);
    return std::make_pair(in.dtype, in.numel);
  };
  s.read_range = [&f](const std::string& k, int64_t lo, int64_t hi, const Tensor& dst) {
    f.read_range(k, lo, hi, dst);
  };
  return s;
}

TensorSource source_of(const io::TensorDict& d) {
  TensorSource s;
  s.where = "the optimizer state";
  s.contains = [&d](const std::string& k) { return d.count(k) && d.at(k).defined(); };
  s.names = [&d](const std::string& p) {
    std::vector<std::string> out;
    for (auto it = d.lower_bound(p); it != d.end() && it->first.rfind(p, 0) == 0; ++it)
      out.push_back(it->first);
    return out;
  };
  s.info = [&d](const std::string& k) { return std::make_pair(d.at(k).dtype(), d.at(k).numel()); };
  s.read_range = [&d](const std::string& k, int64_t lo, int64_t hi, const Tensor& dst) {
    Tensor t = dst;
    t.copy_(d.at(k).reshape({-1}).narrow(0, lo, hi - lo).view(dst.sizes()));
  };
  return s;
}

// A plain optimizer's per-parameter state (state.<k>.<slot>) laid out in buckets; `numel[k]`
// is parameter k's element count.
class PlainSource final : public FlatStateSource {
 public:
  PlainSource(TensorSource src, std::vector<Bucket> buckets, std::vector<int64_t> numel)
      : src_(std::move(src)), buckets_(std::move(buckets)), numel_(std::move(numel)) {}
  std::vector<std::string> slots(size_t b, int64_t) override {
    std::vector<std::string> out;
    for (size_t k : buckets_[b].params) {
      const std::string prefix = "state." + std::to_string(k) + ".";
      for (const std::string& key : src_.names(prefix)) {
        std::string slot = key.substr(prefix.size());
        if (slot == "step" || slot.find('.') != std::string::npos) continue;
        if (std::find(out.begin(), out.end(), slot) == out.end()) out.push_back(slot);
      }
    }
    return out;
  }
  int64_t step(size_t b, int64_t) override {
    int64_t st = 0;
    for (size_t k : buckets_[b].params) {
      const std::string key = state_key(k, "step");
      if (!src_.contains(key)) continue;
      const auto [dtype, n] = src_.info(key);
      ACCEL_CHECK(n == 1 && !is_floating(dtype) && dtype != kBool, IoError, kOp, src_.where, ": ",
                  key, " must be one integer, got ", dtype);
      Tensor t = empty({1}, TensorOptions(kInt64));
      src_.read_range(key, 0, 1, t);
      st = std::max(st, t.item<int64_t>());
    }
    return st;
  }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const Bucket& bk = buckets_[b];
    dst.zero_();  // a parameter without this slot (never stepped) contributes zeros
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const size_t k = bk.params[j];
      const std::string key = state_key(k, slot);
      if (!src_.contains(key)) continue;
      const int64_t off = bk.offset[j], n = numel_[k];
      const auto [dtype, numel] = src_.info(key);
      ACCEL_CHECK(numel == n && is_floating(dtype), ValueError, kOp, src_.where, ": ", key,
                  " holds ", numel, " elements of ", dtype, ", the parameter ", n);
      const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
      if (a < e) src_.read_range(key, a - off, e - off, dst.narrow(0, a - lo, e - a));
    }
  }

 private:
  TensorSource src_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> numel_;
};

// Shard-optimizer state for rank r of `zero`'s buckets from `src`, each slot in the dtype and on
// the device of the shard it belongs to (the optimizer keeps it as it is).
io::TensorDict shard_state(FlatStateSource& src, const ZeroOptimizer& zero, int r) {
  io::TensorDict out;
  const std::vector<Bucket>& buckets = zero.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    const Tensor& shard = zero.shard_params()[zero.shard_index(b)];
    const int64_t lo = r * bk.shard_numel, hi = std::min(lo + bk.shard_numel, bk.used);
    const int64_t near = std::max<int64_t>(0, std::min(lo, bk.used - 1));
    std::vector<std::string> slots = src.slots(b, near);
    if (slots.empty()) continue;
    out[state_key(b, "step")] = scalar_tensor(src.step(b, near), TensorOptions(kInt64));
    for (const std::string& slot : slots) {
      Tensor t = zeros({bk.shard_numel}, TensorOptions(shard.dtype(), shard.device()));
      if (lo < hi) src.read(b, slot, lo, hi, t.narrow(0, 0, hi - lo));
      out[state_key(b, slot)] = t;
    }
  }
  return out;
}

// Plain per-parameter state for `params` laid out in `buckets` from `src`: whole parameters, or
// elements ranges[k] of each.
io::TensorDict unsharded_state(FlatStateSource& src, const std::vector<Bucket>& buckets,
                               const std::vector<Tensor>& params,
                               const io::TensorDict& param_groups,
                               const std::vector<std::pair<int64_t, int64_t>>* ranges) {
  io::TensorDict out = param_groups;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    // The first element this rank reads decides which file answers for the bucket's slots.
    int64_t near = -1;
    for (size_t j = 0; j < bk.params.size() && near < 0; ++j) {
      const auto [lo, hi] = ranges ? (*ranges)[bk.params[j]]
                                   : std::pair<int64_t, int64_t>{0, params[bk.params[j]].numel()};
      if (lo < hi) near = bk.offset[j] + lo;
    }
    near = std::max<int64_t>(near, 0);
    std::vector<std::string> slots = src.slots(b, near);
    if (slots.empty()) continue;
    const int64_t st = src.step(b, near);
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const size_t k = bk.params[j];
      const Tensor& p = params[k];
      const auto [lo, hi] = ranges ? (*ranges)[k] : std::pair<int64_t, int64_t>{0, p.numel()};
      out[state_key(k, "step")] = scalar_tensor(st, TensorOptions(kInt64));
      for (const std::string& slot : slots) {
        Tensor t = empty({hi - lo}, TensorOptions(p.dtype(), p.device()));
        if (lo < hi) src.read(b, slot, bk.offset[j] + lo, bk.offset[j] + hi, t);
        out[state_key(k, slot)] = ranges ? t : t.view(p.sizes());
      }
    }
  }
  return out;
}

// The bucket sizes of an optimizer in the checkpoint (checked), matched against `buckets` (this
// run's layout of the same parameters).
std::vector<int64_t> saved_numel(const ckpt_records::ZeroLayoutRecord& layout,
                                 const std::vector<Bucket>& buckets, const std::string& path) {
  bool same = layout.buckets.size() == buckets.size();
  std::vector<int64_t> numel;
  for (size_t b = 0; same && b < buckets.size(); ++b) {
    same = layout.buckets[b].used == buckets[b].used;
    numel.push_back(layout.buckets[b].numel);
  }
  ACCEL_CHECK(same, ValueError, kOp, "checkpoint '", path, "' holds ZeRO state in ",
              layout.buckets.size(), " buckets that do not match this run's ", buckets.size(),
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

Layouts read_layouts(const nlohmann::json& state, size_t num_optimizers, int saved_world,
                     const std::string& file) {
  return ckpt_records::parse_zero_record(state, num_optimizers, saved_world, file);
}

int shard_world(const nlohmann::json& state, int saved_world, const std::string& file) {
  if (!state.is_object() || !state.contains("zero_world")) return saved_world;
  const nlohmann::json& z = state["zero_world"];
  const int64_t w = z.is_number_integer() ? z.get<int64_t>() : 0;
  ACCEL_CHECK(w >= 1 && saved_world >= 1 && w <= saved_world && saved_world % w == 0, IoError,
              "load_state", "'", file, "': zero_world ", z.dump(),
              " is not a shard group size of world_size ", saved_world);
  return int(w);
}

io::TensorDict param_groups_of(const io::TensorDict& d) {
  io::TensorDict out;
  for (auto& [k, v] : d)
    if (k.rfind("param_groups.", 0) == 0) out[k] = v;
  return out;
}

io::TensorDict param_groups_of(const io::SafetensorsFile& f) {
  io::TensorDict out;
  for (const std::string& k : f.names("param_groups.")) out[k] = f.read(k);
  return out;
}

namespace {
io::TensorDict shard_state_from(const std::string& dir, size_t i,
                                const ckpt_records::ZeroLayoutRecord* saved_layout, int saved_world,
                                const TensorSource& plain, const ZeroOptimizer& zero, int rank) {
  const std::vector<Bucket>& buckets = zero.buckets();
  if (!saved_layout) {
    // Parameter sizes from the buckets.
    std::vector<int64_t> numel(zero.params().size(), 0);
    for (const Bucket& bk : buckets)
      for (size_t j = 0; j < bk.params.size(); ++j)
        numel[bk.params[j]] =
            (j + 1 < bk.params.size() ? bk.offset[j + 1] : bk.used) - bk.offset[j];
    PlainSource src(plain, buckets, std::move(numel));
    return shard_state(src, zero, rank);
  }
  std::vector<int64_t> numel = saved_numel(*saved_layout, buckets, dir);
  ZeroFileSource src([&](int q) { return (fs::path(dir) / shard_file(i, q)).string(); },
                     saved_world, std::move(numel));
  return shard_state(src, zero, rank);
}
}  // namespace

io::TensorDict read_shard_state(const std::string& dir, size_t i,
                                const ckpt_records::ZeroLayoutRecord* saved_layout, int saved_world,
                                const io::SafetensorsFile& plain, const ZeroOptimizer& zero,
                                int rank) {
  return shard_state_from(dir, i, saved_layout, saved_world, source_of(plain), zero, rank);
}

io::TensorDict read_shard_state(const io::TensorDict& plain, const ZeroOptimizer& zero, int rank) {
  return shard_state_from("", 0, nullptr, 1, source_of(plain), zero, rank);
}

io::TensorDict read_unsharded_state(const std::string& dir, size_t i,
                                    const ckpt_records::ZeroLayoutRecord& saved_layout,
                                    int saved_world, const optim::Optimizer& user,
                                    const io::TensorDict& param_groups, size_t cap_bytes,
                                    const std::vector<std::pair<int64_t, int64_t>>* ranges) {
  NamedParams named;
  std::vector<size_t> group_of;
  std::vector<Tensor> params;
  for (size_t g = 0; g < user.num_param_groups(); ++g)
    for (const Tensor& p : user.params(g)) {
      named.emplace_back("p", p);
      group_of.push_back(g);
      params.push_back(p);
    }
  ACCEL_CHECK(!ranges || ranges->size() == params.size(), ValueError, kOp, ranges->size(),
              " ranges for ", params.size(), " parameters");
  const std::vector<Bucket> buckets = assign_buckets(
      named, cap_bytes, 1, user.num_param_groups() > 1 ? group_of : std::vector<size_t>{});
  std::vector<int64_t> numel = saved_numel(saved_layout, buckets, dir);
  ZeroFileSource src([&](int q) { return (fs::path(dir) / shard_file(i, q)).string(); },
                     saved_world, std::move(numel));
  return unsharded_state(src, buckets, params, param_groups, ranges);
}

std::vector<Tensor> read_accum(const std::string& dir, size_t i, int rank,
                               const ZeroOptimizer& zero) {
  std::vector<Tensor> out;
  // Stage 1 keeps a window in the parameters' .grad, unless mixed precision accumulates shards.
  if (zero.stage() < 2 && !zero.mixed_precision()) return out;
  const std::string path = (fs::path(dir) / accum_file(i, rank)).string();
  if (!fs::exists(path)) return out;
  io::SafetensorsFile f(path);
  const std::vector<Tensor> shards = zero.gradient_shards();
  for (size_t b = 0; b < shards.size(); ++b) {
    const std::string key = "bucket." + std::to_string(b);
    ACCEL_CHECK(f.contains(key), IoError, kOp, "'", path, "' has no gradient shard for bucket ", b);
    check_slot(f, key, shards[b].numel());
    Tensor t = empty({shards[b].numel()}, TensorOptions(shards[b].dtype(), shards[b].device()));
    f.read_range(key, 0, shards[b].numel(), t);
    out.push_back(t);
  }
  return out;
}

void write_accum(const std::string& dir, size_t i, int rank, const std::vector<Tensor>& accum) {
  if (accum.empty()) return;
  io::TensorDict g;
  for (size_t b = 0; b < accum.size(); ++b) g["bucket." + std::to_string(b)] = accum[b];
  const std::string f = (fs::path(dir) / accum_file(i, rank)).string();
  io::save_safetensors(f, g);
  fsync_path(f);
}

}  // namespace accel::dist::zero_ckpt
