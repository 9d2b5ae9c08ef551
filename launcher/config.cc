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
namespace {

constexpr double kMaxMonitorInterval = 60.0;  // seconds
// A config file is a few hundred bytes; anything near this is not one.
constexpr uint64_t kMaxConfigBytes = uint64_t(1) << 20;

// Note [accelerate keys accel does not implement]
// An Accelerate config file names features accel does not have (TPUs, DeepSpeed, Megatron-LM,
// torch.compile, CPU affinity, fp8, tensor parallelism, ...); Accelerate writes each of them into
// every config with its "off" value. Such a key is accepted while its value is inert (null,
// false, 'no'/'NO'/'none', an empty string, list or mapping, or a mapping of inert values) and
// refused otherwise, naming the key, the value and what accel supports instead: a config that
// asks for something accel would silently not do (issue 22: `fsdp_offload_params: true` was
// accepted and ignored) must not launch. The same rule holds for Accelerate's fsdp_config keys
// (kFsdpAccelerateValues below).
struct InertOnlyKey {
  const char* key;
  const char* instead;  // what accel does or offers instead
};
const std::vector<InertOnlyKey> kInertOnlyAccelerateKeys = {
    {"debug", "accel-run has no debug mode; every collective is checked by fingerprints"},
    {"downcast_bf16", "accel has no TPU support (downcast_bf16 is a TPU setting)"},
    {"tpu_env", "accel has no TPU support"},
    {"tpu_use_cluster", "accel has no TPU support"},
    {"tpu_use_sudo", "accel has no TPU support"},
    {"tpu_name", "accel has no TPU support"},
    {"tpu_zone", "accel has no TPU support"},
    {"commands", "accel-run runs the command on its own command line (commands are for TPU pods)"},
    {"command_file",
     "accel-run runs the command on its own command line (command_file is for TPU pods)"},
    {"deepspeed_config",
     "accel does not run DeepSpeed; its ZeRO stages are zero_config.zero_stage"},
    {"megatron_lm_config", "accel has no Megatron-LM integration"},
    {"dynamo_config", "accel has no torch.compile / dynamo"},
    {"dynamo_backend", "accel has no torch.compile / dynamo"},
    {"ipex_config", "accel has no Intel Extension for PyTorch"},
    {"mpirun_config", "accel-run starts its workers itself (no mpirun)"},
    {"enable_cpu_affinity", "accel-run does not pin workers to CPUs"},
    {"use_mps_device", "accel has no Apple MPS backend (use_cpu: true, or CUDA)"},
    {"fp8_config", "accel has no fp8 training (mixed_precision is no, fp16 or bf16)"},
};

// The keys without a row; the rows' keys and their sections come from the settings table.
const std::vector<std::string> kKnownKeys = {
    "compute_environment",    "distributed_type",
    "num_machines",           "num_processes",
    "machine_rank",           "main_process_ip",
    "main_process_port",      "gpu_ids",
    "rdzv_backend",           "same_network",
    "main_training_function", "max_restarts",
    "monitor_interval",       "num_cpu_threads_per_process",
};

// The section of a dotted row key ("zero_config" of "zero_config.zero_stage"), or "".
std::string_view section_of(std::string_view key) {
  const size_t dot = key.find('.');
  return dot == std::string_view::npos ? std::string_view() : key.substr(0, dot);
}
bool is_section(std::string_view key) {
  for (const settings::Setting& s : settings::kSettings)
    if (section_of(s.yaml) == key) return true;
  return false;
}

// Accelerate's FSDP settings that accel has no switch for are accepted only with the value that
// describes what accel does anyway (Note [accelerate keys accel does not implement]); its other
// spellings of our settings are the rows' aliases (Note [aliases of a setting]).
struct FsdpFixedKey {
  const char* key;
  std::vector<std::string> accepted;  // lower-case values describing what accel does
  const char* why;                    // what accel does, for the refusal
};
const std::vector<FsdpFixedKey> kFsdpAccelerateValues = {
    {"fsdp_offload_params",
     {"false", "no", "off"},
     "accel keeps parameters, gradients and optimizer state on the training device (no CPU "
     "offload); supported: false"},
    {"fsdp_state_dict_type",
     {"sharded_state_dict"},
     "accel's save_state always writes each rank's shards (SHARDED_STATE_DICT); a consolidated "
     "model file is Accelerator::save_model's; supported: SHARDED_STATE_DICT"},
    {"fsdp_sync_module_states",
     {"true", "yes", "on"},
     "accel always starts every rank from rank 0's parameters; supported: true"},
    {"fsdp_use_orig_params",
     {"true", "yes", "on"},
     "accel's optimizer steps shards of the original parameters (param groups work); "
     "supported: true"},
    {"fsdp_version", {"2"}, "accel shards per parameter as FSDP2 does; supported: 2"},
    {"fsdp_cpu_ram_efficient_loading",
     {},
     "it is no launch setting here: build the model under nn::DeferredInit and load weights "
     "with Accelerator::load_model, and each rank reads only its own shards (docs/fsdp.md)"},
};

std::string where_at(const std::string& where, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (m.line >= 0) return where + ":" + std::to_string(m.line + 1);
  return where;
}

[[noreturn]] void bad_key(const std::string& where, const YAML::Node& node, const std::string& key,
                          const std::string& what) {
  ACCEL_THROW(launcher::ConfigError, "config", where_at(where, node), ": key '", key, "': ", what);
}

std::string scalar_text(const YAML::Node& node, const std::string& where, const std::string& key) {
  if (!node.IsScalar()) {
    bad_key(where, node, key,
            std::string("expected a single value, got a ") + (node.IsMap()        ? "mapping"
                                                              : node.IsSequence() ? "list"
                                                                                  : "null"));
  }
  return node.Scalar();
}

// A list (`[a, b]` or a block sequence) or one scalar (`a,b`), as comma-separated text.
std::string list_text(const YAML::Node& node, const std::string& where, const std::string& key) {
  if (!node.IsSequence()) return scalar_text(node, where, key);
  std::string t;
  for (const auto& item : node) t += (t.empty() ? "" : ",") + scalar_text(item, where, key);
  return t;
}

long long read_int(const YAML::Node& node, const std::string& where, const std::string& key,
                   long long lo, long long hi) {
  std::string text = scalar_text(node, where, key);
  auto v = parse_int(text);
  if (!v || *v < lo || *v > hi) {
    bad_key(where, node, key,
            "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + text + "'");
  }
  return *v;
}

bool read_bool(const YAML::Node& node, const std::string& where, const std::string& key) {
  std::string t = to_lower(scalar_text(node, where, key));
  if (t == "true" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "no" || t == "off") return false;
  bad_key(where, node, key, "expected true or false, got '" + node.Scalar() + "'");
}

// A YAML scalar that reads back as exactly `s`. Single quotes when every byte is printable
// (only ' needs doubling there); otherwise double quotes with escapes, because line breaks in a
// single-quoted scalar are folded into spaces on reading (found by fuzz_config's round trip).
std::string quote(const std::string& s) {
  const bool printable = std::all_of(s.begin(), s.end(), [](char ch) {
    const auto u = static_cast<unsigned char>(ch);
    return u >= 0x20 && u != 0x7f;
  });
  if (printable) {
    std::string out = "'";
    for (char c : s) {
      if (c == '\'')
        out += "''";
      else
        out += c;
    }
    return out + "'";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool is_null(const YAML::Node& node) {
  if (node.IsNull()) return true;
  if (!node.IsScalar()) return false;
  std::string t = to_lower(node.Scalar());
  return t.empty() || t == "null" || t == "~";
}

// Note [accelerate keys accel does not implement]: null, false, no, none, empty, or a list or
// mapping of such values. With `ones`, the integer 1 too (a parallelism degree of 1).
bool is_inert(const YAML::Node& node, bool ones) {
  if (is_null(node)) return true;
  if (node.IsScalar()) {
    const std::string t = to_lower(trim(node.Scalar()));
    return t == "false" || t == "no" || t == "off" || t == "none" || (ones && t == "1");
  }
  if (node.IsSequence() || node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it)
      if (!is_inert(node.IsMap() ? it->second : *it, ones)) return false;
    return true;
  }
  return false;
}

// A value as written, for messages ('true', '{a: 1}').
std::string value_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.good() ? std::string(e.c_str()) : std::string("(a mapping or list)");
}

// Note [duplicate keys]
// YAML forbids a key twice in one mapping, but yaml-cpp keeps both and a lookup finds one of
// them: `zero_stage: 3` written again further down a long zero_config would be read or lost
// depending on the lookup. So before anything is read, every mapping of the file at any depth
// (zero_config, fsdp_config, parallelism_config, the keys accepted only when off) is checked, and
// a key given twice is an error naming its path and the line of the first. Iterative.
void check_duplicate_keys(const YAML::Node& root, const std::string& where) {
  std::vector<std::pair<YAML::Node, std::string>> todo = {{root, ""}};
  while (!todo.empty()) {
    const auto [node, path] = todo.back();
    todo.pop_back();
    size_t i = 0;
    if (node.IsSequence())
      for (auto it = node.begin(); it != node.end(); ++it, ++i)
        todo.emplace_back(*it, path + "[" + std::to_string(i) + "]");
    if (!node.IsMap()) continue;
    std::map<std::string, YAML::Node> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node k = it->first;  // a list or mapping as a key is refused by key_text
      const std::string key = !k.IsScalar() ? path : (path.empty() ? "" : path + ".") + k.Scalar();
      if (!k.IsScalar()) {
        todo.emplace_back(it->second, key);
        continue;
      }
      if (auto [first, fresh] = seen.emplace(k.Scalar(), k); !fresh) {
        const int line = first->second.Mark().line;
        bad_key(where, k, key,
                "is given twice" +
                    (line >= 0 ? " (first on line " + std::to_string(line + 1) + ")" : "") +
                    "; YAML keeps only one of them, so remove the other");
      }
      todo.emplace_back(it->second, key);
    }
  }
}

}  // namespace

