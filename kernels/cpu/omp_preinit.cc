// Note [OpenMP wait policy, in-process]: libgomp reads OMP_WAIT_POLICY once, in its own ELF
// constructor, and libaccel depends on libgomp, so libgomp's constructor runs before any of
// libaccel's: a constructor in the library, whatever its priority, sets the variable too late.
// An executable's .preinit_array runs before every shared library's constructors, so this file is
// compiled into each program that uses accel_dep (meson.build) and, when the process finds itself
// oversubscribed, sets OMP_WAIT_POLICY=passive before libgomp reads it. A value the user set
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept. accel-run sets the same for its workers
// (launcher/plan.cc, Note [OpenMP wait policy]); this covers other launchers (torchrun-style
// LOCAL_WORLD_SIZE, mpirun) and OMP_NUM_THREADS above the cores. libc only: nothing else is
// initialised yet.
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

namespace {

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;  // "4,2" (nested teams) counts its first level
}

void accel_omp_wait_policy_preinit(int, char**, char**) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  const int cpus = available_cpus();
  const int workers = env_int("LOCAL_WORLD_SIZE") > 1 ? env_int("LOCAL_WORLD_SIZE") : 1;
  int threads = env_int("OMP_NUM_THREADS");
  if (threads <= 0) threads = cpus;  // libgomp's default team: one thread per available CPU
  const long total = long(workers) * threads;
  // Several local workers whose teams fill the cores (the launcher's rule), or more threads than
  // cores in any case.
  if ((workers > 1 && total >= cpus) || total > cpus) setenv("OMP_WAIT_POLICY", "passive", 0);
}

__attribute__((section(".preinit_array"), used)) void (*const accel_omp_preinit_entry)(int, char**, char**) =
    &accel_omp_wait_policy_preinit;

}  // namespace
