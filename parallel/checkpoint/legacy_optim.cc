// The optimizer state of a format-1 checkpoint as tensors of one folder (Note [format-1
// checkpoints as pieces] in parallel/checkpoint/legacy.h): plain optimizer files, ZeRO-1/2 bucket
// slices, ZeRO-3 / HSDP spans.
#include <algorithm>
#include <optional>
#include <set>

#include "core/error.h"
#include "parallel/checkpoint/legacy_parts.h"
#include "parallel/checkpoint/names.h"

namespace accel::dist::ckpt::legacy {

namespace {

using json = nlohmann::json;
namespace records = ckpt_records;
constexpr const char* kOp = "checkpoint";

// "state.<k>.<rest>" with k a decimal count: (k, rest).
std::optional<std::pair<size_t, std::string>> state_key(const std::string& key) {
  if (key.rfind("state.", 0) != 0) return std::nullopt;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot - 6 > 9 || dot + 1 == key.size())
    return std::nullopt;
  const std::string k = key.substr(6, dot - 6);
  if (k.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::make_pair(size_t(std::stoul(k)), key.substr(dot + 1));
}

// The slot names of "<prefix><slot>" entries (no step, no deeper keys).
std::vector<std::string> slots_in(const io::SafetensorsFile& f, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& k : f.names(prefix)) {
    std::string slot = k.substr(prefix.size());
    if (slot != "step" && slot.find('.') == std::string::npos) out.push_back(slot);
  }
  return out;
}

void check_step(const io::SafetensorsFile& f, const std::string& key) {
  const io::SafetensorsFile::Info& in = f.info(key);
  ACCEL_CHECK(in.numel == 1 && !is_floating(in.dtype) && in.dtype != kBool, IoError, kOp, "'",
              f.path(), "': ", key, " must be one integer, got ", in.dtype, " ",
              shape_str(in.shape));
}

void check_slot(const io::SafetensorsFile& f, const std::string& key, const Shape& shape) {
  const io::SafetensorsFile::Info& in = f.info(key);
  ACCEL_CHECK(in.shape == shape && is_floating(in.dtype), IoError, kOp, "'", f.path(), "': ", key,
              " is ", in.dtype, " ", shape_str(in.shape), ", expected floating-point ",
              shape_str(shape));
}

// One folder's optimizer o.
struct Adder {
  Files& files;
  const Folder& folder;
  size_t o;
  LocalPart& part;

  void add(const std::string& name, LocalTensor lt, const std::string& where) {
    ACCEL_CHECK(part.emplace(name, std::move(lt)).second, IoError, kOp, "'", where, "': tensor '",
                name, "' comes from two places of the checkpoint");
  }
  // An entry read whole.
  void whole(const std::string& name, int64_t id, const std::string& entry, int64_t model = -1,
             const std::string& param = "") {
    const io::SafetensorsFile& f = files.open(id);
    const io::SafetensorsFile::Info& in = f.info(entry);
    LocalTensor lt;
    lt.dtype = in.dtype;
    lt.typed = true;
    lt.shape = in.shape;
    lt.pieces.push_back({id, entry});
    lt.model = in.shape.empty() ? -1 : model;
    lt.param = param;
    add(name, std::move(lt), f.path());
  }
  // The model tensor of a stepped parameter (its tp-local shape and dtype; a tied name through the
  // model's aliases).
  const LocalTensor& param(const LegacyParam& p) const {
    std::string n = names::model(p.model, p.name);
    auto it = part.find(n);
    if (it == part.end()) {
      const auto a = folder.aliases.find(n);
      if (a != folder.aliases.end()) it = part.find(a->second);
    }
    ACCEL_CHECK(it != part.end(), IoError, kOp, "'", folder.state_path, "': optimizer ", o,
                " steps '", p.name, "' of model ", p.model,
                ", which the checkpoint's model does not hold");
    return it->second;
  }
  // State that is not per model parameter, whole (not outside tp: each tp index has its own).
  void opaque(const io::SafetensorsFile& f, int64_t id, const std::string& key) {
    ACCEL_CHECK(key.rfind("state.", 0) == 0, IoError, kOp, "'", f.path(), "': '", key,
                "' is no optimizer state_dict key");
    ACCEL_CHECK(!folder.tp, IoError, kOp, "'", f.path(), "': optimizer state '", key,
                "' is not per model parameter and does not join across tp folders");
    whole(names::optim_opaque(o, key.substr(6)), id, key);
  }
  // param_groups.* (and, outside tp, state that is not per parameter) of a file.
  void groups_and_opaque(int64_t id) {
    const io::SafetensorsFile& f = files.open(id);
    for (const std::string& key : f.names()) {
      if (key.rfind("param_groups.", 0) == 0) {
        whole(names::optim_group(o, key), id, key);
      } else if (!state_key(key)) {
        opaque(f, id, key);
      }
    }
  }

