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
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
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
std::atomic<bool> g_wait_active{false};  // a dormant team has formed and holds
int g_wait_extra = 0;                    // the dormant team's size
const char* g_user_policy = nullptr;     // the variable the user set (for the name)
const char* g_user_value = nullptr;

// The dormant team's holders (Note [OpenMP wait default]): each a detached thread with a
// generation, which returns (ending its team) once g_released_gen reaches it. All under
// hold_sync().m, as is the adaptive wait's state. Never destroyed: at exit a holder still waits on
// the condition variable, and glibc's pthread_cond_destroy would wait for it forever.
struct HoldSync {
  std::mutex m;
  std::condition_variable cv;
};
HoldSync& hold_sync() {
  static HoldSync* const h = new HoldSync;
  return *h;
}
uint64_t g_hold_gen = 0;      // the newest holder started
uint64_t g_released_gen = 0;  // holders up to this generation return
bool g_hold_up = false;       // a holder started and not released
pid_t g_hold_pid = 0;         // the process that started them (a fork child has none)
WaitAdapter g_wait_adapter;
int64_t g_wait_windows = 0;

void* hold_team(void* arg) {
  const auto gen = uint64_t(reinterpret_cast<uintptr_t>(arg));
  const int team = g_wait_extra;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // process signals go to the program's threads
  std::atomic<int> formed{0};
#pragma omp parallel num_threads(team)
  {
    // A body the compiler cannot drop (an empty region is elided, and no team forms).
    if (omp_get_thread_num() == 0) formed.store(omp_get_num_threads());
  }
  std::unique_lock<std::mutex> l(hold_sync().m);
  if (g_released_gen < gen) g_wait_active.store(formed.load() == team);
  hold_sync().cv.wait(l, [gen] { return g_released_gen >= gen; });
  // Returning ends the thread: libgomp's thread destructor ends its team, whose idle member
  // stops counting as a managed thread.
  return nullptr;
}

// A new holder (hold_sync().m held). False when no thread could be made.
bool start_holder_locked() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // The default stack size: glibc takes the static TLS of every loaded library (CUDA's runtime
  // and cuDNN hold a lot) out of the thread's stack, so a small fixed one fails to create the
  // thread in a CUDA build. The stack is only reserved; this thread touches a few pages.
  pthread_t t;
  const uint64_t gen = g_hold_gen + 1;
  const bool ok =
      pthread_create(&t, &attr, hold_team, reinterpret_cast<void*>(uintptr_t(gen))) == 0;
  pthread_attr_destroy(&attr);
  if (!ok) return false;
  g_hold_gen = gen;
  g_hold_up = true;
  g_hold_pid = getpid();
  return true;
}

void release_holder_locked() {
  g_released_gen = g_hold_gen;
  g_hold_up = false;
  g_wait_active.store(false);
  hold_sync().cv.notify_all();
}

// Applies the adaptive wait's state (hold_sync().m held). A fork child has no holder thread (only
// the parent's managed count, copied): it stays as it is.
void apply_wait_locked(bool spin) {
  if (g_hold_pid != 0 && g_hold_pid != getpid()) return;
  if (spin && g_hold_up) {
    release_holder_locked();
  } else if (!spin && !g_hold_up && !start_holder_locked()) {
    // No thread: libgomp's default stays, and nothing is measured.
    g_wait.store(int(WaitDefault::Disabled));
    detail::g_wait_adaptive.store(false);
  }
}

// One window of the thread that opens teams (Note [OpenMP wait default]).
void wait_window(double waited, int64_t now) {
  const std::lock_guard<std::mutex> l(hold_sync().m);
  if (g_hold_pid != 0 && g_hold_pid != getpid()) return;
  ++g_wait_windows;
  apply_wait_locked(g_wait_adapter.decide(waited, now));
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
  // A fork made while another thread holds hold_sync().m (a holder forming its team) must not leave
  // the child a lock nobody releases.
  pthread_atfork([] { hold_sync().m.lock(); }, [] { hold_sync().m.unlock(); },
                 [] { hold_sync().m.unlock(); });
  // Started by before_team(), before the first team (threading.h).
  detail::g_wait_pending.store(d == WaitDefault::BoundedSpin || d == WaitDefault::Adaptive);
  detail::g_wait_adaptive.store(d == WaitDefault::Adaptive);
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

void team_window(TeamState& s, int threads, int64_t now, bool team, bool wait) {
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
  const double w = double(d_waited) / double(d_ran + d_waited);
  if (wait) wait_window(w, now);
  if (team) s.a.decide(w, double(d_cpu) / double(d_wall), s.cpus, now);
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
  const bool team = g_team_adaptive.load(std::memory_order_relaxed);
  const bool wait = g_wait_adaptive.load(std::memory_order_relaxed);
  if (!team && !wait) return 0;
  const int64_t now = clock_ns(CLOCK_MONOTONIC_COARSE);
  if (now >= s.next_ns) team_window(s, threads, now, team, wait);
  if (!team || s.a.full != threads || s.a.team >= threads) return 0;
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
  const std::lock_guard<std::mutex> l(hold_sync().m);
  apply_wait_locked(false);  // bounded until measured (no thread: libgomp's default stays)
}

std::atomic<bool> g_wait_adaptive{false};

void set_wait_measuring(bool on) {
  g_wait_adaptive.store(on && wait_default() == WaitDefault::Adaptive);
}

void apply_wait_state(bool spin) {
  if (wait_default() != WaitDefault::Adaptive) return;
  before_team();
  const std::lock_guard<std::mutex> l(hold_sync().m);
  g_wait_adapter.spin = spin;
  apply_wait_locked(spin);
}

}  // namespace detail

