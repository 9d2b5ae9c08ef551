// The GEMM grain and the OpenMP wait default (Notes [GEMM grain] and [OpenMP wait default] in
// threading.h).
#include "kernels/cpu/threading.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

bool team_adaptive_from_env() {
  const char* v = std::getenv(env::kCpuTeam);
  return v != nullptr && std::strcmp(v, "adaptive") == 0;
}

// One thread's measure of its waiting (Note [team under load]).
struct TeamState {
  TeamAdapter a;
  int depth = 0;  // TeamScopes open on this thread
  int fd = -1;    // /proc/thread-self/schedstat of this thread
  pid_t pid = 0;  // the process that opened fd (a fork child opens its own)
  int cpus = 1;
  int64_t next_ns = 0, ran0 = 0, waited0 = 0, wall0 = 0, cpu0 = 0;
  int64_t windows = 0;
  TeamState() = default;
  TeamState(const TeamState&) = delete;
  TeamState& operator=(const TeamState&) = delete;
  ~TeamState() {
    if (fd >= 0) close(fd);
  }
};
thread_local TeamState t_team;

int64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// This thread's time on a CPU and waiting for one, in ns, since it started.
bool read_schedstat(TeamState& s, int64_t* ran, int64_t* waited) {
  const pid_t pid = getpid();
  if (s.fd >= 0 && s.pid != pid) {  // a fork child: the descriptor names the parent's thread
    close(s.fd);
    s.fd = -1;
  }
  if (s.fd < 0) {
    s.fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    s.pid = pid;
    if (s.fd < 0) return false;
  }
  char buf[128];
  const ssize_t n = pread(s.fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  unsigned long long r = 0, w = 0;
  if (std::sscanf(buf, "%llu %llu", &r, &w) != 2) return false;
  *ran = int64_t(r);
  *waited = int64_t(w);
  return true;
}

void team_window(TeamState& s, int threads, int64_t now) {
  s.next_ns = now + TeamAdapter::kWindowNs;
  int64_t ran = 0, waited = 0;
  if (!read_schedstat(s, &ran, &waited)) {
    s.a.reset(threads);  // no measure here (no schedstat): the program's team, always
    s.next_ns = INT64_MAX;
    return;
  }
  const int64_t cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  const int64_t d_wall = now - s.wall0, d_ran = ran - s.ran0, d_waited = waited - s.waited0;
  const int64_t d_cpu = cpu - s.cpu0;
  s.wall0 = now, s.ran0 = ran, s.waited0 = waited, s.cpu0 = cpu;
  if (s.a.full != threads) {  // the first window, or the program changed its team
    s.a.reset(threads);
    s.cpus = usable_cpus();
    return;
  }
  ++s.windows;
  // A thread mostly asleep (I/O, a collective, the program idle) says nothing of the CPUs.
  if (d_ran + d_waited < d_wall / 4 || d_ran + d_waited <= 0) return;
  s.a.decide(double(d_waited) / double(d_ran + d_waited), double(d_cpu) / double(d_wall), s.cpus,
             now);
}

}  // namespace

int TeamAdapter::decide(double waited, double rate, int cpus, int64_t now_ns) {
  if (full <= 1) return team = std::max(full, 1);
  const double w = work(team, rate);
  if (probing) {
    probing = false;
    if (w > kept_work) {  // the team tried did more: it stays
      if (team < kept) ++shrinks;
      kept = team;
      kept_work = w;
      backoff_ns = kProbeBaseNs;
    } else {
      team = kept;
      backoff_ns = std::min(backoff_ns * 2, kProbeMaxNs);
    }
    probe_at_ns = now_ns + backoff_ns;
    return team;
  }
  kept_work = kept_work > 0 ? 0.5 * (kept_work + w) : w;
  if (team == full && waited <= kBusyWait) {  // a quiet machine: nothing to try
    backoff_ns = kProbeBaseNs;
    probe_at_ns = now_ns;  // try at once when it gets busy
    return team;
  }
  if (now_ns < probe_at_ns) return team;
  int other = full;
  if (team == full) {
    // N team threads and K others on C CPUs: waited = 1 - C / (N + K).
    const double others = double(cpus) / (1.0 - std::min(waited, 0.9)) - double(team);
    other = std::clamp(int(std::lround(double(cpus) - others)), 1, full - 1);
  }
  probing = true;
  ++probes;
  team = other;
  return team;
}

namespace detail {

std::atomic<bool> g_team_adaptive{team_adaptive_from_env()};

std::atomic<int> g_team_overrides{0};
thread_local int t_override = 0;
thread_local int64_t t_override_ops = 0;

TeamOverride::TeamOverride(int n) : saved_(t_override) {
  t_override = std::max(n, 1);
  ++g_team_overrides;
}
TeamOverride::~TeamOverride() {
  t_override = saved_;
  --g_team_overrides;
}
int64_t TeamOverride::ops() { return t_override_ops; }

int enter_team() {
  TeamState& s = t_team;
  if (s.depth++ > 0 || omp_in_parallel()) return 0;
  const int threads = omp_get_max_threads();
  if (threads <= 1) return 0;  // one thread (or a OneThreadScope): nothing to size
  if (t_override > 0) {
    if (t_override >= threads) return 0;
    ++t_override_ops;
    omp_set_num_threads(t_override);
    return threads;
  }
  if (!g_team_adaptive.load(std::memory_order_relaxed)) return 0;
  const int64_t now = clock_ns(CLOCK_MONOTONIC_COARSE);
  if (now >= s.next_ns) team_window(s, threads, now);
  if (s.a.full != threads || s.a.team >= threads) return 0;
  omp_set_num_threads(s.a.team);
  return threads;
}

void leave_team(int restore) {
  --t_team.depth;
  if (restore > 0) omp_set_num_threads(restore);
}

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

TeamStats team_stats() {
  const TeamState& s = t_team;
  TeamStats r;
  r.adaptive = team_adaptive();
  r.full = s.a.full;
  r.team = s.a.team;
  r.windows = s.windows;
  r.shrinks = s.a.shrinks;
  r.probes = s.a.probes;
  return r;
}

void set_team_adaptive(bool on) { detail::g_team_adaptive.store(on); }

bool team_adaptive() { return detail::g_team_adaptive.load(std::memory_order_relaxed); }

const char* team_mode_name() { return team_adaptive() ? "adaptive" : "fixed"; }

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
