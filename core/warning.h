// Warnings: what torch says with warnings.warn (a UserWarning on stderr) and goes on, such as a
// loss broadcasting a target of another shape. accel::warn writes
//   accel: warning: [op] message
// to stderr, or hands the line to the handler a program or test installed.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace accel {

// Note [warnings]
// Python shows a UserWarning once per call site and message (the "default" filter); C++ has no
// call site to key on without changing every signature, so accel shows each distinct message
// once per process (libtorch's TORCH_WARN_ONCE, keyed by the text): a message names the op and
// the shapes, so the same mistake is said once and a different one again. Warnings are off the
// hot path: the message is built and looked up only where an op decided to warn.

// Shows "[op] message" unless that exact line was shown before in this process. Thread-safe.
void warn_once(const std::string& line);

// Where warnings go: the handler gets the line without the "accel: warning: " prefix. An empty
// handler restores stderr. Returns the previous handler (empty for stderr).
using WarningHandler = std::function<void(const std::string& line)>;
WarningHandler set_warning_handler(WarningHandler handler);
// Forgets which lines were shown (tests that expect a warning again).
void reset_warnings_shown();

}  // namespace accel

// ACCEL_WARN_ONCE("mse_loss", "target size ", t.sizes(), " ..."): the message is formatted as
// ACCEL_CHECK's ("[op] parts...").
#define ACCEL_WARN_ONCE(op, ...) \
  ::accel::warn_once(::accel::detail::format_message(op, __VA_ARGS__))
