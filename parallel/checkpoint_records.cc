// Checked records of sharded checkpoints; see parallel/checkpoint_records.h, Note [checkpoint
// record validation].
#include "parallel/checkpoint_records.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace accel::dist::ckpt_records {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "load_state";

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& what) {
  ACCEL_THROW(IoError, kOp, "'", file, "': ", field, ": ", what);
}

// An integer in [lo, hi] (JSON integers only: 2.0, "2" and true are refused).
int64_t integer(const json& v, const std::string& file, const std::string& field, int64_t lo,
                int64_t hi) {
  if (!v.is_number_integer())
    bad(file, field, std::string("expected an integer, got ") + v.type_name());
  // Unsigned values above INT64_MAX read as negative through get<int64_t>: compare unsigned.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    bad(file, field, "integer " + v.dump() + " is out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(file, field,
        "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
            std::to_string(x));
  return x;
}

const json& member(const json& obj, const char* key, const std::string& file,
                   const std::string& field) {
  if (!obj.is_object()) bad(file, field, std::string("expected an object, got ") + obj.type_name());
  auto it = obj.find(key);
  if (it == obj.end()) bad(file, field, std::string("has no \"") + key + "\"");
  return *it;
}

const json& array(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_array()) bad(file, field, std::string("expected an array, got ") + v.type_name());
  return v;
}

std::string idx(const std::string& field, size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

}  // namespace

std::vector<std::optional<ZeroLayoutRecord>> parse_zero_record(const json& state,
                                                               size_t num_optimizers,
                                                               int64_t saved_world,
                                                               const std::string& file) {
  std::vector<std::optional<ZeroLayoutRecord>> out;
  if (!state.is_object() || !state.contains("zero")) return out;
  if (saved_world < 1 || saved_world > kMaxRecordWorld)
    bad(file, "world_size",
        "ZeRO layouts need a world size in [1, " + std::to_string(kMaxRecordWorld) + "], got " +
            std::to_string(saved_world));
  const json& z = array(state["zero"], file, "zero");
  if (z.size() != num_optimizers)
    bad(file, "zero",
        "holds " + std::to_string(z.size()) + " optimizer layouts for " +
            std::to_string(num_optimizers) + " optimizers");
  for (size_t i = 0; i < z.size(); ++i) {
    const std::string f = idx("zero", i);
    const json& e = z[i];
    if (e.is_null()) {
      out.emplace_back();
      continue;
    }
    ZeroLayoutRecord rec;
    rec.stage = int(integer(member(e, "stage", file, f), file, f + ".stage", 1, 3));
    const json& bs = array(member(e, "buckets", file, f), file, f + ".buckets");
    for (size_t b = 0; b < bs.size(); ++b) {
      const std::string fb = idx(f + ".buckets", b);
      const json& bk = array(bs[b], file, fb);
      if (bk.size() != 2)
        bad(file, fb, "expected [used, numel], got " + std::to_string(bk.size()) + " values");
      ZeroBucketRecord r;
      r.used = integer(bk[0], file, fb + "[0] (used)", 1, kMaxRecordElements);
      r.numel = integer(bk[1], file, fb + "[1] (numel)", 1, kMaxRecordElements);
      // The writer pads `used` up to a multiple of the world size: every rank's slice holds at
      // least one element and the padding is less than one element per rank.
      if (r.numel < r.used || r.numel % saved_world != 0 || r.numel - r.used >= saved_world)
        bad(file, fb,
            "bucket of " + std::to_string(r.used) + " elements padded to " +
                std::to_string(r.numel) + " is not a layout over " + std::to_string(saved_world) +
                " ranks (numel must be used rounded up to a multiple of the world size)");
      rec.buckets.push_back(r);
    }
    out.emplace_back(std::move(rec));
  }
  return out;
}