void validate(const LaunchConfig& c, const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& what) {
    ACCEL_THROW(launcher::ConfigError, "config", where, ": key '", key, "': ", what);
  };
  if (c.compute_environment != "LOCAL_MACHINE") {
    fail("compute_environment",
         "only LOCAL_MACHINE is supported, got '" + c.compute_environment + "'");
  }
  if (auto e = check_distributed_type(c.distributed_type)) fail("distributed_type", *e);
  if (c.num_machines < 1)
    fail("num_machines", "must be at least 1, got " + std::to_string(c.num_machines));
  if (c.num_processes < 1)
    fail("num_processes", "must be at least 1, got " + std::to_string(c.num_processes));
  if (c.num_processes % c.num_machines != 0) {
    fail("num_processes",
         "is the total over all machines and must be a multiple of num_machines (" +
             std::to_string(c.num_machines) + "), got " + std::to_string(c.num_processes));
  }
  if (c.machine_rank < 0 || c.machine_rank >= c.num_machines) {
    fail("machine_rank", "must be in [0, num_machines - 1] = [0, " +
                             std::to_string(c.num_machines - 1) + "], got " +
                             std::to_string(c.machine_rank));
  }
  if (c.main_process_port && (*c.main_process_port < 1 || *c.main_process_port > 65535)) {
    fail("main_process_port", "must be in [1, 65535], got " + std::to_string(*c.main_process_port));
  }
  if (c.main_process_ip && c.main_process_ip->empty())
    fail("main_process_ip", "is empty (use null for none)");
  if (auto e = check_gpu_ids(c.gpu_ids)) fail("gpu_ids", *e);
  if (c.rdzv_backend != "static") {
    fail("rdzv_backend",
         "only 'static' rendezvous (fixed world size, main process as store) is supported, got '" +
             c.rdzv_backend + "'");
  }
  // The training settings, by their rows (Note [settings are checked by their row]).
  for (const auto& [key, v] : c.training) {
    const settings::Setting* row = settings::find_by_yaml(key);
    if (!row) fail(key, "is no setting of the settings table (core/settings.h)");
    if (auto e = check_setting(key, v)) fail(key, *e);
  }
  // The parts of a wrap policy agree (complete_fsdp_wrap fills in fsdp_wrap from them).
  const std::string wrap = c.get("fsdp_config.fsdp_wrap").value_or("");
  if (c.has("fsdp_config.fsdp_wrap_classes") && wrap != "classes") {
    fail("fsdp_config.fsdp_wrap_classes",
         "applies only with fsdp_wrap: classes, got fsdp_wrap: " + (wrap.empty() ? "unset" : wrap));
  }
  if (c.has("fsdp_config.fsdp_min_params") && wrap != "min_params") {
    fail("fsdp_config.fsdp_min_params", "applies only with fsdp_wrap: min_params, got fsdp_wrap: " +
                                            (wrap.empty() ? "unset" : wrap));
  }
  if (wrap == "classes" && !c.has("fsdp_config.fsdp_wrap_classes")) {
    fail("fsdp_config.fsdp_wrap",
         "classes needs fsdp_wrap_classes (the module class names of the units, such as "
         "Block,Layer)");
  }
  if (c.max_restarts < 0)
    fail("max_restarts", "must be >= 0, got " + std::to_string(c.max_restarts));
  if (auto e = check_number(c.monitor_interval, 0, kMaxMonitorInterval, /*lo_open=*/true))
    fail("monitor_interval", "seconds: " + *e);
  if (c.num_cpu_threads_per_process < 0) {
    fail("num_cpu_threads_per_process",
         "must be >= 0 (0: automatic), got " + std::to_string(c.num_cpu_threads_per_process));
  }
}

