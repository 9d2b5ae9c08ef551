#include "comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include "core/env_contract.h"
#include "core/error.h"
#include "comm/env.h"
#include "comm/net.h"
#include "comm/reduce_kernels.h"

namespace accel::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
  }
  return "?";
}

// ---------------- Work ----------------

void Work::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

Work::TimePoint Work::finished_at() const {
  std::lock_guard<std::mutex> g(mu_);
  return finished_at_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> g(mu_);
    error_ = std::move(error);
    finished_at_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  cv_.notify_all();
}

void ProcessGroup::set_timeout(Milliseconds t) {
  ACCEL_CHECK(t.count() > 0, DistError, "set_timeout", "timeout must be positive, got ", t.count(),
              " ms");
  timeout_ = t;
}

// ---------------- reduce kernels ----------------

namespace {

template <typename T>
struct Ops {
  static void sum(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<T*>(c);  // may alias a: no __restrict__
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = T(pa[i] + pb[i]);
  }
  static void max(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<T*>(c);
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = pa[i] < pb[i] ? pb[i] : pa[i];
  }
  static void min(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<T*>(c);
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = pb[i] < pa[i] ? pb[i] : pa[i];
  }
};

// 16-bit floats: convert, reduce in float, round.
template <typename H>
struct HalfOps {
  template <typename F>
  static void apply(void* c, const void* a, const void* b, size_t n, F f) {
    auto* pc = static_cast<uint16_t*>(c);
    auto* pa = static_cast<const uint16_t*>(a);
    auto* pb = static_cast<const uint16_t*>(b);
    for (size_t i = 0; i < n; ++i) {
      float x = float(H::from_bits(pa[i])), y = float(H::from_bits(pb[i]));
      pc[i] = H(f(x, y)).bits;
    }
  }
  static void sum(void* c, const void* a, const void* b, size_t n) {
    apply(c, a, b, n, [](float x, float y) { return x + y; });
  }
  static void max(void* c, const void* a, const void* b, size_t n) {
    apply(c, a, b, n, [](float x, float y) { return x < y ? y : x; });
  }
  static void min(void* c, const void* a, const void* b, size_t n) {
    apply(c, a, b, n, [](float x, float y) { return y < x ? y : x; });
  }
};

struct BoolOps {
  static void lor(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<uint8_t*>(c);
    auto* pa = static_cast<const uint8_t*>(a);
    auto* pb = static_cast<const uint8_t*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = uint8_t((pa[i] | pb[i]) != 0);
  }
  static void land(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<uint8_t*>(c);
    auto* pa = static_cast<const uint8_t*>(a);
    auto* pb = static_cast<const uint8_t*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = uint8_t(pa[i] != 0 && pb[i] != 0);
  }
};

template <typename O>
ReduceFn pick(ReduceOp r) {
  switch (r) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return &O::sum;
    case ReduceOp::Max: return &O::max;
    case ReduceOp::Min: return &O::min;
  }
  return &O::sum;
}

}  // namespace

void check_reducible(const char* op, DType dtype, ReduceOp reduce) {
  ACCEL_CHECK(reduce != ReduceOp::Avg || is_floating(dtype), DTypeError, op,
              "avg needs a floating dtype, got ", dtype, " (use sum and divide)");
}

ReduceFn reduce_function(DType dtype, ReduceOp reduce) {
  switch (dtype) {
    case DType::Float32: return pick<Ops<float>>(reduce);
    case DType::Float64: return pick<Ops<double>>(reduce);
    case DType::Int32: return pick<Ops<int32_t>>(reduce);
    case DType::Int64: return pick<Ops<int64_t>>(reduce);
    case DType::UInt8: return pick<Ops<uint8_t>>(reduce);
    case DType::Float16: return pick<HalfOps<Half>>(reduce);
    case DType::BFloat16: return pick<HalfOps<BFloat16>>(reduce);
    case DType::Bool: return reduce == ReduceOp::Min ? &BoolOps::land : &BoolOps::lor;
  }
  ACCEL_THROW(DTypeError, "all_reduce", "unsupported dtype ", dtype);
}

void divide_inplace(void* p, DType dtype, size_t n, int divisor) {
  switch (dtype) {
    case DType::Float32: {
      auto* x = static_cast<float*>(p);
      const float inv = 1.0f / float(divisor);
      for (size_t i = 0; i < n; ++i) x[i] *= inv;
      return;
    }
    case DType::Float64: {
      auto* x = static_cast<double*>(p);
      for (size_t i = 0; i < n; ++i) x[i] /= double(divisor);
      return;
    }
    case DType::Float16: {
      auto* x = static_cast<uint16_t*>(p);
      for (size_t i = 0; i < n; ++i)
        x[i] = Half(float(Half::from_bits(x[i])) / float(divisor)).bits;
      return;
    }
    case DType::BFloat16: {
      auto* x = static_cast<uint16_t*>(p);
      for (size_t i = 0; i < n; ++i)
        x[i] = BFloat16(float(BFloat16::from_bits(x[i])) / float(divisor)).bits;
      return;
    }
    default: ACCEL_THROW(DTypeError, "all_reduce", "avg needs a floating dtype, got ", dtype);
  }
}

