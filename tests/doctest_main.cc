#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/util.h"

namespace {

// Removes the scratch folders of accel::test::fresh_dir when the whole run passed (a failed run
// keeps them to be looked at; so does ACCEL_TEST_KEEP_DIRS=1), so repeated runs do not fill /tmp.
struct ScratchCleanup : doctest::IReporter {
  explicit ScratchCleanup(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    const char* keep = std::getenv("ACCEL_TEST_KEEP_DIRS");
    if (s.numTestCasesFailed != 0 || s.numAssertsFailed != 0 ||
        (keep != nullptr && std::strcmp(keep, "1") == 0))
      return;
    for (const std::string& d : accel::test::fresh_dirs()) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("accel_scratch_cleanup", 1, ScratchCleanup);