std::string default_config_path(const EnvMap& env) {
  if (auto p = env_get(env, env::kConfigFile); p && !p->empty()) return *p;
  if (auto x = env_get(env, "XDG_CACHE_HOME"); x && !x->empty())
    return *x + "/accel/default_config.yaml";
  auto home = env_get(env, "HOME");
  ACCEL_CHECK(home && !home->empty(), launcher::ConfigError, "config",
              "HOME is not set, so there is no default config path; pass --config_file");
  return *home + "/.cache/accel/default_config.yaml";
}

namespace {

// "where:line:column" for a yaml-cpp mark, or just `where` when yaml-cpp has no position.
std::string where_mark(const std::string& where, const YAML::Mark& m) {
  if (m.is_null() || m.line < 0) return where;
  return where + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// A mapping key must be a plain scalar (`name: value`); YAML also allows lists, mappings and
// null as keys (`? [a, b] : 1`, `{a: 1}: 2`), which yaml-cpp cannot convert to a string.
std::string key_text(const YAML::Node& key, const std::string& where, const std::string& in) {
  if (!key.IsScalar()) {
    ACCEL_THROW(launcher::ConfigError, "config", where_at(where, key), ": a key", in,
                " must be a plain name, got a ",
                key.IsMap()        ? "mapping"
                : key.IsSequence() ? "list"
                                   : "null",
                " as a key");
  }
  return key.Scalar();
}

LaunchConfig parse_config_node(const std::string& yaml_text, const std::string& where);

}  // namespace

// Note [config parse errors]
// Whatever the text, parse_config() throws ConfigError (or returns): every yaml-cpp exception
// (syntax, recursion depth, a conversion or an invalid node we did not foresee) becomes a
// ConfigError with the file and the position yaml-cpp reports. An uncaught YAML::Exception used
// to abort accel-run (exit 134) on a key such as `{a: 1}: 2`.
LaunchConfig parse_config(const std::string& yaml_text, const std::string& where) {
  try {
    return parse_config_node(yaml_text, where);
  } catch (const YAML::ParserException& e) {
    ACCEL_THROW(launcher::ConfigError, "config", where_mark(where, e.mark),
                ": YAML syntax error: ", e.msg);
  } catch (const YAML::Exception& e) {
    ACCEL_THROW(launcher::ConfigError, "config", where_mark(where, e.mark),
                ": unsupported YAML: ", e.msg);
  }
}

namespace {

// The training settings of a config file (Note [settings are checked by their row]): each key a
// row's own or one of its aliases (Note [aliases of a setting]), its value translated by the alias
// and parsed by the row into LaunchConfig::training; a row given under two spellings is refused
// unless the row lets them agree.
class SettingsReader {
 public:
  SettingsReader(const std::string& where, LaunchConfig& c) : where_(where), c_(c) {}

