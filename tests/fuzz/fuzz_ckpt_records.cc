// Fuzz target: the checks of the records state.json keeps about sharded checkpoints (ZeRO-1/2
// bucket layouts, ZeRO-3 spans; Note [checkpoint record validation] in
// parallel/checkpoint_records.h), run on arbitrary bytes as load_state runs them. IoError is the
// documented failure; a record that passes must satisfy what the readers divide and index by.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/checkpoint_records.h"

namespace {

using json = nlohmann::json;
using namespace accel::dist::ckpt_records;

void check_zero(const json& s, int64_t world) {
  const size_t n = s.contains("zero") && s["zero"].is_array() ? s["zero"].size() : 1;
  const auto layouts = parse_zero_record(s, n, world, "<fuzz>");
  for (const auto& l : layouts) {
    if (!l) continue;
    if (l->stage < 1 || l->stage > 3) std::abort();
    for (const ZeroBucketRecord& b : l->buckets) {
      // What ZeroFileSource divides by and indexes with.
      if (b.used < 1 || b.numel < b.used || b.numel % world != 0) std::abort();
      if (b.numel / world < 1 || b.numel - b.used >= world) std::abort();
    }
  }
}

void check_fsdp(const json& rec, int64_t world) {
  const FsdpRecord r = parse_fsdp_record(rec, world, "<fuzz>");
  if (r.world < 1 || (world >= 1 && r.world != world)) std::abort();
  for (const auto& params : r.models)
    for (const FsdpParamRecord& p : params) {
      if (int64_t(p.spans.size()) != r.world) std::abort();
      // Every element of the parameter is held by exactly one rank.
      std::vector<std::pair<int64_t, int64_t>> s;
      for (const auto& sp : p.spans) {
        if (sp.first < 0 || sp.first > sp.second || sp.second > p.numel) std::abort();
        if (sp.second > sp.first) s.push_back(sp);
      }
      std::sort(s.begin(), s.end());
      int64_t at = 0;
      for (const auto& [lo, hi] : s) {
        if (lo != at) std::abort();
        at = hi;
      }
      if (at != p.numel) std::abort();
    }
  for (const auto& keys : r.optimizers)
    for (const FsdpKeyRecord& k : keys)
      if (k.model >= r.models.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const json s = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded()) return 0;
  int64_t world = 2;
  if (s.is_object() && s.contains("world_size") && s["world_size"].is_number_integer())
    world = s["world_size"].get<int64_t>();  // any value: the parsers check it
  try {
    check_zero(s, world);
  } catch (const accel::IoError&) {
  }
  if (s.is_object() && s.contains("fsdp")) {
    try {
      check_fsdp(s["fsdp"], world);
    } catch (const accel::IoError&) {
    }
  }
  return 0;
}
