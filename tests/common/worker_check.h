// Checks shared by the multi-process tests: the worker programs (run one per rank by
// tests/common/spawn.h's run_world) count failed checks with WCHECK and print "ok <scenario>" when
// none failed; the doctest side checks each rank with check_ok.
//
// Worker side: `accel::test::g_rank` (set it once the group exists) prefixes each report, and the
// worker exits non-zero when `accel::test::g_failures` > 0. Test side (this header included after
// <doctest/doctest.h>): check_ok(results, scenario).
#pragma once

#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace accel::test {

inline int g_failures = 0;  // failed WCHECKs (and other reported failures) of this worker
inline int g_rank = 0;      // this worker's rank, for the reports

// The message of the exception fn() throws, or "(no error)" (the workers' counterpart of
// check.h's error_of, which needs doctest).
template <typename Fn>
std::string thrown_message(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace accel::test

// Reports a failure (as WCHECK) unless `expr` throws an exception whose message holds `want`.
#define WCHECK_THROWS_WITH(expr, want)                                                    \
  do {                                                                                    \
    const std::string e_ = ::accel::test::thrown_message([&] { (void)(expr); });          \
    WCHECK(e_.find(want) != std::string::npos, "expected '" << (want) << "' in: " << e_); \
  } while (0)

// Reports a failed condition with the rank, the condition, the line and a streamed message
// (`WCHECK(a == b, "a " << a)`), and counts it; the worker goes on.
#define WCHECK(cond, ...)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream os_;                                                             \
      os_ << "rank " << ::accel::test::g_rank << " CHECK FAILED " << #cond << " at line " \
          << __LINE__ << ": " << __VA_ARGS__;                                             \
      std::cout << os_.str() << std::endl;                                                \
      ++::accel::test::g_failures;                                                        \
    }                                                                                     \
  } while (0)

#ifdef DOCTEST_LIBRARY_INCLUDED
#include "tests/common/spawn.h"

namespace accel::test {

// Every rank exited by itself with status 0 and printed "ok <scenario>"; the rank's output is
// shown when not.
inline void check_ok(const std::vector<RankResult>& res, const std::string& scenario) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    CHECK(res[r].exited);
    CHECK(res[r].code == 0);
    CHECK(res[r].output.find("ok " + scenario) != std::string::npos);
  }
}

}  // namespace accel::test
#endif