  // optimizer[_o].safetensors: the whole state, parameter k being the context's k.
  void plain(const std::vector<LegacyParam>& params) {
    const int64_t id = files.add(folder.base + indexed("optimizer", o) + ".safetensors");
    const io::SafetensorsFile& f = files.open(id);
    groups_and_opaque(id);
    for (const std::string& key : f.names()) {
      const auto sk = state_key(key);
      if (!sk) continue;
      const auto& [k, slot] = *sk;
      ACCEL_CHECK(k < params.size(), ValueError, kOp, "'", f.path(), "': '", key,
                  "' is the state of parameter ", k, "; optimizer ", o, " of this run has ",
                  params.size(), " parameters");
      const LegacyParam& p = params[k];
      if (p.name.empty()) {  // a tensor of no prepared model
        opaque(f, id, key);
        continue;
      }
      if (slot == "step") {
        check_step(f, key);
        whole(names::optim_step(o, p.model, p.name), id, key);
        continue;
      }
      ACCEL_CHECK(is_floating(f.info(key).dtype), IoError, kOp, "'", f.path(), "': ", key, " is ",
                  f.info(key).dtype, ", expected floating point");
      whole(names::optim_slot(o, p.model, p.name, slot), id, key, int64_t(p.model), p.name);
    }
  }

  // fsdp_optimizer[_o]_rank<q>: per parameter k its span's slice of each slot, the step from the
  // first rank holding elements.
  void fsdp(const records::FsdpRecord& rec) {
    const int64_t W = rec.world;
    std::vector<int64_t> ids;
    for (int64_t q = 0; q < W; ++q)
      ids.push_back(files.add(folder.base + rank_file("fsdp_optimizer", o, q)));
    groups_and_opaque(ids[0]);
    for (size_t k = 0; k < rec.optimizers[o].size(); ++k) {
      const records::FsdpKeyRecord& key = rec.optimizers[o][k];
      const records::FsdpParamRecord* p = nullptr;
      for (const records::FsdpParamRecord& c : rec.models[key.model])
        if (c.name == key.name) p = &c;
      std::vector<int64_t> holders;
      for (int64_t q = 0; q < W; ++q)
        if (p->spans[size_t(q)].second > p->spans[size_t(q)].first) holders.push_back(q);
      if (holders.empty()) continue;
      const std::string prefix = "state." + std::to_string(k) + ".";
      const io::SafetensorsFile& first = files.open(ids[size_t(holders[0])]);
      const std::vector<std::string> slots = slots_in(first, prefix);
      const Shape shape(p->shape);
      for (const std::string& slot : slots) {
        LocalTensor lt;
        lt.shape = shape;
        lt.flat = true;
        lt.model = int64_t(key.model);
        lt.param = key.name;
        for (int64_t q : holders) {
          const auto [lo, hi] = p->spans[size_t(q)];
          const io::SafetensorsFile& f = files.open(ids[size_t(q)]);
          ACCEL_CHECK(f.contains(prefix + slot), IoError, kOp, "'", f.path(), "' has no slice '",
                      prefix + slot, "' of '", key.name, "' (its elements [", lo, ", ", hi, "); '",
                      first.path(), "' has one)");
          check_slot(f, prefix + slot, Shape{hi - lo});
          const DType d = f.info(prefix + slot).dtype;
          ACCEL_CHECK(!lt.typed || d == lt.dtype, IoError, kOp, "'", f.path(), "': ", prefix + slot,
                      " is ", d, ", its other slices ", lt.dtype);
          lt.dtype = d;
          lt.typed = true;
          lt.pieces.push_back({ids[size_t(q)], prefix + slot, lo, hi});
        }
        add(names::optim_slot(o, key.model, key.name, slot), std::move(lt), first.path());
      }
      if (first.contains(prefix + "step")) {
        check_step(first, prefix + "step");
        whole(names::optim_step(o, key.model, key.name), ids[size_t(holders[0])], prefix + "step");
      }
    }
  }

