// What accel-run checks of the training settings before it starts a worker: the values every
// worker will read, wherever they come from (Note [checks before any worker starts]).
#pragma once

#include <map>
#include <string>

#include "launcher/config.h"
#include "launcher/util.h"

namespace accel::launcher {

// Note [checks before any worker starts]
// A worker reads its training settings (the rows of core/settings.h) from its environment: the
// ones accel-run exports (a flag, else a key of the config file) and, for a row accel-run does not
// export, whatever ACCEL_* variable the worker inherits from accel-run's own environment (an
// `export ACCEL_TP_SIZE=2` left in the shell). Every combination the library refuses in the
// Accelerator's constructor for reasons accel-run can see is refused here first, with the
// library's words (the rules are shared: core/parallelism.h, core/settings.h) and where each
// value came from, so that a bad launch costs no start-up of N workers and no N copies of one
// ValueError:
//   - an inherited variable its row does not accept (ACCEL_ZERO_STAGE=7);
//   - mesh sizes that do not fit the world accel-run is about to start (Note [mesh sizes]);
//   - a strategy and a zero_stage that contradict each other (Note [built-in strategies]);
//   - tp_size > 1 with a strategy other than ddp / fsdp (Note [strategies with tensor
//     parallelism]): zero_stage 1 or 2, or a program's own strategy;
//   - ZeRO-3 options with another stage, ZeRO compute dtypes without ZeRO (Note [options a stage
//     does not use]).
// A setting no one gave is the program's (AcceleratorConfig): accel-run cannot see it and checks
// nothing about it (the library still does).

// Where the value of one setting a worker will read comes from.
struct SettingOrigin {
  std::string value;  // the row's canonical spelling
  std::string from;   // "--tp_size", "key zero_config.zero_stage of cfg.yaml", "ACCEL_TP_SIZE ..."
  std::string var;    // its variable, "ACCEL_TP_SIZE"
  bool inherited = false;
};
// By environment variable (core/settings.h's env column); rows nobody set are absent.
using EffectiveSettings = std::map<std::string, SettingOrigin, std::less<>>;

// `merged`: the config file with the flags applied; `flags_only`: the flags applied to an empty
// config (what tells a flag from a key); `env`: accel-run's environment, which the workers
// inherit; `config_where` names the config file in origins ("" when there is none).
EffectiveSettings effective_settings(const LaunchConfig& merged, const LaunchConfig& flags_only,
                                     const EnvMap& env, const std::string& config_where);

// ConfigError for the first combination of Note [checks before any worker starts] that `s`
// holds for a world of `world` processes; `where` prefixes the message.
void check_effective_settings(const EffectiveSettings& s, int world, const std::string& where);

}  // namespace accel::launcher
