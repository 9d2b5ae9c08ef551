// See Note [strategy registry] in accelerate/strategy_registry.h.
#include "accelerate/strategy_registry.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"

namespace accel::dist {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, StrategySpec, std::less<>> specs;
};

Registry& registry() {
  static Registry r;  // built on first use: registrations in any file, in any order
  return r;
}

std::string joined_names(const Registry& r) {
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, spec] : r.specs) {
    os << (first ? "" : ", ") << name;
    first = false;
  }
  return os.str();
}

}  // namespace

void register_strategy(StrategySpec spec) {
  ACCEL_CHECK(!spec.name.empty() && spec.make, ValueError, "register_strategy",
              "a strategy needs a name and a make function (got name '", spec.name, "')");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ACCEL_CHECK(!r.specs.count(spec.name), ValueError, "register_strategy", "strategy '", spec.name,
              "' is already registered");
  for (const auto& [name, other] : r.specs)
    ACCEL_CHECK(spec.zero_stage < 0 || other.zero_stage != spec.zero_stage, ValueError,
                "register_strategy", "strategies '", name, "' and '", spec.name,
                "' both claim zero_stage ", spec.zero_stage);
  std::string name = spec.name;
  r.specs.emplace(std::move(name), std::move(spec));
}

const StrategySpec* find_strategy(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.specs.find(name);
  return it == r.specs.end() ? nullptr : &it->second;  // entries are never removed
}

std::vector<std::string> registered_strategies() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, spec] : r.specs) out.push_back(name);
  return out;
}

std::string strategy_for_zero_stage(int zero_stage) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [name, spec] : r.specs)
    if (spec.zero_stage >= 0 && spec.zero_stage == zero_stage) return name;
  ACCEL_THROW(ValueError, "accelerator", "zero_stage must be in 0..3, got ", zero_stage,
              " (registered strategies: ", joined_names(r), ")");
}

}  // namespace accel::dist