int64_t gemm_grain() { return g_gemm_grain.load(std::memory_order_relaxed); }

void set_gemm_grain(int64_t macs) { g_gemm_grain.store(macs < 0 ? grain_from_env() : macs); }

WaitDefault decide_wait_default(const char* omp_wait_policy, const char* gomp_spincount,
                                const char* accel_cpu_wait, int max_threads, int cpus, int* extra) {
  *extra = 0;
  const auto set = [](const char* v) { return v != nullptr && *v != '\0'; };
  if (set(omp_wait_policy) || set(gomp_spincount)) return WaitDefault::UserChoice;
  const bool always_bounded = set(accel_cpu_wait) && std::strcmp(accel_cpu_wait, "bounded") == 0;
  if (set(accel_cpu_wait) && std::strcmp(accel_cpu_wait, "default") == 0)
    return WaitDefault::Disabled;
  // No team, or a team much smaller than the machine (the user chose few threads: a dormant
  // team big enough to exceed the CPUs would cost more threads than it saves).
  if (max_threads <= 1 || cpus <= 1 || max_threads + 2 < cpus) return WaitDefault::SingleThread;
  // libgomp counts 1 (the first thread) + (team - 1) per pool: throttled when the sum exceeds
  // the CPUs, i.e. 1 + (extra - 1) + (max_threads - 1) > cpus.
  *extra = std::max(2, cpus - max_threads + 2);
  return always_bounded ? WaitDefault::BoundedSpin : WaitDefault::Adaptive;
}

bool WaitAdapter::decide(double waited, int64_t now_ns) {
  if (spin) {
    if (waited <= kBusyWait) {
      if (++spin_windows >= kSettledWindows) backoff_ns = kRetryBaseNs;  // the spin held
      return true;
    }
    // Contended while spinning: bounded, and spinning is tried again after the backoff, which
    // doubles while each try is refuted before it settles.
    spin = false;
    ++switches;
    retry_at_ns = now_ns + backoff_ns;
    if (spin_windows < kSettledWindows) backoff_ns = std::min(backoff_ns * 2, kRetryMaxNs);
    return false;
  }
  if (waited <= kQuietWait && now_ns >= retry_at_ns) {
    spin = true;
    spin_windows = 0;
    ++switches;
  }
  return spin;
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
  const auto held = [] {
    const WaitDefault d = wait_default();
    if (d == WaitDefault::BoundedSpin) return true;
    if (d != WaitDefault::Adaptive) return false;
    const std::lock_guard<std::mutex> l(hold_sync().m);
    return g_hold_up;
  };
  if (!held()) return false;
  before_team();
  // The team forms a moment after it starts; wait for it up to 2 s (a test or a bench asks
  // early).
  for (int i = 0; i < 2000 && !g_wait_active.load() && held(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return g_wait_active.load();
}

WaitStats wait_stats() {
  WaitStats r;
  if (wait_default() != WaitDefault::Adaptive) return r;
  const std::lock_guard<std::mutex> l(hold_sync().m);
  r.now = g_hold_up ? "bounded" : "spin";
  r.switches = g_wait_adapter.switches;
  r.windows = g_wait_windows;
  return r;
}

std::string wait_default_name() {
  switch (wait_default()) {
    case WaitDefault::UserChoice: return std::string("user:") + g_user_policy + "=" + g_user_value;
    case WaitDefault::BoundedSpin: return "bounded_spin";
    case WaitDefault::Adaptive: return "adaptive";
    case WaitDefault::SingleThread: return "single_thread";
    case WaitDefault::Disabled: return "libgomp_default";
  }
  return "unknown";
}

}  // namespace accel::cpu
