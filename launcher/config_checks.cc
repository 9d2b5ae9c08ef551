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

ParallelismConfig parallelism_of(const LaunchConfig& c) {
  ParallelismConfig p;
  p.dp_replicate_size = c.dp_replicate_size;
  p.dp_shard_size = c.dp_shard_size;
  p.tp_size = c.tp_size;
  return p;
}

void check_parallelism(const LaunchConfig& c, int world, const std::string& where) {
  std::string why;  // Note [mesh sizes]
  ACCEL_CHECK(infer_mesh_sizes(parallelism_of(c), world, &why).has_value(), launcher::ConfigError,
              "launch", where,
              ": parallelism_config (--dp_replicate_size, --dp_shard_size, "
              "--tp_size) does not fit ",
              world, " processes: ", why);
}

std::optional<std::string> complete_fsdp_wrap(LaunchConfig& c) {
  if (c.fsdp_wrap) return std::nullopt;
  if (c.fsdp_wrap_classes && c.fsdp_min_params) {
    return std::string(
        "fsdp_wrap_classes and fsdp_min_params choose two different wrap policies (classes, "
        "min_params); give one of them, or fsdp_wrap");
  }
  if (c.fsdp_wrap_classes) c.fsdp_wrap = "classes";
  if (c.fsdp_min_params) c.fsdp_wrap = "min_params";
  return std::nullopt;
}

}  // namespace accel::launcher
