// Small helpers shared by the accel-run subcommands: environment maps, string parsing, ports.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace accel::launcher {

// A bad config file, bad flag value or an inconsistent combination of them. The message names the
// key (or flag) and the value that was rejected.
class ConfigError : public ValueError {
 public:
  using ValueError::ValueError;
};

// Environment as a sorted map; the tests build one by hand instead of touching the real one.
using EnvMap = std::map<std::string, std::string>;

EnvMap current_environment();
std::optional<std::string> env_get(const EnvMap& env, const std::string& key);

// "KEY=VALUE" strings for execve, base overridden by `vars`.
std::vector<std::string> make_environ(const EnvMap& base, const EnvMap& vars);

std::string trim(std::string_view s);
std::string to_lower(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);

// Whole-string integer parse; nullopt on junk, overflow or empty input.
std::optional<long long> parse_int(std::string_view s);
// Whole-string floating parse; nullopt on junk, overflow or empty input. "nan" and "inf" parse:
// check_number() is what refuses them.
std::optional<double> parse_double(std::string_view s);

// Note [floating options]: every floating flag and config key of accel-run goes through this one
// check. NaN compares false with every bound, so a range check written `v < lo || v > hi` lets
// it through (--grace_period nan acted as 0); infinities are no number of seconds either.
// Returns why `v` is not a finite number in [lo, hi] (in (lo, hi] when lo_open), or nothing.
std::optional<std::string> check_number(double v, double lo, double hi, bool lo_open = false);

// Levenshtein distance, used to suggest the intended key for a misspelled one.
size_t edit_distance(std::string_view a, std::string_view b);

// Asks the kernel for a free TCP port on `addr` (bind to port 0). The port is released again
// before returning, so another process may take it first; the launcher accepts that race, as
// torchrun does, because the store retries its bind with a clear error.
int pick_free_port(const std::string& addr);

// Number of CPUs this process may run on (sched_getaffinity), at least 1.
int usable_cpu_count();

// Directory of the running executable (/proc/self/exe), empty if unknown.
std::string self_exe_dir();

// "SIGSEGV" for 11; "signal 77" for unknown numbers.
std::string signal_name(int sig);

// Signal number for "SIGUSR1", "usr1" or "10"; nullopt for anything else.
std::optional<int> parse_signal(std::string_view s);

// `bytes` random bytes from the kernel (getrandom) as lowercase hex. Throws IoError when the
// kernel has none to give: a predictable token or id would be worse than none.
std::string random_hex(size_t bytes);

// This machine's host name ("unknown" if gethostname fails).
std::string host_name();

}  // namespace accel::launcher
