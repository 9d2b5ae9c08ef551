// accel-run's side of the settings table (core/settings.h): which LaunchConfig field holds each
// row (set_config_setting / config_setting in launcher/config.h). main.cc registers one flag per
// row and hands its value to set_setting_flag (the one parse of a flag); resolve_plan applies
// LaunchFlags::training over the config file, and worker_env exports each row that
// exported_setting() says the user set.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/settings.h"
#include "launcher/config.h"
#include "launcher/plan.h"

namespace accel::launcher {

// The flag of row `s` given `raw`: parsed by the row once, stored in f.training under its config
// key; ConfigError naming the flag and what it accepts (Note [settings are checked by their row]
// in launcher/config.h).
void set_setting_flag(LaunchFlags& f, const settings::Setting& s, const std::string& raw);
// The same for the row whose flag ("--zero_stage") or config key ("zero_config.zero_stage") is
// `key_or_flag`.
void set_setting_flag(LaunchFlags& f, std::string_view key_or_flag, const std::string& raw);

// Row `s`'s value in the plan, in the table's canonical spelling; nullopt when neither the
// config file nor a flag set it (Note [who wins: launcher or program] in launcher/config.h).
std::optional<std::string> exported_setting(const LaunchPlan& p, const settings::Setting& s);

}  // namespace accel::launcher