  // zero_optimizer[_o]_rank<q> for the Z ranks of a shard group: bucket b's flat buffers cut in
  // Z slices; the parameters' places from assign_buckets (Note [format-1 checkpoints as
  // pieces] in parallel/checkpoint/legacy.h).
  void zero(const records::ZeroLayoutRecord& layout, int64_t Z, const LegacyContext& ctx) {
    groups_and_opaque(files.add(folder.base + indexed("optimizer", o) + ".safetensors"));
    const std::vector<LegacyParam>& params = ctx.optimizers[o];
    NamedParams named;
    std::vector<size_t> group_of;
    size_t groups = 0;
    for (const LegacyParam& p : params) {
      ACCEL_CHECK(!p.name.empty(), ValueError, kOp, "optimizer ", o, "'s parameter ", named.size(),
                  " is no parameter of a prepared model: its ZeRO state in '", folder.state_path,
                  "' has no name to load by");
      const LocalTensor& lt = param(p);
      // Only the size, dtype and device count: a broadcast element stands for the values.
      Tensor t = zeros(Shape(lt.shape.size(), 1), TensorOptions(lt.dtype)).expand(lt.shape);
      named.emplace_back(p.name, t);
      group_of.push_back(p.group);
      groups = std::max(groups, p.group + 1);
    }
    const std::vector<Bucket> buckets = assign_buckets(
        named, ctx.bucket_cap_bytes, int(Z), groups > 1 ? group_of : std::vector<size_t>{});
    bool same = buckets.size() == layout.buckets.size();
    for (size_t b = 0; same && b < buckets.size(); ++b)
      same = buckets[b].used == layout.buckets[b].used;
    ACCEL_CHECK(same, ValueError, kOp, "'", folder.state_path, "' holds ZeRO state of optimizer ",
                o, " in ", layout.buckets.size(), " buckets that do not match this run's ",
                buckets.size(),
                " (the parameters, their param groups or ddp.bucket_cap_bytes "
                "differ)");
    std::vector<int64_t> ids;
    for (int64_t q = 0; q < Z; ++q)
      ids.push_back(files.add(folder.base + rank_file("zero_optimizer", o, q)));
    for (size_t b = 0; b < buckets.size(); ++b) {
      const Bucket& bk = buckets[b];
      const int64_t sn = layout.buckets[b].numel / Z;
      const std::string prefix = "state." + std::to_string(b) + ".";
      const io::SafetensorsFile& f0 = files.open(ids[0]);
      const std::vector<std::string> slots = slots_in(f0, prefix);
      std::vector<DType> dtypes(slots.size());
      int64_t step = -1;
      for (int64_t q = 0; q < Z; ++q) {
        const io::SafetensorsFile& f = files.open(ids[size_t(q)]);
        ACCEL_CHECK(slots_in(f, prefix) == slots && f.contains(prefix + "step") == !slots.empty(),
                    IoError, kOp, "'", f.path(), "' holds other state of bucket ", b, " than '",
                    f0.path(), "' (every rank's slice of a bucket has the same slots and a step)");
        for (size_t s = 0; s < slots.size(); ++s) {
          check_slot(f, prefix + slots[s], Shape{sn});
          const DType d = f.info(prefix + slots[s]).dtype;
          ACCEL_CHECK(q == 0 || d == dtypes[s], IoError, kOp, "'", f.path(),
                      "': ", prefix + slots[s], " is ", d, ", rank 0's ", dtypes[s]);
          dtypes[s] = d;
        }
        if (slots.empty()) continue;
        // Note [format-1 checkpoints as pieces]: one step per bucket, the same on every rank.
        check_step(f, prefix + "step");
        const int64_t st = f.read(prefix + "step").to(kInt64).item<int64_t>();
        ACCEL_CHECK(st >= 0 && (q == 0 || st == step), IoError, kOp, "'", f.path(), "': ", prefix,
                    "step is ", st, q == 0 ? "" : ", in '" + f0.path() + "' ",
                    q == 0 ? std::string() : std::to_string(step));
        step = st;
      }
      if (slots.empty()) continue;  // never stepped
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const LegacyParam& p = params[bk.params[j]];
        const LocalTensor& pt = param(p);
        const int64_t off = bk.offset[j], n = shape_numel(pt.shape);
        for (size_t s = 0; s < slots.size(); ++s) {
          LocalTensor lt;
          lt.dtype = dtypes[s];
          lt.typed = true;
          lt.shape = pt.shape;
          lt.flat = true;
          lt.model = int64_t(p.model);
          lt.param = p.name;
          for (int64_t q = off / std::max<int64_t>(sn, 1); q < Z && q * sn < off + n; ++q) {
            const int64_t a = std::max(off, q * sn), e = std::min(off + n, (q + 1) * sn);
            if (a < e)
              lt.pieces.push_back(
                  {ids[size_t(q)], prefix + slots[s], a - off, e - off, a - q * sn, sn});
          }
          add(names::optim_slot(o, p.model, p.name, slots[s]), std::move(lt), f0.path());
        }
        whole(names::optim_step(o, p.model, p.name), ids[0], prefix + "step");
      }
    }
  }
};

