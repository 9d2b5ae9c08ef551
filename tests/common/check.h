// Checks shared by the doctest programs (include after <doctest/doctest.h>): values against a
// reference within a tolerance, and the message of the error a call throws.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <initializer_list>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "autograd/ops.h"

namespace accel::test {

// Note [check_close]
// got is close to want when, element by element, |got - want| <= atol + rtol * |want| (what
// torch.allclose and torch.testing compute); an infinity must be met by the same infinity and a
// NaN by a NaN. The sizes must agree (REQUIRE). One check per call: on failure its message names
// `what`, how many elements are off, the first of them (index, got, want) and the largest error.
// doctest's Approx(want).epsilon(e) is rtol = atol = e here, and a bound relative to
// max(1, |want|) is rtol = atol = the bound.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double rtol, double atol, const std::string& what = {}) {
  REQUIRE_MESSAGE(got.size() == want.size(),
                  what << ": " << got.size() << " values, expected " << want.size());
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok;
    if (std::isnan(want[i])) {
      ok = std::isnan(got[i]);
    } else if (std::isinf(want[i])) {
      ok = got[i] == want[i];
    } else {
      const double err = std::abs(got[i] - want[i]);
      ok = err <= atol + rtol * std::abs(want[i]);  // false for a NaN got
      if (!std::isnan(err)) worst = std::max(worst, err);
    }
    if (!ok && bad++ == 0) first = i;
  }
  std::ostringstream msg;
  if (bad != 0)
    msg << what << ": " << bad << " of " << got.size() << " elements off (rtol " << rtol
        << ", atol " << atol << "); first [" << first << "]: " << got[first] << " vs "
        << want[first] << "; max |diff| " << worst;
  CHECK_MESSAGE(bad == 0, msg.str());
}

namespace check_detail {
// A tensor's values as float64, on the CPU, in row-major order.
inline std::vector<double> f64_values(const Tensor& t) {
  return t.to(kCPU).to(kFloat64).contiguous().to_vector<double>();
}
}  // namespace check_detail

inline void check_close(const Tensor& got, const std::vector<double>& want, double rtol,
                        double atol, const std::string& what = {}) {
  REQUIRE_MESSAGE(got.defined(), what << ": undefined tensor");
  check_close(check_detail::f64_values(got), want, rtol, atol, what);
}

// Also the shapes must agree.
inline void check_close(const Tensor& got, const Tensor& want, double rtol, double atol,
                        const std::string& what = {}) {
  REQUIRE_MESSAGE(got.defined(), what << ": undefined tensor");
  REQUIRE_MESSAGE(got.sizes() == want.sizes(),
                  what << ": shape " << got.sizes() << ", expected " << want.sizes());
  check_close(check_detail::f64_values(got), check_detail::f64_values(want), rtol, atol, what);
}

// The message of the E that f() throws, or "" when it throws none (another exception goes
// through to the test case).
template <typename E = Error, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// The message of the E that f() must throw: a failed test case when it throws another exception
// or none. expect_error<std::exception> takes any exception.
template <typename E = Error, typename F>
std::string expect_error(F&& f) {
  if constexpr (std::is_same_v<E, std::exception>) {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
  } else {
    try {
      f();
    } catch (const E& e) {
      return e.what();
    } catch (const std::exception& e) {
      FAIL("expected another error type, got: " << e.what());
      return "";
    }
  }
  FAIL("expected an error, nothing was thrown");
  return "";
}

// a and b are defined, of one shape and allclose(a, b, tol, tol); the largest difference is
// printed when they are not.
inline bool close_to(const Tensor& a, const Tensor& b, double tol) {
  const bool comparable = a.defined() && b.defined() && a.sizes() == b.sizes();
  const bool ok = comparable && allclose(a, b, tol, tol);
  if (!ok && comparable)
    MESSAGE("max |a - b| = ", amax(abs(sub(a.to(kFloat64), b.to(kFloat64)))).item());
  return ok;
}

// f() throws E and its message contains every needle (the op in brackets, shapes): one check per
// needle; a failed check when it throws another exception or none.
template <typename E, typename F>
void check_error(F&& f, std::initializer_list<const char*> needles) {
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    const std::string msg = e.what();
    for (const char* n : needles) {
      CHECK_MESSAGE(msg.find(n) != std::string::npos, "'", n, "' not in: ", msg);
    }
  } catch (const std::exception& e) {
    FAIL_CHECK("wrong exception type: ", e.what());
    return;
  }
  CHECK_MESSAGE(thrown, "nothing thrown; expected ", std::string(*needles.begin()));
}

}  // namespace accel::test
