// The value checks and normalisations of launcher/config.h, shared by the config file reader,
// the flags and the questionnaire: the training settings through their row of the settings table
// (Note [settings are checked by their row]), the others here.
#include "launcher/config.h"

#include <cctype>
#include <set>

#include "core/settings.h"

namespace accel::launcher {

std::optional<std::string> check_distributed_type(const std::string& v) {
  std::string u = v;
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "NO" || u == "MULTI_CPU" || u == "MULTI_GPU") return std::nullopt;
  return "expected one of NO, MULTI_CPU, MULTI_GPU, got '" + v + "'";
}

std::optional<std::string> check_gpu_ids(const std::string& v) {
  std::string t = trim(v);
  if (to_lower(t) == "all") return std::nullopt;
  const std::string expl =
      "expected 'all' or a comma-separated list of GPU ids such as 0,1, got '" + v + "'";
  if (t.empty()) return expl;
  std::set<long long> seen;
  for (const auto& part : split(t, ',')) {
    auto id = parse_int(part);
    if (!id || *id < 0 || *id > 1023) return expl;
    if (!seen.insert(*id).second)
      return "GPU id " + std::to_string(*id) + " is listed twice in '" + v + "'";
  }
  return std::nullopt;
}

std::string normalize_gpu_ids(const std::string& v) {
  std::string t = trim(v);
  if (to_lower(t) == "all") return "all";
  std::string out;
  for (const auto& part : split(t, ',')) {
    if (!out.empty()) out += ',';
    out += std::to_string(*parse_int(part));
  }
  return out;
}

const settings::Setting& setting_row(std::string_view key) {
  const settings::Setting* s = settings::find_by_yaml(key);
  if (!s) s = settings::find_by_flag(key);
  ACCEL_CHECK(s != nullptr, launcher::ConfigError, "config", "setting '", key,
              "' has no row in the settings table (core/settings.h)");
  return *s;
}

std::optional<std::string> parse_setting(std::string_view key, std::string_view raw,
                                         std::string* why) {
  return settings::parse(setting_row(key), raw, why);
}

std::optional<std::string> check_setting(std::string_view key, std::string_view raw) {
  std::string why;
  if (parse_setting(key, raw, &why)) return std::nullopt;
  return why;
}

std::optional<std::string> LaunchConfig::get(std::string_view key) const {
  const auto it = training.find(setting_row(key).yaml);
  if (it == training.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> LaunchConfig::get_int(std::string_view key) const {
  const settings::Setting& s = setting_row(key);
  ACCEL_INTERNAL_ASSERT(s.kind == settings::Kind::Int);
  const std::optional<std::string> v = get(key);
  if (!v) return std::nullopt;
  return settings::typed(s, *v).i;
}

std::optional<bool> LaunchConfig::get_bool(std::string_view key) const {
  const settings::Setting& s = setting_row(key);
  ACCEL_INTERNAL_ASSERT(s.kind == settings::Kind::Bool);
  const std::optional<std::string> v = get(key);
  if (!v) return std::nullopt;
  return *v == "true";
}

LaunchConfig& LaunchConfig::set(std::string_view key, const std::optional<std::string>& raw) {
  const settings::Setting& s = setting_row(key);
  if (!raw) {
    training.erase(std::string(s.yaml));
    return *this;
  }
  std::string why;
  std::optional<std::string> v = settings::parse(s, *raw, &why);
  ACCEL_CHECK(v.has_value(), launcher::ConfigError, "config", "key '", s.yaml, "': ", why);
  training[std::string(s.yaml)] = std::move(*v);
  return *this;
}

ParallelismConfig parallelism_of(const LaunchConfig& c) {
  ParallelismConfig p;
  for (const ParallelDim& d : kParallelDims)
    if (auto v = c.get_int(settings::find_by_env(d.env)->yaml)) p.*d.given = int(*v);
  return p;
}

void check_parallelism(const LaunchConfig& c, int world, const std::string& where) {
  std::string why;  // Note [mesh sizes]
  ACCEL_CHECK(infer_mesh_sizes(parallelism_of(c), world, &why).has_value(), launcher::ConfigError,
              "launch", where,
              ": parallelism_config (--pp_size, --dp_replicate_size, --dp_shard_size, "
              "--cp_size, --tp_size) does not fit ",
              world, " processes: ", why);
}

std::optional<std::string> complete_fsdp_wrap(LaunchConfig& c) {
  if (c.has("fsdp_config.fsdp_wrap")) return std::nullopt;
  const bool classes = c.has("fsdp_config.fsdp_wrap_classes");
  const bool min_params = c.has("fsdp_config.fsdp_min_params");
  if (classes && min_params) {
    return std::string(
        "fsdp_wrap_classes and fsdp_min_params choose two different wrap policies (classes, "
        "min_params); give one of them, or fsdp_wrap");
  }
  if (classes) c.set("fsdp_config.fsdp_wrap", "classes");
  if (min_params) c.set("fsdp_config.fsdp_wrap", "min_params");
  return std::nullopt;
}

}  // namespace accel::launcher
