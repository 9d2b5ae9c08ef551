// Fuzz target: accel-run's config file parser. ConfigError is the documented failure. A config
// that parses must survive a round trip through config_to_yaml().
#include <cstdint>
#include <cstdlib>
#include <string>

#include "launcher/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::launcher;
  const std::string text(reinterpret_cast<const char*>(data), size);
  LaunchConfig c;
  try {
    c = parse_config(text, "<fuzz>");
  } catch (const ConfigError&) {
    return 0;
  }
  // What we write we must read back, unchanged.
  if (parse_config(config_to_yaml(c), "<fuzz:round-trip>") != c) std::abort();
  return 0;
}
