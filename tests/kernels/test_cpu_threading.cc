// How the CPU kernels use the OpenMP team (kernels/cpu/threading.h): the GEMM grain (Note [GEMM
// grain]) and the wait default for a program not started by accel-run (Note [OpenMP wait
// default]). Run plain and under OMP_WAIT_POLICY / GOMP_SPINCOUNT / ACCEL_CPU_WAIT
// (tests/kernels/meson.build): the user's choice always wins.
#include <doctest/doctest.h>
#include <omp.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "accel.h"
#include "kernels/cpu/threading.h"
#include "tests/common/tensors.h"

using namespace accel;
using cpu::WaitDefault;

namespace {

double process_cpu_ms() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return (double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3) +
         double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-3;
}

struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved); }
};

struct Grain {
  explicit Grain(int64_t g) { cpu::set_gemm_grain(g); }
  ~Grain() { cpu::set_gemm_grain(-1); }
};

}  // namespace

// First in the file (doctest runs a file's cases in order): nothing has opened a team yet.
TEST_CASE("wait default: no thread before the first team") {
  if (cpu::wait_default() != WaitDefault::BoundedSpin) return;
  // A second thread at load would cost single-threaded programs glibc's and libstdc++'s fast
  // paths (Note [OpenMP wait default]): the dormant team waits for before_team().
  CHECK(cpu::detail::g_wait_pending.load());
  int tasks = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) tasks += e->d_name[0] != '.';
    closedir(d);
  }
  CHECK(tasks == 1);
}

TEST_CASE("wait default: the decision") {
  int extra = -1;
  // The user's policy (either variable, any value) wins; so does ACCEL_CPU_WAIT=default.
  CHECK(cpu::decide_wait_default("passive", nullptr, nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(extra == 0);
  CHECK(cpu::decide_wait_default("active", nullptr, nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(cpu::decide_wait_default(nullptr, "10000", nullptr, 2, 2, &extra) ==
        WaitDefault::UserChoice);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, "default", 2, 2, &extra) ==
        WaitDefault::Disabled);
  // Empty values count as unset.
  CHECK(cpu::decide_wait_default("", "", "", 2, 2, &extra) == WaitDefault::BoundedSpin);
  CHECK(extra == 2);
  // One thread or one CPU: no team waits.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 1, 2, &extra) ==
        WaitDefault::SingleThread);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 4, 1, &extra) ==
        WaitDefault::SingleThread);
  // The dormant team makes 1 + (extra - 1) + (threads - 1) exceed the CPUs.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 16, 16, &extra) ==
        WaitDefault::BoundedSpin);
  CHECK(extra == 2);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 7, 8, &extra) ==
        WaitDefault::BoundedSpin);
  CHECK(extra == 3);
  CHECK(1 + (extra - 1) + (7 - 1) > 8);
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 32, 8, &extra) ==
        WaitDefault::BoundedSpin);
  CHECK(extra == 2);
  // A team much smaller than the machine: left alone.
  CHECK(cpu::decide_wait_default(nullptr, nullptr, nullptr, 4, 16, &extra) ==
        WaitDefault::SingleThread);
}