  // `key` (dotted) is a spelling of `sp.row`; `k` its key node, `v` its value.
  void read(const settings::Spelling& sp, const std::string& key, const YAML::Node& k,
            const YAML::Node& v) {
    const settings::Setting& row = *sp.row;
    if (v.IsNull()) return;  // `null`, `~` or nothing: unset ('' is a value, refused by the row)
    std::string text =
        row.kind == settings::Kind::Names ? list_text(v, where_, key) : scalar_text(v, where_, key);
    std::string why;
    if (sp.alias && sp.alias->value) {
      std::optional<std::string> t = sp.alias->value(text, &why);
      if (!t) bad_key(where_, v, key, why);
      text = *t;
    }
    std::optional<std::string> value = settings::parse(row, text, &why);
    if (!value) bad_key(where_, v, key, why);
    const auto [first, fresh] = given_.emplace(&row, std::make_pair(key, *value));
    if (!fresh && !row.aliases_agree) {
      bad_key(
          where_, k, key,
          "sets " + std::string(row.yaml) + ", which is given already" +
              (first->second.first == key ? std::string() : " (by " + first->second.first + ")"));
    }
    if (!fresh && first->second.second != *value) {
      bad_key(where_, k, key,
              "gives " + std::string(row.yaml) + " " + *value + " but " + first->second.first +
                  " gives it " + first->second.second + "; they are one setting in accel (" +
                  std::string(row.flag) + "), so they must agree");
    }
    c_.training[std::string(row.yaml)] = *value;
  }

