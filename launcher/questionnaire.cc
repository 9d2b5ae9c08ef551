// `accel-run config`: the questionnaire and `config default` (launcher/config.h).
#include "launcher/config.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <string_view>

namespace accel::launcher {

LaunchConfig basic_config(int gpu_count, const std::string& mixed_precision) {
  LaunchConfig c;
  std::string why;  // Note [settings are checked by their row]
  c.mixed_precision = parse_setting("mixed_precision", mixed_precision, &why);
  ACCEL_CHECK(c.mixed_precision.has_value(), launcher::ConfigError, "config",
              "--mixed_precision: ", why);
  if (gpu_count > 1) {
    c.distributed_type = "MULTI_GPU";
    c.num_processes = gpu_count;
  } else if (gpu_count == 1) {
    c.distributed_type = "NO";
  } else {
    c.distributed_type = "NO";
    c.use_cpu = true;
  }
  return c;
}

namespace {

// One question of the questionnaire: empty answer takes the default; `check` returns an
// explanation when the answer is not acceptable, and the question is asked again.
class Asker {
 public:
  Asker(std::istream& in, std::ostream& out) : in_(in), out_(out) {}

  std::string ask(const std::string& question, const std::string& default_answer,
                  const std::function<std::optional<std::string>(const std::string&)>& check) {
    while (true) {
      out_ << question;
      if (!default_answer.empty()) out_ << " [" << default_answer << "]";
      out_ << ": " << std::flush;
      std::string line;
      if (!std::getline(in_, line)) {
        out_ << "\n";
        ACCEL_THROW(launcher::ConfigError, "config",
                    "input ended before the questionnaire was finished (at: ", question, ")");
      }
      std::string answer = trim(line);
      if (answer.empty()) answer = default_answer;
      if (answer.empty()) {
        out_ << "  An answer is required here. Please try again.\n";
        continue;
      }
      if (auto why = check(answer)) {
        out_ << "  Invalid answer '" << answer << "': " << *why << ". Please try again.\n";
        continue;
      }
      return answer;
    }
  }

  long long ask_int(const std::string& question, long long default_value, long long lo,
                    long long hi,
                    const std::function<std::optional<std::string>(long long)>& extra = {}) {
    std::string a = ask(question, std::to_string(default_value),
                        [&](const std::string& s) -> std::optional<std::string> {
                          auto v = parse_int(s);
                          if (!v || *v < lo || *v > hi) {
                            return "expected an integer from " + std::to_string(lo) + " to " +
                                   std::to_string(hi);
                          }
                          if (extra) return extra(*v);
                          return std::nullopt;
                        });
    return *parse_int(a);
  }

  bool ask_yes_no(const std::string& question, bool default_value) {
    std::string a = ask(question + (default_value ? " [YES/no]" : " [yes/NO]"), "",
                        [](const std::string& s) -> std::optional<std::string> {
                          std::string l = to_lower(s);
                          if (l == "yes" || l == "y" || l == "no" || l == "n") return std::nullopt;
                          return std::string("expected yes or no");
                        });
    return to_lower(a)[0] == 'y';
  }

  // A training setting (Note [settings are checked by their row]): the answer is checked by the
  // row of `key`, the row's default is offered, and the canonical spelling returned.
  // `extra` may refuse a value the row accepts (given in the row's spelling).
  std::string ask_setting(
      const std::string& question, std::string_view key,
      const std::function<std::optional<std::string>(const std::string&)>& extra = {}) {
    const std::string a = ask(question, std::string(setting_row(key).default_value),
                              [&](const std::string& s) -> std::optional<std::string> {
                                if (auto why = check_setting(key, s)) return why;
                                if (!extra) return std::nullopt;
                                return extra(*parse_setting(key, s, nullptr));
                              });
    return *parse_setting(key, a, nullptr);
  }

  // A setting of the Choice kind: the row's default first ([0], the default answer), then its
  // other values in the row's order, each described by `about` (the value alone where `about`
  // has none). Returns the value chosen.
  std::string ask_setting_choice(const std::string& question, std::string_view key,
                                 const std::map<std::string, std::string>& about) {
    const settings::Setting& s = setting_row(key);
    std::vector<std::string> values = {std::string(s.default_value)};
    for (const std::string& v : split(std::string(s.allowed), '|'))
      if (v != s.default_value) values.push_back(v);
    std::vector<std::pair<std::string, std::string>> options;
    for (const std::string& v : values) {
      const auto d = about.find(v);
      options.emplace_back(v, d == about.end() ? v : d->second);
    }
    return options[ask_choice(question, options, 0)].first;
  }

