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
  const std::optional<std::string> precision =
      parse_setting("mixed_precision", mixed_precision, &why);
  ACCEL_CHECK(precision.has_value(), launcher::ConfigError, "config", "--mixed_precision: ", why);
  c.set("mixed_precision", precision);
  if (gpu_count > 1) {
    c.distributed_type = "MULTI_GPU";
    c.num_processes = gpu_count;
  } else if (gpu_count == 1) {
    c.distributed_type = "NO";
  } else {
    c.distributed_type = "NO";
    c.set("use_cpu", "true");
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

  // Row `s` asked by its Question (Note [questions from the table] in core/settings.h): a Choice
  // as a menu with the row's default first, a Bool as yes/no, the rest as text with the row's
  // default (none for names: the row's default describes the unset setting). The answer is
  // checked by the row's parser, then by `extra` (given the canonical value). Returns the
  // canonical value.
  std::string ask_row(const settings::Setting& s,
                      const std::function<std::optional<std::string>(const std::string&)>& extra) {
    std::string question(s.question.prompt), default_answer(s.default_value);
    std::vector<std::string> menu;
    if (s.kind == settings::Kind::Choice) {
      menu.push_back(default_answer);
      for (const std::string& v : split(std::string(s.allowed), '|'))
        if (v != s.default_value) menu.push_back(v);
      question += " (";
      for (size_t i = 0; i < menu.size(); ++i)
        question += (i ? ", " : "") + std::string("[") + std::to_string(i) + "] " + menu[i];
      question += ")";
      default_answer = "0";
    } else if (s.kind == settings::Kind::Bool) {
      default_answer = default_answer == "true" ? "yes" : "no";
    } else if (s.kind == settings::Kind::Names) {
      default_answer.clear();
    }
    // The answer as the row reads it: a menu entry by number or name, y / n for yes / no.
    auto canonical = [&](const std::string& answer, std::string* why) {
      std::string text = answer;
      if (auto i = parse_int(answer); !menu.empty() && i && *i >= 0 && size_t(*i) < menu.size())
        text = menu[size_t(*i)];
      if (s.kind == settings::Kind::Bool && (to_lower(answer) == "y" || to_lower(answer) == "n"))
        text = to_lower(answer) == "y" ? "yes" : "no";
      return settings::parse(s, text, why);
    };
    const std::string a =
        ask(question, default_answer, [&](const std::string& answer) -> std::optional<std::string> {
          std::string why;
          const std::optional<std::string> v = canonical(answer, &why);
          if (!v) return why;
          return extra ? extra(*v) : std::nullopt;
        });
    return *canonical(a, nullptr);
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

// The rows with a question, in table order (Note [questions from the table] in core/settings.h).
// Each answer is also checked with the answers before it by the rules accel-run applies at launch
// (Note [cross-row rules]: mesh sizes that do not fit the processes, a ZeRO stage the tp size does
// not run with). Only answers other than the row's default are written.
void ask_settings(Asker& a, LaunchConfig& c) {
  const bool distributed = c.distributed_type != "NO" && c.num_processes >= 2;
  for (const settings::Setting& s : settings::kSettings) {
    if (!settings::question_applies(s, c.training, distributed)) continue;
    const std::string v = a.ask_row(s, [&](const std::string& value) -> std::optional<std::string> {
      settings::Values by_env;
      for (const auto& [key, given] : c.training) by_env[std::string(setting_row(key).env)] = given;
      by_env[std::string(s.env)] = value;
      if (auto r = settings::check_rules(by_env, c.num_processes)) return r->why;
      return std::nullopt;
    });
    if (v != s.default_value) c.training[std::string(s.yaml)] = v;
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
    c.set("use_cpu", a.ask_yes_no("Do you want to run your training on CPU only (even if a GPU "
                                  "is available)?",
                                  gpu_count == 0)
                         ? "true"
                         : "false");
    c.num_processes = 1;
  } else if (c.distributed_type == "MULTI_CPU") {
    c.set("use_cpu", "true");
    c.num_processes = static_cast<int>(
        a.ask_int("How many CPU processes should be used in total, over all machines?",
                  2LL * machines, 1, kMaxProcesses, multiple_of_machines));
  } else {
    c.set("use_cpu", "false");
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

  ask_settings(a, c);
  validate(c, "questionnaire");
  check_parallelism(c, c.num_processes, "questionnaire");
  return c;
}

}  // namespace accel::launcher