  // A section of rows (zero_config, fsdp_config, parallelism_config): its keys by the rows, and
  // the keys Accelerate writes there that accel accepts only while they describe what it does.
  void read_section(const std::string& section, const YAML::Node& v) {
    if (is_null(v)) return;
    if (!v.IsMap()) bad_key(where_, v, section, "expected a mapping (" + holds(section) + ")");
    for (auto z = v.begin(); z != v.end(); ++z) {
      const std::string sub = key_text(z->first, where_, " in " + section);
      const std::string full = section + "." + sub;
      const YAML::Node zv = z->second;  // a copy: see parse_config_node
      if (const settings::Spelling sp = settings::find_by_key(full); sp.row) {
        read(sp, full, z->first, zv);
      } else if (!read_inert(section, sub, full, zv)) {
        std::string best;
        size_t best_d = 4;
        for (const settings::Setting& s : settings::kSettings) {
          if (section_of(s.yaml) != section) continue;
          const size_t d = edit_distance(sub, s.yaml.substr(section.size() + 1));
          if (d < best_d) best_d = d, best = s.yaml.substr(section.size() + 1);
        }
        bad_key(where_, z->first, full,
                best.empty() ? "unknown key (" + holds(section) + ")"
                             : "unknown key (did you mean '" + best + "'?)");
      }
    }  // The wrap policy given in parts (fsdp_wrap_classes alone means classes).
    if (section == "fsdp_config")
      if (auto e = complete_fsdp_wrap(c_)) bad_key(where_, v, section, *e);
  }

