#include "core/dispatch.h"

#include <algorithm>
#include <mutex>
#include <set>

namespace accel::detail {

void throw_no_kernel(const char* op, Device d) {
  ACCEL_THROW(
      DeviceError, op, "no kernel registered for device ", d,
      d.is_cuda() ? " (accel was built without CUDA, or the op has no CUDA kernel yet)" : "");
}

namespace {
// Function-local statics: registrations run from other translation units' dynamic initialisers.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<KernelRegistration>& registrations() {
  static std::vector<KernelRegistration> r;
  return r;
}
std::set<std::pair<std::string, DeviceType>>& traced() {
  static std::set<std::pair<std::string, DeviceType>> s;
  return s;
}
bool g_recorder_alive = false;
}  // namespace

std::atomic<bool> g_trace_stub_calls{false};

// The flag is set while a recorder or a profiler (core/profiler.cc) is alive.
void refresh_trace_flag() {
  std::lock_guard<std::mutex> lk(registry_mutex());
  g_trace_stub_calls.store(g_recorder_alive || profiler_on(), std::memory_order_relaxed);
}

void note_kernel_registration(const char* stub, DeviceType t) {
  std::lock_guard<std::mutex> lk(registry_mutex());
  registrations().push_back({stub, t});
}

void trace_stub_call(const char* stub, DeviceType t) {
  std::lock_guard<std::mutex> lk(registry_mutex());
  if (g_recorder_alive) traced().emplace(stub, t);
}

}  // namespace accel::detail

namespace accel {

std::vector<KernelRegistration> registered_kernels() {
  std::lock_guard<std::mutex> lk(detail::registry_mutex());
  return detail::registrations();
}

StubCallRecorder::StubCallRecorder() {
  std::lock_guard<std::mutex> lk(detail::registry_mutex());
  ACCEL_CHECK(!detail::g_recorder_alive, Error, "StubCallRecorder",
              "another recorder is alive (one at a time)");
  detail::g_recorder_alive = true;
  detail::traced().clear();
  detail::g_trace_stub_calls.store(true, std::memory_order_relaxed);
}

StubCallRecorder::~StubCallRecorder() {
  std::lock_guard<std::mutex> lk(detail::registry_mutex());
  detail::g_recorder_alive = false;
  detail::g_trace_stub_calls.store(detail::profiler_on(), std::memory_order_relaxed);
}

std::vector<std::pair<std::string, DeviceType>> StubCallRecorder::calls() const {
  std::lock_guard<std::mutex> lk(detail::registry_mutex());
  return {detail::traced().begin(), detail::traced().end()};
}

// Stubs core itself calls to create and fill tensors; every other stub is in kernels/stubs/.
ACCEL_DEFINE_STUB(copy_stub);
ACCEL_DEFINE_STUB(fill_stub);
ACCEL_DEFINE_STUB(cross_device_copy_stub);

}  // namespace accel
