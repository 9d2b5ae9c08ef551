// The value checks and normalisations of launcher/config.h, shared by the config file reader,
// the flags and the questionnaire.
#include "launcher/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/env_contract.h"
#include "core/file_io.h"

namespace accel::launcher {

std::optional<std::string> check_distributed_type(const std::string& v) {
  std::string u = v;
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "NO" || u == "MULTI_CPU" || u == "MULTI_GPU") return std::nullopt;
  return "expected one of NO, MULTI_CPU, MULTI_GPU, got '" + v + "'";
}

std::optional<std::string> check_mixed_precision(const std::string& v) {
  std::string l = to_lower(v);
  if (l == "no" || l == "fp16" || l == "bf16") return std::nullopt;
  return "expected one of no, fp16, bf16, got '" + v + "'";
}

std::string normalize_mixed_precision(const std::string& v) { return to_lower(v); }

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

std::optional<std::string> check_zero_stage(long long v) {
  if (v >= 0 && v <= 3) return std::nullopt;
  return "expected 0 (off), 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters), got " +
         std::to_string(v);
}

std::optional<std::string> check_param_dtype(const std::string& v) {
  const std::string l = to_lower(v);
  if (l == "bf16" || l == "fp16" || l == "fp32") return std::nullopt;
  return "expected one of bf16, fp16, fp32, got '" + v + "'";
}

std::optional<std::string> check_reduce_dtype(const std::string& v) {
  const std::string l = to_lower(v);
  if (l == "param" || l == "fp32") return std::nullopt;
  return "expected param (the param dtype) or fp32, got '" + v + "'";
}

std::string normalize_fsdp_wrap(const std::string& v) {
  std::string l = to_lower(trim(v));
  std::replace(l.begin(), l.end(), '-', '_');
  return l;
}

std::optional<std::string> check_fsdp_wrap(const std::string& v) {
  const std::string l = normalize_fsdp_wrap(v);
  if (l == "entries" || l == "classes" || l == "min_params" || l == "none") return std::nullopt;
  return "expected one of entries, classes, min_params, none, got '" + v + "'";
}

std::optional<std::string> check_fsdp_wrap_classes(const std::string& v) {
  const std::string expl =
      "expected a comma-separated list of module class names such as Block,Layer, got '" + v + "'";
  if (trim(v).empty()) return expl;
  for (const auto& part : split(v, ',')) {
    const std::string name = trim(part);
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return expl;
    for (char ch : name)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return expl;
  }
  return std::nullopt;
}

std::string normalize_fsdp_wrap_classes(const std::string& v) {
  std::string out;
  for (const auto& part : split(v, ',')) {
    if (!out.empty()) out += ',';
    out += trim(part);
  }
  return out;
}

std::optional<std::string> check_fsdp_min_params(long long v) {
  if (v >= 1) return std::nullopt;
  return "expected a parameter count >= 1, got " + std::to_string(v);
}

std::optional<std::string> check_strategy(const std::string& v) {
  const bool ok = !v.empty() && v.size() <= 64 &&
                  v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
  if (ok) return std::nullopt;
  return "expected a registered strategy's name (ddp, zero1, zero2, fsdp or the program's own: "
         "lower-case letters, digits and '_'), got '" +
         v + "'";
}

std::optional<bool> parse_bool(const std::string& v) {
  const std::string t = to_lower(trim(v));
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return std::nullopt;
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