 private:
  // "fsdp_config holds fsdp_wrap, fsdp_wrap_classes, ..."
  static std::string holds(const std::string& section) {
    std::string keys;
    for (const settings::Setting& s : settings::kSettings)
      if (section_of(s.yaml) == section)
        keys += (keys.empty() ? "" : ", ") + std::string(s.yaml.substr(section.size() + 1));
    return section + " holds " + keys;
  }

  // Note [accelerate keys accel does not implement]: Accelerate's FSDP settings without a switch
  // in accel, and its context-parallel transport options. False: not such a key.
  bool read_inert(const std::string& section, const std::string& sub, const std::string& full,
                  const YAML::Node& zv) {
    if (section == "fsdp_config") {
      const auto fixed = std::find_if(kFsdpAccelerateValues.begin(), kFsdpAccelerateValues.end(),
                                      [&](const FsdpFixedKey& k) { return sub == k.key; });
      if (fixed == kFsdpAccelerateValues.end()) return false;
      const std::string t = to_lower(trim(value_text(zv)));
      if (std::find(fixed->accepted.begin(), fixed->accepted.end(), t) == fixed->accepted.end())
        bad_key(where_, zv, full, "'" + value_text(zv) + "' is not supported: " + fixed->why);
      return true;
    }
    if (section != "parallelism_config") return false;
    // Accelerate's context-parallel transport options: accel's context parallelism is one
    // algorithm (ring attention over point-to-point sends, parallel/context_parallel.h), the same
    // attention whatever these say.
    return sub == "parallelism_config_cp_comm_strategy" || sub == "parallelism_config_cp_backend";
  }