// state.json's "zero_world" (an HSDP run writes its ZeRO-1/2 shards once, from replica 0: its
// shard group's size), else the folder's world.
int64_t zero_world(const Folder& folder) {
  const json& r = *folder.record;
  if (!r.contains("zero_world")) return folder.world;
  const json& z = r["zero_world"];
  const int64_t w = z.is_number_integer() ? z.get<int64_t>() : 0;
  ACCEL_CHECK(w >= 1 && w <= folder.world && folder.world % w == 0, IoError, kOp, "'",
              folder.state_path, "': zero_world ", z.dump(), " is not a shard group size of ",
              folder.world, " ranks");
  return w;
}

}  // namespace

void add_window_grads(Files& files, const Folder& folder, size_t num_models, int64_t T, int64_t t,
                      const LocalPart& model, LocalPart& part) {
  Adder a{files, folder, 0, part};
  const int64_t Z = zero_world(folder);
  const auto layouts =
      records::parse_zero_record(*folder.record, folder.num_optimizers, Z, folder.state_path);
  auto floating = [&](int64_t id, const std::string& key) {
    const io::SafetensorsFile& f = files.open(id);
    ACCEL_CHECK(is_floating(f.info(key).dtype), IoError, kOp, "'", f.path(), "': gradient '", key,
                "' is ", f.info(key).dtype, ", expected floating point");
  };
  for (int64_t r = 0; r < folder.world; ++r) {
    const int64_t w = r * T + t;
    // Per model, every parameter's gradient (ZeRO-3: the unsharded window gradients).
    for (size_t m = 0; m < num_models; ++m) {
      const int64_t id =
          files.add(folder.base + rank_file(folder.fsdp ? "fsdp_grads" : "grads", m, r));
      const io::SafetensorsFile& f = files.open(id);
      for (const std::string& key : f.names()) {
        floating(id, key);
        const auto p = model.find(names::model(m, key));
        ACCEL_CHECK(p != model.end() && p->second.shape == f.info(key).shape, IoError, kOp, "'",
                    f.path(), "': gradient '", key, "' is ", shape_str(f.info(key).shape),
                    p == model.end() ? std::string(", of no tensor of the model")
                                     : ", the parameter " + shape_str(p->second.shape));
        a.whole(names::grad_of_rank(m, key, w), id, key);
      }
    }
    // ZeRO-1/2 windows kept in the gradient shards (stage 2, or 16-bit compute parameters).
    for (size_t o = 0; o < folder.num_optimizers && !folder.fsdp; ++o) {
      const std::string rel = folder.base + rank_file("zero_grads", o, r);
      if (!files.exists(rel)) continue;
      const int64_t id = files.add(rel);
      for (const std::string& key : files.open(id).names()) {
        const auto b = key.rfind("bucket.", 0) == 0 ? state_key("state." + key.substr(7) + ".x")
                                                    : std::nullopt;
        const io::SafetensorsFile& f = files.open(id);
        ACCEL_CHECK(b.has_value() && o < layouts.size() && layouts[o] &&
                        b->first < layouts[o]->buckets.size(),
                    IoError, kOp, "'", f.path(), "': '", key,
                    "' is no gradient shard of a bucket of the ZeRO record (\"bucket.<b>\")");
        floating(id, key);
        const int64_t sn = layouts[o]->buckets[b->first].numel / Z;
        ACCEL_CHECK(f.info(key).shape == Shape{sn}, IoError, kOp, "'", f.path(), "': '", key,
                    "' is ", shape_str(f.info(key).shape), ", a bucket's shard (", sn, ")");
        a.whole(names::zero_accum_of_rank(o, b->first, w), id, key);
      }
    }
  }
}

void add_optimizers(Files& files, const Folder& folder, const LegacyContext& ctx, LocalPart& part) {
  const int64_t Z = zero_world(folder);
  const auto layouts =
      records::parse_zero_record(*folder.record, folder.num_optimizers, Z, folder.state_path);
  ACCEL_CHECK(layouts.empty() || !folder.fsdp, IoError, kOp, "'", folder.state_path,
              "' holds both a ZeRO-1/2 and a ZeRO-3 record, which no save writes");
  for (size_t o = 0; o < folder.num_optimizers; ++o) {
    Adder a{files, folder, o, part};
    if (folder.fsdp) {
      a.fsdp(*folder.fsdp);
    } else if (o < layouts.size() && layouts[o]) {
      a.zero(*layouts[o], Z, ctx);
    } else {
      a.plain(ctx.optimizers[o]);
    }
  }
}

}  // namespace accel::dist::ckpt::legacy