// ---------------- MemoryStore ----------------

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> g(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> g(mu_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      char* end = nullptr;
      v = std::strtoll(it->second.c_str(), &end, 10);
      ACCEL_CHECK(!it->second.empty() && end && *end == '\0', DistError, "store.add",
                  "value of key '", key, "' is not an integer");
    }
    v += delta;
    data_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

void MemoryStore::interrupt(const std::string& why) {
  Store::interrupt(why);
  std::lock_guard<std::mutex> g(mu_);  // a waiter between its check and its sleep sees it
  cv_.notify_all();
}

void MemoryStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  auto present = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](auto& k) { return data_.count(k) > 0; });
  };
  std::string why;
  auto done = [&] {
    why = interrupted();
    return !why.empty() || present();
  };
  const bool woke = cv_.wait_for(lk, timeout, done);
  ACCEL_CHECK(why.empty(), DistError, "store.wait", why);
  if (!woke) {
    std::string missing;
    for (auto& k : keys)
      if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    ACCEL_THROW(DistError, "store.wait", "timed out after ", timeout.count(),
                " ms waiting for keys ", missing);
  }
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  return std::all_of(keys.begin(), keys.end(), [&](auto& k) { return data_.count(k) > 0; });
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  return data_.erase(key) > 0;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (expected.empty()) data_[key] = desired;
    } else if (it->second == expected) {
      it->second = desired;
    }
    auto now = data_.find(key);
    result = now == data_.end() ? std::string() : now->second;
  }
  cv_.notify_all();
  return result;
}

int64_t MemoryStore::num_keys() {
  std::lock_guard<std::mutex> g(mu_);
  return int64_t(data_.size());
}

// ---------------- backend registry and the default group ----------------

namespace detail {
std::map<std::string, BackendFactory>& backend_registry() {
  static std::map<std::string, BackendFactory> r;
  return r;
}
bool register_backend(const std::string& name, BackendFactory f) {
  backend_registry()[name] = std::move(f);
  return true;
}
}  // namespace detail

namespace {
std::mutex g_default_mu;
ProcessGroupPtr g_default_group;
std::shared_ptr<Store> g_default_store;
// The store of this process's latest init_process_group: MASTER_ADDR:MASTER_PORT and its
// generation (Note [store generations]).
std::string g_last_endpoint;
std::string g_last_generation;

// Seconds as a decimal ("15", "2.5"), 0 = off; `name` is used in the error message.
Milliseconds parse_env_seconds(const char* name, const std::string& value) {
  constexpr double kMaxSeconds = 86400.0 * 365;
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  ACCEL_CHECK(!value.empty() && end && *end == '\0' && v >= 0 && v <= kMaxSeconds, DistError,
              "dist.env", name, "='", value, "' is not a number of seconds in [0, ", kMaxSeconds,
              "] (0 disables)");
  return Milliseconds(int64_t(v * 1000.0 + 0.5));
}
}  // namespace

// Note [oversubscribed OpenMP]: several processes of one job on a host, each with OpenMP's
// default team (one thread per CPU it may run on), put local_world_size x CPUs threads on CPUs
// threads' worth of cores. libgomp's threads spin before they sleep, so every parallel region then
// waits for descheduled team members: 5-20x slower steps (docs/performance.md). accel-run avoids
// it by exporting OMP_NUM_THREADS (and OMP_WAIT_POLICY); a job started any other way (torchrun-
// style env, srun, mpirun) gets the same split here, unless the user chose OMP_NUM_THREADS.
// OMP_WAIT_POLICY itself cannot be changed from the library (libgomp reads it before any of our
// code runs); with the teams fitting the CPUs the spinning no longer steals a core a peer needs.
int fit_omp_threads_to_host(int local_world_size) {
  if (local_world_size <= 1) return 0;
  if (const char* n = std::getenv(env::kOmpNumThreads); n && *n) return 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0
                       ? CPU_COUNT(&set)
                       : int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const int per_process = std::max(1, cpus / local_world_size);
  if (omp_get_max_threads() <= per_process) return 0;
  omp_set_num_threads(per_process);
  return per_process;
}

