// Environment variables set or unset for a scope, for tests of what the library reads from the
// environment. Header-only, std + POSIX.
#pragma once

#include <stdlib.h>

#include <map>
#include <optional>
#include <string>

namespace accel::test {

// Every variable it sets or unsets gets its earlier value (or absence) back on destruction.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  // One variable; a null value unsets it.
  ScopedEnv(const char* name, const char* value) {
    if (value) {
      set(name, value);
    } else {
      unset(name);
    }
  }
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) set(k, v);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const std::string& name, const std::string& value) {
    save(name);
    setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    unsetenv(name.c_str());
  }

 private:
  // The value before this object first touched `name`.
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace accel::test
