// Errors thrown by accel. Every message starts with the op in brackets:
//   [matmul] inner dimensions differ: (4, 3) @ (5, 2)
// Use ACCEL_CHECK(cond, ErrorType, "op", args...) so the message is only built on failure.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace accel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error {
 public:
  using Error::Error;
};
class DTypeError : public Error {
 public:
  using Error::Error;
};
class DeviceError : public Error {
 public:
  using Error::Error;
};
class IndexError : public Error {
 public:
  using Error::Error;
};
class ValueError : public Error {
 public:
  using Error::Error;
};
class DistError : public Error {
 public:
  using Error::Error;
};
class IoError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string format_message(const char* op, Args&&... args) {
  std::ostringstream os;
  os << '[' << op << "] ";
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename E, typename... Args>
[[noreturn]] __attribute__((noinline, cold)) void throw_error(const char* op, Args&&... args) {
  throw E(format_message(op, std::forward<Args>(args)...));
}
}  // namespace detail

}  // namespace accel

#define ACCEL_LIKELY(x) __builtin_expect(!!(x), 1)
#define ACCEL_UNLIKELY(x) __builtin_expect(!!(x), 0)

// ACCEL_CHECK(cond, ShapeError, "matmul", "inner dimensions differ: ", a.sizes(), " @ ", b.sizes())
#define ACCEL_CHECK(cond, ErrType, op, ...)                            \
  do {                                                                 \
    if (ACCEL_UNLIKELY(!(cond))) {                                     \
      ::accel::detail::throw_error<::accel::ErrType>(op, __VA_ARGS__); \
    }                                                                  \
  } while (0)

// Unconditional throw with the same message format.
#define ACCEL_THROW(ErrType, op, ...) \
  ::accel::detail::throw_error<::accel::ErrType>(op, __VA_ARGS__)

// Internal invariant: a bug in accel, not in user code.
#define ACCEL_INTERNAL_ASSERT(cond)                                              \
  do {                                                                           \
    if (ACCEL_UNLIKELY(!(cond))) {                                               \
      ::accel::detail::throw_error<::accel::Error>(                              \
          "internal", "assertion failed: " #cond " at " __FILE__ ":", __LINE__); \
    }                                                                            \
  } while (0)
