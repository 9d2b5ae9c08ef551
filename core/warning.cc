#include "core/warning.h"

#include <iostream>
#include <mutex>
#include <set>
#include <utility>

namespace accel {

namespace {

struct WarningState {
  std::mutex mu;
  std::set<std::string> shown;  // Note [warnings]: each line once per process
  WarningHandler handler;
};

WarningState& state() {
  static WarningState* s = new WarningState;  // never destroyed: warnings from static dtors
  return *s;
}

}  // namespace

void warn_once(const std::string& line) {
  WarningState& s = state();
  WarningHandler handler;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.shown.insert(line).second) return;
    handler = s.handler;
  }
  if (handler) {
    handler(line);
  } else {
    std::cerr << "accel: warning: " << line << std::endl;
  }
}

WarningHandler set_warning_handler(WarningHandler handler) {
  WarningState& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return std::exchange(s.handler, std::move(handler));
}

void reset_warnings_shown() {
  WarningState& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.shown.clear();
}

}  // namespace accel
