// The in-process OpenMP wait policy (kernels/cpu/omp_preinit.cc, Note [OpenMP wait policy,
// in-process]): an oversubscribed program gets OMP_WAIT_POLICY=passive before libgomp reads it.
// Each case runs this executable again (no test case selected) with OMP_DISPLAY_ENV=verbose, so
// libgomp itself prints the policy it initialised with.
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <thread>

namespace {

std::string self_path() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  REQUIRE(n > 0);
  return std::string(buf.data(), size_t(n));
}

// libgomp's start-up report of a child run with `env_assignments` (and OMP_WAIT_POLICY,
// GOMP_SPINCOUNT and LOCAL_WORLD_SIZE removed unless assigned there).
std::string gomp_report(const std::string& env_assignments) {
  const std::string cmd = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u LOCAL_WORLD_SIZE OMP_DISPLAY_ENV=verbose " +
                          env_assignments + " '" + self_path() + "' --dt-test-case=no-such-case 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  CHECK(pclose(f) == 0);
  return out;
}

// GOMP_SPINCOUNT in the report: 0 under the passive policy, 300000 (or 30000 when oversubscribed
// by libgomp's own count) by default.
long spin_count(const std::string& report) {
  const std::string key = "GOMP_SPINCOUNT = '";
  const size_t i = report.find(key);
  REQUIRE_MESSAGE(i != std::string::npos, report);
  return std::stol(report.substr(i + key.size()));
}

}  // namespace

TEST_CASE("oversubscribed start-up: libgomp initialises with the passive wait policy") {
  const int cpus = int(std::thread::hardware_concurrency());
  const std::string too_many = std::to_string(4 * cpus + 1);
  // More OpenMP threads than cores.
  std::string r = gomp_report("OMP_NUM_THREADS=" + too_many);
  CHECK(r.find("OMP_WAIT_POLICY = 'PASSIVE'") != std::string::npos);
  CHECK(spin_count(r) == 0);
  // Several local ranks whose default teams (one thread per core each) fill the cores.
  r = gomp_report("LOCAL_WORLD_SIZE=2");
  CHECK(spin_count(r) == 0);
  // The user's choice is kept.
  r = gomp_report("OMP_NUM_THREADS=" + too_many + " OMP_WAIT_POLICY=active");
  CHECK(r.find("OMP_WAIT_POLICY = 'ACTIVE'") != std::string::npos);
  CHECK(spin_count(r) > 0);
  // Not oversubscribed: libgomp's default (spin, then sleep) stays.
  r = gomp_report("OMP_NUM_THREADS=1");
  CHECK(spin_count(r) > 0);
}
