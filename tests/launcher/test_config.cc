// accel-run config files with odd YAML shapes: every one is a ConfigError naming the file and
// position, never an uncaught yaml-cpp exception (which aborted accel-run with exit 134).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launcher/config.h"

namespace al = accel::launcher;

namespace {

// The ConfigError message for `yaml`; fails the test for any other outcome.
std::string config_error(const std::string& yaml) {
  try {
    al::parse_config(yaml, "odd.yaml");
  } catch (const al::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a ConfigError, got: " << e.what());
    return "";
  }
  FAIL("expected a ConfigError, the config was accepted");
  return "";
}

}  // namespace

TEST_CASE("non-scalar keys are ConfigErrors with the file and line") {
  struct Case {
    std::string yaml, expect;
  };
  const std::vector<Case> cases = {
      {"? [a, b]\n: 1\n", "odd.yaml:1: a key must be a plain name, got a list as a key"},
      {"{a: 1}: 2\n", "odd.yaml:1: a key must be a plain name, got a mapping as a key"},
      {"num_processes: 2\n? [x]\n: 3\n", "odd.yaml:2: a key must be a plain name"},
      {"? \n: 1\n", "a key must be a plain name"},
      {"zero_config:\n  ? [zero_stage]\n  : 1\n", "odd.yaml:2: a key in zero_config must be"},
      {"zero_config: {{zero_stage: 1}: 2}\n", "a key in zero_config must be a plain name"},
  };
  for (const auto& c : cases) {
    INFO(c.yaml);
    const std::string msg = config_error(c.yaml);
    CHECK(msg.find("[config]") == 0);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
  }
}

TEST_CASE("other odd YAML shapes are ConfigErrors too") {
  const std::vector<std::string> odd = {
      std::string(5000, '[') + std::string(5000, ']'),  // yaml-cpp's recursion limit
      "num_processes: [\n",                             // unterminated flow sequence
      "a: &x 1\nb: *y\n",                               // unknown alias
      "- 1\n- 2\n",                                     // a list at the top level
      "just a string",
      "num_processes: {a: 1}\n",
      "gpu_ids: [[0]]\n",
      "\t- tab\n",
      "num_processes: !!binary aGVsbG8=\n",
      "<<: {num_processes: 2}\n",
      std::string("num_processes: 2\0x", 18),
  };
  for (const auto& yaml : odd) {
    INFO(yaml.substr(0, 40));
    const std::string msg = config_error(yaml);
    CHECK(msg.find("odd.yaml") != std::string::npos);
  }
}

TEST_CASE("what config_to_yaml writes parses back to the same config") {
  al::LaunchConfig c;
  c.distributed_type = "MULTI_CPU";
  c.num_machines = 2;
  c.num_processes = 4;
  c.machine_rank = 1;
  c.main_process_ip = "node-0'1";
  c.main_process_port = 29501;
  c.main_training_function = "it's: #main";
  c.zero_stage = 3;
  c.monitor_interval = 0.25;
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
  // Line breaks and other control characters: a single-quoted scalar folds line breaks into
  // spaces, so these are written double-quoted with escapes (found by fuzz_config).
  c.main_training_function = "mg:\n \ngrad\tx\\ \"y\" \x01";
  c.main_process_ip = "a\rb";
  CHECK(al::parse_config(al::config_to_yaml(c), "rt.yaml") == c);
}