TEST_CASE("wait default: what this process got, and its effect") {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const std::string name = cpu::wait_default_name();
  CAPTURE(name);
  if ((policy != nullptr && *policy) || (spin != nullptr && *spin)) {
    CHECK(cpu::wait_default() == WaitDefault::UserChoice);
    CHECK(name.rfind("user:", 0) == 0);
    CHECK(!cpu::wait_default_active());
    return;
  }
  const char* accel_wait = std::getenv("ACCEL_CPU_WAIT");
  if (accel_wait != nullptr && std::string(accel_wait) == "default") {
    CHECK(cpu::wait_default() == WaitDefault::Disabled);
    CHECK(name == "libgomp_default");
    return;
  }
  if (cpu::wait_default() != WaitDefault::BoundedSpin) {
    MESSAGE("one thread or one CPU here: no dormant team (", name, ")");
    CHECK(name == "single_thread");
    return;
  }
  REQUIRE(cpu::wait_default_active());
  CHECK(name == "bounded_spin");
  // libgomp's default spin keeps a team member busy for several ms after each region (~98 ms of
  // CPU over these 20 regions of 5 ms sleeps on the 2-core EPYC); the bounded spin sleeps at
  // once. A CPU-time bound with a wide margin, not a speed figure: load on the machine only
  // lowers what we measure.
  Threads two(2);
  volatile int sink = 0;
#pragma omp parallel
  { sink = sink + omp_get_thread_num(); }
  const double c0 = process_cpu_ms();
  for (int i = 0; i < 20; ++i) {
#pragma omp parallel
    { sink = sink + omp_get_thread_num(); }
    usleep(5000);
  }
  const double cpu_ms = process_cpu_ms() - c0;
  CAPTURE(cpu_ms);
  CHECK(cpu_ms < 30.0);
}

TEST_CASE("GEMM grain: the decision and the scope") {
  CHECK(cpu::gemm_single_thread(1000, 1 << 20, 2));
  CHECK_FALSE(cpu::gemm_single_thread(int64_t(1) << 20, 1 << 20, 2));  // at the grain: shared
  CHECK_FALSE(cpu::gemm_single_thread(1000, 1 << 20, 1));              // nothing to cap
  CHECK_FALSE(cpu::gemm_single_thread(1000, 0, 2));                    // grain 0: off
  Threads two(2);
  const int64_t before = cpu::OneThreadScope::one_thread_scopes();
  {
    cpu::OneThreadScope s(true);
    CHECK(omp_get_max_threads() == 1);
    CHECK(cpu::OneThreadScope::one_thread_scopes() == before + 1);
  }
  CHECK(omp_get_max_threads() == 2);
  {
    cpu::OneThreadScope s(false);
    CHECK(omp_get_max_threads() == 2);
  }
  CHECK(cpu::OneThreadScope::one_thread_scopes() == before + 1);
}

TEST_CASE("GEMM grain: small products run on one thread, large ones on the team") {
  Threads two(2);
  Grain g(cpu::kGemmGrainDefault);
  Generator gen(5);
  for (const DType dt : {kFloat32, kFloat64, kBFloat16}) {
    CAPTURE(dt);
    // (97, 51) @ (51, 204): an LSTMCell of 51 units, 1.0M multiply-adds < 2^20.
    const Tensor a = randn({97, 51}, TensorOptions(dt), &gen);
    const Tensor b = randn({51, 204}, TensorOptions(dt), &gen);
    const int64_t n0 = cpu::OneThreadScope::one_thread_scopes();
    const Tensor small = matmul(a, b);
    CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
    CHECK(omp_get_max_threads() == 2);  // restored after the call
    // The same product with the grain off runs on the team and gives the same values.
    {
      Grain off(0);
      const Tensor shared = matmul(a, b);
      CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
      CHECK(test::max_abs_diff(small.to(kFloat64), shared.to(kFloat64)) <=
            (dt == kBFloat16 ? 0.07 : 1e-4));
    }
    // A batched product counts its batch: 8 x (128, 128) @ (128, 128) = 16.8M multiply-adds,
    // above the float32 grain and the float64 one (16 x).
    const Tensor big = matmul(randn({8, 128, 128}, TensorOptions(dt), &gen),
                              randn({8, 128, 128}, TensorOptions(dt), &gen));
    CHECK(cpu::OneThreadScope::one_thread_scopes() == n0 + 1);
    (void)big;
  }
  // Under autocast the linear goes through matmul_lowp_stub: capped there too.
  {
    const Tensor x = randn({97, 51}, {}, &gen), w = randn({204, 51}, {}, &gen);
    const int64_t n0 = cpu::OneThreadScope::one_thread_scopes();
    AutocastGuard ac(true, kBFloat16);
    (void)linear(x, w);
    CHECK(cpu::OneThreadScope::one_thread_scopes() >= n0 + 1);
  }
}
