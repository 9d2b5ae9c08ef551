// The GEMM grain and the OpenMP wait default (Notes [GEMM grain] and [OpenMP wait default] in
// threading.h).
#include "kernels/cpu/threading.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/env_contract.h"

namespace accel::cpu {
namespace {

int64_t grain_from_env() {
  const char* v = std::getenv(env::kCpuGemmGrain);
  if (v == nullptr || *v == '\0') return kGemmGrainDefault;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  // A malformed value keeps the default (a tuning knob, read in a static initialiser: no throw).
  return (end != v && *end == '\0' && n >= 0) ? int64_t(n) : kGemmGrainDefault;
}

std::atomic<int64_t> g_gemm_grain{grain_from_env()};

std::atomic<int> g_wait{int(WaitDefault::SingleThread)};
std::atomic<bool> g_wait_active{false};
int g_wait_extra = 0;                 // the dormant team's size
const char* g_user_policy = nullptr;  // the variable the user set (for the name)
const char* g_user_value = nullptr;

// The dormant team (Note [OpenMP wait default]): forms a team of `team` threads once, then
// sleeps forever. Its idle members stay in libgomp's pool, counted as managed threads.
void* hold_team(void* arg) {
  const int team = int(reinterpret_cast<intptr_t>(arg));
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // process signals go to the program's threads
  std::atomic<int> formed{0};
#pragma omp parallel num_threads(team)
  {
    // A body the compiler cannot drop (an empty region is elided, and no team forms).
    if (omp_get_thread_num() == 0) formed.store(omp_get_num_threads());
  }
  g_wait_active.store(formed.load() == team);
  for (;;) pause();  // all signals blocked: never returns
  return nullptr;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

__attribute__((constructor)) void start_wait_default() {
  int extra = 0;
  const char* policy = std::getenv(env::kOmpWaitPolicy);
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const WaitDefault d = decide_wait_default(policy, spin, std::getenv(env::kCpuWait),
                                            omp_get_max_threads(), usable_cpus(), &extra);
  g_wait.store(int(d));
  if (d == WaitDefault::UserChoice) {
    const bool p = policy != nullptr && *policy != '\0';
    g_user_policy = p ? env::kOmpWaitPolicy : "GOMP_SPINCOUNT";
    g_user_value = p ? policy : spin;
  }
  g_wait_extra = extra;
  // Started by before_team(), before the first team (threading.h).
  detail::g_wait_pending.store(d == WaitDefault::BoundedSpin);
}

}  // namespace

namespace detail {

std::atomic<bool> g_wait_pending{false};

void start_wait_team() {
  if (!g_wait_pending.exchange(false)) return;  // another thread started it
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // The default stack size: glibc takes the static TLS of every loaded library (CUDA's runtime
  // and cuDNN hold a lot) out of the thread's stack, so a small fixed one fails to create the
  // thread in a CUDA build. The stack is only reserved; this thread touches a few pages.
  pthread_t t;
  if (pthread_create(&t, &attr, hold_team, reinterpret_cast<void*>(intptr_t(g_wait_extra))) != 0)
    g_wait.store(int(WaitDefault::Disabled));  // no thread: libgomp's default stays
  pthread_attr_destroy(&attr);
}

}  // namespace detail

int64_t gemm_grain() { return g_gemm_grain.load(std::memory_order_relaxed); }

void set_gemm_grain(int64_t macs) { g_gemm_grain.store(macs < 0 ? grain_from_env() : macs); }

WaitDefault decide_wait_default(const char* omp_wait_policy, const char* gomp_spincount,
                                const char* accel_cpu_wait, int max_threads, int cpus, int* extra) {
  *extra = 0;
  const auto set = [](const char* v) { return v != nullptr && *v != '\0'; };
  if (set(omp_wait_policy) || set(gomp_spincount)) return WaitDefault::UserChoice;
  if (set(accel_cpu_wait) && std::strcmp(accel_cpu_wait, "default") == 0)
    return WaitDefault::Disabled;
  // No team, or a team much smaller than the machine (the user chose few threads: a dormant
  // team big enough to exceed the CPUs would cost more threads than it saves).
  if (max_threads <= 1 || cpus <= 1 || max_threads + 2 < cpus) return WaitDefault::SingleThread;
  // libgomp counts 1 (the first thread) + (team - 1) per pool: throttled when the sum exceeds
  // the CPUs, i.e. 1 + (extra - 1) + (max_threads - 1) > cpus.
  *extra = std::max(2, cpus - max_threads + 2);
  return WaitDefault::BoundedSpin;
}

WaitDefault wait_default() { return WaitDefault(g_wait.load()); }

bool wait_default_active() {
  if (wait_default() != WaitDefault::BoundedSpin) return false;
  before_team();
  // The team forms a moment after load; wait for it up to 2 s (a test or a bench asks early).
  for (int i = 0; i < 2000 && !g_wait_active.load() && wait_default() == WaitDefault::BoundedSpin;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return g_wait_active.load();
}

std::string wait_default_name() {
  switch (wait_default()) {
    case WaitDefault::UserChoice: return std::string("user:") + g_user_policy + "=" + g_user_value;
    case WaitDefault::BoundedSpin: return "bounded_spin";
    case WaitDefault::SingleThread: return "single_thread";
    case WaitDefault::Disabled: return "libgomp_default";
  }
  return "unknown";
}

}  // namespace accel::cpu