  const std::string& where_;
  LaunchConfig& c_;
  std::map<const settings::Setting*, std::pair<std::string, std::string>> given_;
};

LaunchConfig parse_config_node(const std::string& yaml_text, const std::string& where) {
  const YAML::Node root = YAML::Load(yaml_text);
  LaunchConfig c;
  if (root.IsNull()) return c;  // an empty file means all defaults
  ACCEL_CHECK(root.IsMap(), launcher::ConfigError, "config", where_at(where, root),
              ": expected a mapping of keys to values at the top level");

  check_duplicate_keys(root, where);  // Note [duplicate keys]
  SettingsReader settings_reader(where, c);
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = key_text(it->first, where, "");
    // A copy (Node is a handle): yaml-cpp's iterator returns a temporary proxy from operator->,
    // so a reference to it->second dangles after this statement (found by fuzz_config, ASan).
    const YAML::Node v = it->second;
    if (key == "compute_environment") {
      c.compute_environment = scalar_text(v, where, key);
      if (c.compute_environment != "LOCAL_MACHINE") {
        bad_key(where, v, key,
                "only LOCAL_MACHINE is supported, got '" + c.compute_environment + "'");
      }
    } else if (key == "distributed_type") {
      std::string t = scalar_text(v, where, key);
      if (auto e = check_distributed_type(t)) bad_key(where, v, key, *e);
      for (char& ch : t) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      c.distributed_type = t;
    } else if (key == "num_machines") {
      // N, or MIN:MAX for elastic membership (accel-run launch then forms rendezvous rounds).
      const std::string text = v.IsScalar() ? v.Scalar() : std::string();
      if (text.find(':') != std::string::npos) {
        MachineCount m;
        try {
          m = parse_num_machines(text, "num_machines");
        } catch (const ConfigError& e) {
          bad_key(where, v, key, e.what());
        }
        c.num_machines = m.min;
        c.max_machines = m.max;
      } else {
        c.num_machines = static_cast<int>(read_int(v, where, key, 1, kMaxMachines));
        c.max_machines = 0;
      }
    } else if (key == "num_processes") {
      c.num_processes = static_cast<int>(read_int(v, where, key, 1, kMaxProcesses));
    } else if (key == "machine_rank") {
      c.machine_rank = static_cast<int>(read_int(v, where, key, 0, kMaxMachines - 1));
    } else if (key == "main_process_ip") {
      if (is_null(v))
        c.main_process_ip.reset();
      else
        c.main_process_ip = trim(scalar_text(v, where, key));
    } else if (key == "main_process_port") {
      if (is_null(v))
        c.main_process_port.reset();
      else
        c.main_process_port = static_cast<int>(read_int(v, where, key, 1, 65535));
    } else if (key == "gpu_ids") {
      const std::string t = list_text(v, where, key);
      if (auto e = check_gpu_ids(t)) bad_key(where, v, key, *e);
      c.gpu_ids = normalize_gpu_ids(t);
    } else if (key == "rdzv_backend") {
      c.rdzv_backend = scalar_text(v, where, key);
      if (c.rdzv_backend != "static") {
        bad_key(where, v, key, "only 'static' is supported, got '" + c.rdzv_backend + "'");
      }
    } else if (key == "same_network") {
      c.same_network = read_bool(v, where, key);
    } else if (key == "main_training_function") {
      c.main_training_function = scalar_text(v, where, key);
    } else if (const settings::Spelling sp = settings::find_by_key(key); sp.row) {
      settings_reader.read(sp, key, it->first, v);  // a top-level row: use_cpu, strategy, ...
    } else if (is_section(key)) {
      settings_reader.read_section(key, v);
    } else if (key == "max_restarts") {
      c.max_restarts = static_cast<int>(read_int(v, where, key, 0, 1 << 20));
    } else if (key == "monitor_interval") {
      std::string t = scalar_text(v, where, key);
      auto d = parse_double(t);
      if (!d) bad_key(where, v, key, "expected seconds in (0, 60], got '" + t + "'");
      if (auto e = check_number(*d, 0, kMaxMonitorInterval, /*lo_open=*/true))
        bad_key(where, v, key, "seconds: " + *e);
      c.monitor_interval = *d;
    } else if (key == "num_cpu_threads_per_process") {
      c.num_cpu_threads_per_process = static_cast<int>(read_int(v, where, key, 0, 1 << 16));
    } else if (const auto inert =
                   std::find_if(kInertOnlyAccelerateKeys.begin(), kInertOnlyAccelerateKeys.end(),
                                [&](const InertOnlyKey& k) { return key == k.key; });
               inert != kInertOnlyAccelerateKeys.end()) {
      // Note [accelerate keys accel does not implement]
      if (!is_inert(v, false))
        bad_key(where, v, key,
                "'" + value_text(v) + "' asks for something accel does not do: " + inert->instead +
                    "; accepted only when off (false, 'no', null or empty)");
    } else {
      std::string best;
      size_t best_d = 4;  // suggest only close matches
      std::vector<std::string> known = kKnownKeys;
      for (const settings::Setting& s : settings::kSettings)
        known.emplace_back(section_of(s.yaml).empty() ? s.yaml : section_of(s.yaml));
      for (const auto& k : known) {
        size_t d = edit_distance(key, k);
        if (d < best_d) best_d = d, best = k;
      }
      bad_key(
          where, it->first, key,
          best.empty() ? std::string("unknown key") : "unknown key (did you mean '" + best + "'?)");
    }
  }
  validate(c, where);
  return c;
}

}  // namespace

LaunchConfig load_config(const std::string& path) {
  // Not through a FIFO or device, at most kMaxConfigBytes (Note [safe file access]); a link to a
  // config file is followed.
  return parse_config(file_io::read_file(path, "config", kMaxConfigBytes), path);
}