  // Choice by index or by name; returns the index.
  size_t ask_choice(const std::string& question,
                    const std::vector<std::pair<std::string, std::string>>& options,
                    size_t default_index) {
    std::string q = question + " (";
    for (size_t i = 0; i < options.size(); ++i) {
      q += (i ? ", " : "") + std::string("[") + std::to_string(i) + "] " + options[i].second;
    }
    q += ")";
    auto index_of = [&](const std::string& s) -> std::optional<size_t> {
      if (auto v = parse_int(s); v && *v >= 0 && static_cast<size_t>(*v) < options.size()) {
        return static_cast<size_t>(*v);
      }
      for (size_t i = 0; i < options.size(); ++i) {
        if (to_lower(s) == to_lower(options[i].first)) return i;
      }
      return std::nullopt;
    };
    std::string a = ask(q, std::to_string(default_index),
                        [&](const std::string& s) -> std::optional<std::string> {
                          if (index_of(s)) return std::nullopt;
                          std::string names;
                          for (size_t i = 0; i < options.size(); ++i)
                            names += (i ? ", " : "") + options[i].first;
                          return "expected a number from 0 to " +
                                 std::to_string(options.size() - 1) + " or one of " + names;
                        });
    return *index_of(a);
  }

 private:
  std::istream& in_;
  std::ostream& out_;
};

// The device mesh (Note [mesh sizes] in core/parallelism.h), for a distributed config: replicas
// and tensor-parallel size; dp_shard_size is the rest of the processes, not asked. Only sizes
// above 1 are written.
void ask_mesh(Asker& a, LaunchConfig& c) {
  if (c.distributed_type == "NO" || c.num_processes < 2) return;
  const int world = c.num_processes;
  auto divides = [](int total, const char* what) {
    return [total, what](const std::string& v) -> std::optional<std::string> {
      if (total % std::stoi(v) == 0) return std::nullopt;
      return "the size must divide " + std::string(what) + " (" + std::to_string(total) + ")";
    };
  };
  const int replicas = std::stoi(a.ask_setting(
      "How many replicas of the model (dp_replicate_size: with ZeRO, hybrid sharding: ZeRO inside "
      "a replica, all-reduce across replicas)?",
      "parallelism_config.parallelism_config_dp_replicate_size",
      divides(world, "the number of processes")));
  const int tp = std::stoi(a.ask_setting(
      "Over how many processes should each layer be split (tp_size: tensor parallelism with "
      "ZeRO stage 0 or 3 and the program's AcceleratorConfig::tp_plan)?",
      "parallelism_config.parallelism_config_tp_size",
      divides(world / replicas, "the processes per replica")));
  if (replicas > 1) c.dp_replicate_size = replicas;
  if (tp > 1) c.tp_size = tp;
}

// The ZeRO questions (stage, param dtype, ZeRO-3 wrap policy), for a distributed config.
void ask_zero(Asker& a, LaunchConfig& c) {
  if (c.distributed_type != "NO") {
    // Note [strategies with tensor parallelism] in core/parallelism.h: stages 1-2 and tp are
    // refused at launch, so they are not written either.
    const int tp = c.tp_size.value_or(1);
    c.zero_stage = std::stoi(a.ask_setting(
        "Which ZeRO stage do you want (0: off, 1: shard optimizer state, 2: + gradients, 3: + "
        "parameters)?",
        "zero_config.zero_stage", [tp](const std::string& v) -> std::optional<std::string> {
          const BuiltinStrategy* b = builtin_strategy_for_stage(std::stoi(v));
          return b ? tp_strategy_conflict(tp, b->name) : std::nullopt;
        }));
  }
  // Only answers that differ from the defaults are written: accepting a default leaves the
  // program's own AcceleratorConfig::zero / ::fsdp choice in charge.
  if (c.zero_stage >= 1) {
    const std::string d = a.ask_setting_choice(
        "In which dtype should ZeRO compute with the parameters (the optimizer keeps fp32 master "
        "shards)?",
        "zero_config.param_dtype", {{"fp32", "fp32: no conversion"}});
    if (d != setting_row("zero_config.param_dtype").default_value) {
      c.param_dtype = d;
      if (a.ask_yes_no("Reduce gradients in fp32 instead of " + d + "?", false))
        c.reduce_dtype = parse_setting("zero_config.reduce_dtype", "fp32", nullptr).value();
    }
  }
  if (c.zero_stage == 3) {
    const std::string w =
        a.ask_setting_choice("Which modules should ZeRO-3 shard as units?", "fsdp_config.fsdp_wrap",
                             {{"entries", "every ModuleList/Sequential entry"},
                              {"classes", "entries of the classes you name"},
                              {"min_params", "entries with at least N parameters"},
                              {"none", "none: the whole model is one unit"}});
    if (w != setting_row("fsdp_config.fsdp_wrap").default_value) c.fsdp_wrap = w;
    if (w == "classes") {
      // No default: the row's "none" describes the unset setting, not an answer.
      c.fsdp_wrap_classes = *parse_setting(
          "fsdp_config.fsdp_wrap_classes",
          a.ask("Which module classes are units (comma-separated, e.g. Block,Layer)?", "",
                [](const std::string& s) {
                  return check_setting("fsdp_config.fsdp_wrap_classes", s);
                }),
          nullptr);
    } else if (w == "min_params") {
      c.fsdp_min_params = std::stoll(a.ask_setting(
          "At least how many parameters make an entry a unit?", "fsdp_config.fsdp_min_params"));
    }
    if (a.ask_yes_no(
            "Recompute each unit's forward in its backward (activation checkpointing: less "
            "memory, more compute)?",
            false))
      c.fsdp_activation_checkpointing = true;
  }
}

}  // namespace

LaunchConfig run_questionnaire(std::istream& in, std::ostream& out, int gpu_count) {
  Asker a(in, out);
  LaunchConfig c;
  a.ask_choice("In which compute environment are you running?", {{"LOCAL_MACHINE", "This machine"}},
               0);
  c.compute_environment = "LOCAL_MACHINE";

  const std::vector<std::pair<std::string, std::string>> types = {
      {"NO", "No distributed training"}, {"MULTI_CPU", "multi-CPU"}, {"MULTI_GPU", "multi-GPU"}};
  size_t t = a.ask_choice("Which type of machine are you using?", types, gpu_count > 1 ? 2 : 0);
  c.distributed_type = types[t].first;

  if (c.distributed_type != "NO") {
    c.num_machines = static_cast<int>(a.ask_int(
        "How many different machines will you use (use more than 1 for multi-node training)?", 1, 1,
        kMaxMachines));
    if (c.num_machines > 1) {
      c.machine_rank = static_cast<int>(a.ask_int(
          "What is the rank of this machine (0 for the main machine)?", 0, 0, c.num_machines - 1));
      c.main_process_ip = a.ask(
          "What is the IP address (or host name) of the machine that will host the main process?",
          "", [](const std::string& s) -> std::optional<std::string> {
            if (s.find_first_of(" \t/") != std::string::npos) {
              return std::string("expected an address such as 10.0.0.1 or node01");
            }
            return std::nullopt;
          });
      c.main_process_port = static_cast<int>(
          a.ask_int("What is the port you will use to communicate with the main process?",
                    kDefaultMainProcessPort, 1, 65535));
      c.same_network = a.ask_yes_no("Are all the machines on the same local network?", true);
    }
  }

  const int machines = c.num_machines;
  auto multiple_of_machines = [machines](long long v) -> std::optional<std::string> {
    if (v % machines == 0) return std::nullopt;
    return "the total must be a multiple of the number of machines (" + std::to_string(machines) +
           ")";
  };
  if (c.distributed_type == "NO") {
    c.use_cpu =
        a.ask_yes_no("Do you want to run your training on CPU only (even if a GPU is available)?",
                     gpu_count == 0);
    c.num_processes = 1;
  } else if (c.distributed_type == "MULTI_CPU") {
    c.use_cpu = true;
    c.num_processes = static_cast<int>(
        a.ask_int("How many CPU processes should be used in total, over all machines?",
                  2LL * machines, 1, kMaxProcesses, multiple_of_machines));
  } else {
    c.use_cpu = false;
    c.num_processes = static_cast<int>(
        a.ask_int("How many GPU processes should be used in total, over all machines?",
                  static_cast<long long>(std::max(gpu_count, 1)) * machines, 1, kMaxProcesses,
                  multiple_of_machines));
    std::string ids = a.ask(
        "What GPU(s) (by id) should be used for training on this machine as a comma-separated "
        "list?",
        "all", check_gpu_ids);
    c.gpu_ids = normalize_gpu_ids(ids);
  }

  ask_mesh(a, c);
  ask_zero(a, c);
  c.gradient_accumulation_steps = std::stoi(a.ask_setting(
      "How many gradient accumulation steps do you want?", "gradient_accumulation_steps"));
  c.mixed_precision =
      a.ask_setting_choice("Do you wish to use mixed precision?", "mixed_precision", {});
  validate(c, "questionnaire");
  check_parallelism(c, c.num_processes, "questionnaire");
  return c;
}

}  // namespace accel::launcher