FsdpRecord parse_fsdp_record(const json& rec, int64_t saved_world, const std::string& file) {
  FsdpRecord out;
  if (!rec.is_object() || rec.value("kind", json()) != "fsdp")
    bad(file, "fsdp", "is not a ZeRO-3 record (\"kind\": \"fsdp\")");
  out.world = integer(member(rec, "world", file, "fsdp"), file, "fsdp.world", 1, kMaxRecordWorld);
  if (rec.contains("replicate"))
    out.replicate = integer(rec["replicate"], file, "fsdp.replicate", 1, kMaxRecordWorld);
  if (saved_world >= 1 && out.world * out.replicate != saved_world)
    bad(file, "fsdp.world",
        "says " + std::to_string(out.world) + " ranks x " + std::to_string(out.replicate) +
            " replicas, world_size " + std::to_string(saved_world));
  const json& models = array(member(rec, "models", file, "fsdp"), file, "fsdp.models");
  std::vector<std::set<std::string>> model_names;
  for (size_t m = 0; m < models.size(); ++m) {
    const std::string fm = idx("fsdp.models", m);
    const json& params = array(member(models[m], "params", file, fm), file, fm + ".params");
    std::vector<FsdpParamRecord> ps;
    std::set<std::string> names;
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string fp = idx(fm + ".params", k);
      FsdpParamRecord p;
      const json& name = member(params[k], "name", file, fp);
      if (!name.is_string() || name.get<std::string>().empty())
        bad(file, fp + ".name", "expected a non-empty string");
      p.name = name.get<std::string>();
      if (!names.insert(p.name).second) bad(file, fp + ".name", "'" + p.name + "' appears twice");
      const json& shape = array(member(params[k], "shape", file, fp), file, fp + ".shape");
      if (shape.size() > kMaxRecordRank)
        bad(file, fp + ".shape", std::to_string(shape.size()) + " dimensions");
      p.numel = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t s = integer(shape[d], file, idx(fp + ".shape", d), 0, kMaxRecordElements);
        p.shape.push_back(s);
        if (s != 0 && p.numel > kMaxRecordElements / s)
          bad(file, fp + ".shape", "more than " + std::to_string(kMaxRecordElements) + " elements");
        p.numel *= s;
      }
      const json& spans = array(member(params[k], "spans", file, fp), file, fp + ".spans");
      if (int64_t(spans.size()) != out.world)
        bad(file, fp + ".spans",
            std::to_string(spans.size()) + " spans for " + std::to_string(out.world) + " ranks");
      for (size_t q = 0; q < spans.size(); ++q) {
        const std::string fs = idx(fp + ".spans", q);
        const json& sp = array(spans[q], file, fs);
        if (sp.size() != 2) bad(file, fs, "expected [lo, hi]");
        const int64_t lo = integer(sp[0], file, fs + "[0]", 0, p.numel);
        const int64_t hi = integer(sp[1], file, fs + "[1]", lo, p.numel);
        p.spans.emplace_back(lo, hi);
      }
      // The non-empty spans tile [0, numel): sorted, each starts where the previous ended.
      std::vector<std::pair<int64_t, int64_t>> sorted;
      for (const auto& s : p.spans)
        if (s.second > s.first) sorted.push_back(s);
      std::sort(sorted.begin(), sorted.end());
      int64_t at = 0;
      for (const auto& [lo, hi] : sorted) {
        if (lo != at)
          bad(file, fp + ".spans",
              lo < at ? "spans of '" + p.name + "' overlap at element " + std::to_string(lo)
                      : "no rank holds elements [" + std::to_string(at) + ", " +
                            std::to_string(lo) + ") of '" + p.name + "'");
        at = hi;
      }
      if (at != p.numel)
        bad(file, fp + ".spans",
            "the spans of '" + p.name + "' cover " + std::to_string(at) + " of its " +
                std::to_string(p.numel) + " elements");
      ps.push_back(std::move(p));
    }
    out.models.push_back(std::move(ps));
    model_names.push_back(std::move(names));
  }
  const json& opts = array(member(rec, "optimizers", file, "fsdp"), file, "fsdp.optimizers");
  for (size_t i = 0; i < opts.size(); ++i) {
    const std::string fo = idx("fsdp.optimizers", i);
    const json& keys = array(member(opts[i], "params", file, fo), file, fo + ".params");
    std::vector<std::string> ks;
    std::vector<FsdpKeyRecord> parsed;
    std::set<std::string> seen;
    for (size_t k = 0; k < keys.size(); ++k) {
      const std::string fk = idx(fo + ".params", k);
      if (!keys[k].is_string()) bad(file, fk, "expected \"<model>:<name>\"");
      const std::string key = keys[k].get<std::string>();
      const size_t colon = key.find(':');
      if (colon == std::string::npos || colon == 0 || colon > 9 ||
          key.find_first_not_of("0123456789") != colon)
        bad(file, fk, "expected \"<model>:<name>\", got '" + key + "'");
      FsdpKeyRecord r;
      r.model = size_t(std::stoull(key.substr(0, colon)));
      r.name = key.substr(colon + 1);
      if (r.model >= out.models.size() || !model_names[r.model].count(r.name))
        bad(file, fk, "'" + key + "' is not a saved parameter");
      if (!seen.insert(key).second) bad(file, fk, "'" + key + "' appears twice");
      ks.push_back(key);
      parsed.push_back(std::move(r));
    }
    out.optimizer_keys.push_back(std::move(ks));
    out.optimizers.push_back(std::move(parsed));
  }
  return out;
}

}  // namespace accel::dist::ckpt_records