MachineCount parse_num_machines(const std::string& v, const char* what) {
  const std::string t = trim(v);
  const auto colon = t.find(':');
  auto number = [&](const std::string& part) {
    auto n = parse_int(trim(part));
    ACCEL_CHECK(n && *n >= 1 && *n <= (1 << 16), launcher::ConfigError, "launch", what,
                ": expected N or MIN:MAX with 1 <= MIN <= MAX <= 65536, got '", v, "'");
    return static_cast<int>(*n);
  };
  MachineCount c;
  if (colon == std::string::npos) {
    c.min = c.max = number(t);
    return c;
  }
  c.min = number(t.substr(0, colon));
  c.max = number(t.substr(colon + 1));
  c.elastic = true;
  ACCEL_CHECK(c.min <= c.max, launcher::ConfigError, "launch", what, " ", v,
              ": MIN must not exceed MAX");
  return c;
}

std::string config_to_yaml(const LaunchConfig& c) {
  std::ostringstream os;
  os << "# accel-run config (keys as in Accelerate's default_config.yaml; see docs/launcher.md)\n";
  os << "compute_environment: " << c.compute_environment << "\n";
  os << "distributed_type: " << c.distributed_type << "\n";
  os << "num_machines: " << c.num_machines
     << (c.max_machines > 0 ? ":" + std::to_string(c.max_machines) : std::string()) << "\n";
  os << "num_processes: " << c.num_processes << "  # total over all machines\n";
  os << "machine_rank: " << c.machine_rank << "\n";
  os << "main_process_ip: " << (c.main_process_ip ? quote(*c.main_process_ip) : "null") << "\n";
  os << "main_process_port: "
     << (c.main_process_port ? std::to_string(*c.main_process_port) : "null") << "\n";
  os << "gpu_ids: " << (c.gpu_ids == "all" ? std::string("all") : quote(c.gpu_ids)) << "\n";
  os << "rdzv_backend: " << c.rdzv_backend << "\n";
  os << "same_network: " << (c.same_network ? "true" : "false") << "\n";
  os << "main_training_function: " << quote(c.main_training_function) << "\n";
  // The training settings: one line per row that is set, by its dotted key (a section per
  // prefix, in table order). Only what was chosen: an unset one leaves the program's
  // AcceleratorConfig alone.
  std::vector<std::pair<std::string_view, std::string>> sections;  // ("", top-level lines) first
  sections.emplace_back("", "");
  for (const settings::Setting& s : settings::kSettings) {
    const std::optional<std::string> v = c.get(s.yaml);
    if (!v) continue;
    const bool bare = s.kind == settings::Kind::Int || s.kind == settings::Kind::Bool;
    const size_t dot = s.yaml.find('.');
    const std::string_view section = dot == std::string_view::npos ? "" : s.yaml.substr(0, dot);
    auto it = std::find_if(sections.begin(), sections.end(),
                           [&](const auto& sec) { return sec.first == section; });
    if (it == sections.end()) it = sections.insert(sections.end(), {section, ""});
    it->second += (section.empty() ? "" : "  ") + std::string(s.yaml.substr(dot + 1)) + ": " +
                  (bare ? *v : quote(*v)) + "\n";
  }
  for (const auto& [section, lines] : sections) {
    if (section.empty()) {
      os << lines;
      continue;
    }
    os << section << ":";
    if (section == "fsdp_config") os << "  # zero_stage 3";
    if (section == "parallelism_config") os << "  # unset sizes are inferred (docs/parallelism.md)";
    os << "\n" << lines;
  }
  os << "max_restarts: " << c.max_restarts << "\n";
  os << "monitor_interval: " << c.monitor_interval << "\n";
  os << "num_cpu_threads_per_process: " << c.num_cpu_threads_per_process << "  # 0: automatic\n";
  return os.str();
}

void save_config(const LaunchConfig& c, const std::string& path) {
  validate(c, path);
  // A unique temporary renamed over `path`, in a folder created or checked on the way
  // (Note [safe file access]).
  file_io::write_file_atomic(path, config_to_yaml(c), "config", /*durable=*/true,
                             /*create_dirs=*/true);
}

}  // namespace accel::launcher