ProcessGroupPtr init_process_group(const InitOptions& options) {
  std::lock_guard<std::mutex> g(g_default_mu);
  ACCEL_CHECK(!g_default_group, DistError, "init_process_group",
              "already initialized; call destroy_process_group() first");
  DistEnv env = read_dist_env();
  if (const int threads = fit_omp_threads_to_host(env.local_world_size);
      threads > 0 && env.local_rank == 0) {
    std::cerr << "[accel] " << env.local_world_size
              << " processes share this host's CPUs: OpenMP threads per process set to " << threads
              << " (export " << env::kOmpNumThreads << " to choose)" << std::endl;
  }
  ProcessGroupOptions pgo;
  pgo.timeout = options.timeout;
  pgo.fingerprint_every = options.fingerprint_every;
  pgo.name = "default";
  pgo.label = "world";
  if (const char* shm = std::getenv(env::kDistShm); shm && *shm) {
    pgo.shm = parse_env_int(env::kDistShm, shm, 0, 1) == 1;
  }
  // Subgroups whose ranks share a host may use it even when the world spans hosts.
  pgo.shm_subgroups = pgo.shm;
  // Shared memory only reaches the ranks of this host: with several machines the all-reduce
  // runs over the network (ranks on two hosts may still see one /dev/shm, e.g. containers or
  // network namespaces on one kernel, and would silently reduce only with their neighbours).
  if (env.local_world_size != env.world_size) pgo.shm = false;
  pgo.heartbeat_timeout = options.heartbeat_timeout;
  if (const char* hb = std::getenv(env::kHeartbeatTimeout); hb && *hb) {
    pgo.heartbeat_timeout = parse_env_seconds(env::kHeartbeatTimeout, hb);
  }
  if (const char* seg = std::getenv(env::kGlooSegmentBytes); seg && *seg) {
    pgo.gloo_segment_bytes = size_t(parse_env_int(env::kGlooSegmentBytes, seg, 0, 1 << 30));
  }
  if (env.world_size > 1) pgo.hostname = select_bind_address(env.master_addr, env.master_port);
  // One timeout bounds all of it: reaching the store, every rank's arrival, the connections
  // (Note [init guard]); whatever the store connect left goes to the group.
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  std::shared_ptr<Store> store;
  std::shared_ptr<TcpStore> tcp;
  if (env.world_size > 1) {
    StoreOptions so;
    so.timeout = options.timeout;
    so.token = env.token;
    so.member = env.rank;
    // Note [store generations]: not the store of this process's previous group.
    const std::string endpoint = env.master_addr + ":" + std::to_string(env.master_port);
    if (g_last_endpoint == endpoint) so.avoid_generation = g_last_generation;
    tcp = std::make_shared<TcpStore>(env.master_addr, env.master_port, env.rank == 0, so);
    g_last_endpoint = endpoint;
    g_last_generation = tcp->generation();
    store = tcp;
    pgo.init_timeout = options.timeout;
    pgo.init_deadline = deadline;
    // Every other rank is watched while the group forms: one that leaves or dies ends every
    // rank's wait at once, naming it (Note [store membership]).
    std::vector<int> others;
    for (int r = 0; r < env.world_size; ++r)
      if (r != env.rank) others.push_back(r);
    tcp->watch_members(std::move(others));
  } else {
    store = std::make_shared<MemoryStore>();
  }
  struct Unwatch {
    TcpStore* s;
    ~Unwatch() {
      if (s) s->watch_members({});
    }
  } unwatch{tcp.get()};
  ProcessGroupPtr pg;
  try {
    if (options.backend == "gloo") {
      pg = new_gloo_group(store, env.rank, env.world_size, pgo);
    } else {
      auto& reg = detail::backend_registry();
      auto it = reg.find(options.backend);
      ACCEL_CHECK(it != reg.end(), DistError, "init_process_group", "backend '", options.backend,
                  "' is not available in this build (have: gloo", reg.count("nccl") ? ", nccl" : "",
                  ")", options.backend == "nccl" ? std::string("; ") + kNoNcclBuild : "");
      pg = it->second(store, env.rank, env.world_size, pgo);
    }
  } catch (const std::exception& e) {
    // The ranks still waiting learn why this one gave up (Note [store membership]).
    if (tcp) tcp->leave(e.what());
    throw;
  }
  g_default_store = store;
  g_default_group = pg;
  return pg;
}

bool is_initialized() {
  std::lock_guard<std::mutex> g(g_default_mu);
  return bool(g_default_group);
}

ProcessGroupPtr default_group() {
  std::lock_guard<std::mutex> g(g_default_mu);
  ACCEL_CHECK(g_default_group, DistError, "default_group",
              "no process group: call accel::dist::init_process_group() first");
  return g_default_group;
}

std::shared_ptr<Store> default_store() {
  std::lock_guard<std::mutex> g(g_default_mu);
  ACCEL_CHECK(g_default_store, DistError, "default_store",
              "no process group: call accel::dist::init_process_group() first");
  return g_default_store;
}

void destroy_process_group() {
  ProcessGroupPtr pg;
  std::shared_ptr<Store> store;
  {
    std::lock_guard<std::mutex> g(g_default_mu);
    pg = std::move(g_default_group);
    store = std::move(g_default_store);
  }
  pg.reset();  // outside the lock: joins the worker
  store.reset();
}

}  // namespace accel::dist
