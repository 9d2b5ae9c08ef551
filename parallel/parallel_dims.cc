#include "parallel/parallel_dims.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/settings.h"

namespace accel::dist {

std::vector<AgreedValue> mesh_size_values(const ParallelismConfig& given) {
  std::vector<AgreedValue> out;
  for (const ParallelDim& d : kParallelDims) {
    std::string what = std::string(d.name) + "_size (" + std::string(d.env);
    if (const settings::Setting* s = settings::find_by_env(d.env))
      what += ", " + std::string(s->flag) + ", " + std::string(s->yaml);
    out.push_back({what + ")", (given.*d.given).value_or(-1), true});
  }
  return out;
}

uint64_t fingerprint(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t plan_fingerprint(const TpPlan& plan) {
  std::string s;
  for (const auto& [pattern, style] : plan) {
    const ColwiseOptions& c = style.colwise;
    const RowwiseOptions& r = style.rowwise;
    s += pattern + "=" + style.name() + "(" + std::to_string(c.gather_output) + "," +
         std::to_string(c.chunks) + "," + std::to_string(c.sequence_parallel) + "," +
         std::to_string(c.sequence_dim) + "," + std::to_string(r.sequence_parallel) + "," +
         std::to_string(r.sequence_dim) + "," + std::to_string(style.shard_input_dim) + ");";
  }
  return fingerprint(s);
}

uint64_t plan_fingerprint(const CpPlan& plan) {
  std::string s;
  for (const auto& [pattern, style] : plan) s += pattern + "=" + style.name() + ";";
  return fingerprint(s);
}

namespace {
// "ranks 0-2, 5" from ascending ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]) +
         (j > i ? "-" + std::to_string(ranks[j]) : std::string());
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}
}  // namespace

void check_agreement(const ProcessGroupPtr& world, const char* op,
                     const std::vector<AgreedValue>& values) {
  if (!world || world->size() <= 1 || values.empty()) return;
  const int n = world->size();
  const int64_t k = int64_t(values.size());
  Tensor mine = empty({k}, kInt64);
  for (int64_t i = 0; i < k; ++i) mine.data<int64_t>()[i] = values[size_t(i)].value;
  Tensor all = empty({n * k}, kInt64);
  world->all_gather(all, mine);
  const int64_t* a = all.data<int64_t>();
  std::string differences;
  for (int64_t i = 0; i < k; ++i) {
    // (value, its ranks) in the order of each value's first rank.
    std::vector<std::pair<int64_t, std::vector<int>>> holders;
    for (int r = 0; r < n; ++r) {
      const int64_t value = a[r * k + i];
      auto it = std::find_if(holders.begin(), holders.end(),
                             [&](const auto& h) { return h.first == value; });
      if (it == holders.end())
        holders.push_back({value, {r}});
      else
        it->second.push_back(r);
    }
    if (holders.size() == 1) continue;
    const AgreedValue& v = values[size_t(i)];
    std::string who;
    for (const auto& [value, ranks] : holders) {
      const bool one = ranks.size() == 1;
      if (v.printable) {
        who += (who.empty() ? "" : ", ") + rank_list(ranks) + (one ? " has " : " have ") +
               (value == -1 ? std::string("it unset") : std::to_string(value));
      } else {
        who += (who.empty() ? "" : ", ") + rank_list(ranks) +
               (who.empty() ? (one ? " has one value" : " have one value") : " another");
      }
    }
    differences += (differences.empty() ? "" : "; ") + v.what + ": " + who;
  }
  ACCEL_CHECK(differences.empty(), DistError, op,
              "the ranks were started with different settings, so they would build different "
              "device meshes and wait for each other until the collective timeout: ",
              differences,
              ". Give every machine the same config file, flags and ACCEL_* variables");
}

}  // namespace accel::dist
