// Note [stub profiler]
// DispatchStub::operator() already tests one relaxed atomic per call for the kernel-coverage
// recorder; a live Profiler sets the same flag, so profiling costs nothing when off. On the slow
// path (detail::profiled_call in core/dispatch.h) the call is described (its tensors, whether
// each is written, the op label of an enum argument, a key of every argument), captured for
// replay when asked, and timed between profiler_enter and profiler_exit. Self time: every
// thread keeps a stack of the child time of the stub calls it is inside; a kernel that calls
// another stub (a matmul copying a strided operand with copy_stub) is charged without it.
// Kernels that run OpenMP teams are timed on the calling thread, so self times add up to the
// wall time of the calling thread's kernels.
#include "core/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/dispatch.h"

namespace accel {
namespace {

struct RowStats {
  int64_t calls = 0;
  int64_t self_ns = 0, total_ns = 0;
};

struct TouchedStorage {
  StoragePtr storage;  // kept alive: a freed address may be reused by another tensor
  bool written = false;
};

struct State {
  std::mutex mu;
  bool alive = false;
  ProfileOptions options;
  std::map<std::pair<std::string, std::string>, RowStats> rows;
  std::vector<ReplayCall> replays;
  std::unordered_map<std::string, size_t> replay_index;
  std::unordered_map<const Storage*, TouchedStorage> touched;
};

State& state() {
  static State s;
  return s;
}

std::atomic<bool> g_profiler_on{false};
thread_local std::vector<int64_t> t_child_ns;  // per open frame: time of its nested stub calls

void clear_locked(State& s) {
  s.rows.clear();
  s.replays.clear();
  s.replay_index.clear();
  s.touched.clear();
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace detail {

void refresh_trace_flag();  // core/dispatch.cc
bool profiler_on() { return g_profiler_on.load(std::memory_order_relaxed); }

bool profiler_wants_replay(const char* stub, DeviceType t) {
  if (t != DeviceType::CPU) return false;
  std::lock_guard<std::mutex> lk(state().mu);
  for (const std::string& s : state().options.replay)
    if (s == stub) return true;
  return false;
}

bool profiler_seen_replay(const std::string& key) {
  std::lock_guard<std::mutex> lk(state().mu);
  auto it = state().replay_index.find(key);
  if (it == state().replay_index.end()) return false;
  ++state().replays[it->second].count;
  return true;
}

void profiler_add_replay(const char* stub, const std::string& key, std::function<void()> run) {
  std::lock_guard<std::mutex> lk(state().mu);
  State& s = state();
  if (!s.alive) return;
  auto [it, fresh] = s.replay_index.emplace(key, s.replays.size());
  if (!fresh) {
    ++s.replays[it->second].count;
    return;
  }
  s.replays.push_back({stub, key, 1, std::move(run)});
}

Tensor profiler_clone(const Tensor& t) {
  const Storage& src = *t.storage();
  auto storage = make_intrusive<Storage>(src.nbytes(), src.device());
  if (src.nbytes() > 0) std::memcpy(storage->data(), src.data(), src.nbytes());
  return Tensor(make_intrusive<TensorImpl>(std::move(storage), t.sizes(), t.strides(), t.offset(),
                                           t.dtype()));
}

int64_t profiler_enter() {
  t_child_ns.push_back(0);
  return now_ns();
}

void profiler_exit(const char* stub, const char* label, int64_t t0, const ProfiledTensor* ts,
                   size_t n) {
  const int64_t total = now_ns() - t0;
  const int64_t self = total - t_child_ns.back();
  t_child_ns.pop_back();
  if (!t_child_ns.empty()) t_child_ns.back() += total;
  std::lock_guard<std::mutex> lk(state().mu);
  State& s = state();
  if (!s.alive) return;
  RowStats& r = s.rows[{stub, label != nullptr ? label : ""}];
  ++r.calls;
  r.self_ns += self;
  r.total_ns += total;
  if (!s.options.count_bytes) return;
  for (const std::string& name : s.options.replay)
    if (name == stub) return;  // replayed kernels are timed alone, not counted as bytes
  for (size_t i = 0; i < n; ++i) {
    const StoragePtr& st = ts[i].tensor->storage();
    TouchedStorage& e = s.touched[st.get()];
    if (!e.storage) e.storage = st;
    e.written = e.written || ts[i].written;
  }
}

std::string profile_key_bytes(const void* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n + 1);
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[b[i] >> 4]);
    out.push_back(kHex[b[i] & 15]);
  }
  out.push_back(';');
  return out;
}

std::string profile_key_tensor(const Tensor& t) {
  std::string out(dtype_name(t.dtype()));
  out += '[';
  for (int64_t s : t.sizes()) out += std::to_string(s) + ",";
  out += "][";
  for (int64_t s : t.strides()) out += std::to_string(s) + ",";
  out += "]+" + std::to_string(t.offset()) + ";";
  return out;
}

}  // namespace detail

Profiler::Profiler(ProfileOptions options) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ACCEL_CHECK(!s.alive, Error, "Profiler", "another profiler is alive (one at a time)");
    s.alive = true;
    s.options = std::move(options);
  }
  reset();
  g_profiler_on.store(true, std::memory_order_relaxed);
  detail::refresh_trace_flag();
}

Profiler::~Profiler() {
  g_profiler_on.store(false, std::memory_order_relaxed);
  detail::refresh_trace_flag();
  std::lock_guard<std::mutex> lk(state().mu);
  state().alive = false;
  clear_locked(state());
}

void Profiler::reset() {
  std::lock_guard<std::mutex> lk(state().mu);
  clear_locked(state());
}

std::vector<ProfileRow> Profiler::rows() const {
  std::lock_guard<std::mutex> lk(state().mu);
  std::vector<ProfileRow> out;
  for (const auto& [k, r] : state().rows) {
    out.push_back({k.second.empty() ? k.first : k.first + ":" + k.second, r.calls,
                   double(r.self_ns) / 1e6, double(r.total_ns) / 1e6});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.self_ms > b.self_ms; });
  return out;
}

std::vector<ReplayCall> Profiler::replays() const {
  std::lock_guard<std::mutex> lk(state().mu);
  return state().replays;
}

int64_t Profiler::floor_bytes() const {
  std::lock_guard<std::mutex> lk(state().mu);
  int64_t b = 0;
  for (const auto& [p, e] : state().touched) b += int64_t(p->nbytes()) * (e.written ? 2 : 1);
  return b;
}

}  // namespace accel
