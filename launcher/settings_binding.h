// accel-run's side of the settings table (core/settings.h): which LaunchFlags / LaunchConfig field
// holds each row. main.cc registers one flag per row through set_setting_flag, and worker_env
// exports each row that exported_setting() says the user set.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/settings.h"
#include "launcher/config.h"
#include "launcher/plan.h"

namespace accel::launcher {

// The flag of row `s` given `raw`: parsed by the table, stored in its LaunchFlags field;
// ConfigError naming the flag and what it accepts.
void set_setting_flag(LaunchFlags& f, const settings::Setting& s, const std::string& raw);

// `raw` given for the flag of the row whose config key is `key`, in the row's canonical spelling;
// ConfigError naming the flag and what it accepts (Note [settings are checked by their row] in
// launcher/config.h). set_setting_flag and resolve_plan read every flag value through it.
std::string parse_setting_flag(std::string_view key, const std::string& raw);

// Row `s`'s value in the plan, in the table's canonical spelling; nullopt when neither the
// config file nor a flag set it (Note [who wins: launcher or program] in launcher/config.h).
std::optional<std::string> exported_setting(const LaunchPlan& p, const settings::Setting& s);

}  // namespace accel::launcher
