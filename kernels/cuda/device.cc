// CUDA devices, streams and events (see kernels/cuda/device.h).
#include "kernels/cuda/device.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace accel::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  ACCEL_THROW(Error, "cuda", call, " failed: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err), " (", file, ":", line, ")");
}

// ---------------- devices ----------------

namespace {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int count = 0;
  std::string reason;
};

// Queried once: cudaGetDeviceCount loads the driver; without one it returns an error, which
// means "no device" here rather than a failure.
const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      d.reason = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      n = 0;
    } else if (n == 0) {
      d.reason = "the CUDA driver reports no device";
    }
    d.count = std::min(n, kMaxDevices);
    return d;
  }();
  return info;
}

thread_local int t_current_device = -1;  // -1: not queried yet on this thread

}  // namespace

int device_count() { return device_info().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return device_info().reason; }

void check_device(Device d, const char* op) {
  ACCEL_CHECK(d.is_cuda(), DeviceError, op, "expected a CUDA device, got ", d);
  const int n = device_count();
  ACCEL_CHECK(n > 0, DeviceError, op, "CUDA device ", d,
              " requested but no CUDA device is present (", unavailable_reason(), ")");
  ACCEL_CHECK(d.index >= 0 && d.index < n, DeviceError, op, "CUDA device ", d, " does not exist; ",
              n, " device(s) visible");
}

int current_device() {
  if (ACCEL_UNLIKELY(t_current_device < 0)) {
    int d = 0;
    if (is_available()) ACCEL_CUDA_CHECK(cudaGetDevice(&d));
    t_current_device = d;
  }
  return t_current_device;
}

void set_device(int index) {
  if (index == t_current_device) return;
  check_device(Device::cuda(index), "set_device");
  ACCEL_CUDA_CHECK(cudaSetDevice(index));
  t_current_device = index;
}

DeviceGuard::DeviceGuard(int index) : prev_(current_device()) {
  if (index != prev_) set_device(index);
}
DeviceGuard::~DeviceGuard() {
  if (prev_ != t_current_device) {
    if (cudaSetDevice(prev_) == cudaSuccess) t_current_device = prev_;
  }
}

const cudaDeviceProp& device_properties(int index) {
  if (index < 0) index = current_device();
  check_device(Device::cuda(index), "device_properties");
  static std::mutex mu;
  static std::array<std::unique_ptr<cudaDeviceProp>, kMaxDevices> props;
  std::lock_guard<std::mutex> lk(mu);
  if (!props[size_t(index)]) {
    auto p = std::make_unique<cudaDeviceProp>();
    ACCEL_CUDA_CHECK(cudaGetDeviceProperties(p.get(), index));
    props[size_t(index)] = std::move(p);
  }
  return *props[size_t(index)];
}

int multiprocessor_count(int index) {
  if (index < 0) index = current_device();
  // Read on every kernel launch: keep it off the mutex once known.
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  int n = cache[size_t(index)].load(std::memory_order_relaxed);
  if (ACCEL_UNLIKELY(n == 0)) {
    n = device_properties(index).multiProcessorCount;
    cache[size_t(index)].store(n, std::memory_order_relaxed);
  }
  return n;
}

void synchronize(int index) {
  DeviceGuard g(index < 0 ? current_device() : index);
  ACCEL_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---------------- streams ----------------

namespace {
thread_local std::array<cudaStream_t, kMaxDevices> t_current_stream{};  // null: default stream

int resolve(int device) { return device < 0 ? current_device() : device; }
}  // namespace

void Stream::synchronize() const {
  DeviceGuard g(device_);
  ACCEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool Stream::query() const {
  DeviceGuard g(device_);
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  ACCEL_CUDA_CHECK(e);
  return true;
}

Stream default_stream(int device) { return Stream(nullptr, resolve(device)); }

Stream current_stream(int device) {
  device = resolve(device);
  return Stream(t_current_stream[size_t(device)], device);
}

void set_current_stream(const Stream& s) {
  check_device(Device::cuda(s.device()), "set_current_stream");
  t_current_stream[size_t(s.device())] = s.handle();
}

Stream new_stream(int device, bool high_priority) {
  device = resolve(device);
  DeviceGuard g(device);
  int lo = 0, hi = 0;
  ACCEL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s = nullptr;
  ACCEL_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? hi : lo));
  return Stream(s, device);
}

StreamGuard::StreamGuard(const Stream& s)
    : prev_stream_(current_stream(s.device())), prev_device_(current_device()) {
  set_device(s.device());
  set_current_stream(s);
}
StreamGuard::~StreamGuard() {
  t_current_stream[size_t(prev_stream_.device())] = prev_stream_.handle();
  if (prev_device_ != t_current_device) {
    if (cudaSetDevice(prev_device_) == cudaSuccess) t_current_device = prev_device_;
  }
}

// ---------------- events ----------------

Event::Event(bool timing) : timing_(timing) {}

Event::~Event() {
  if (event_) {
    (void)cudaEventDestroy(event_);  // never throw from a destructor
  }
}

Event::Event(Event&& o) noexcept : event_(o.event_), timing_(o.timing_), device_(o.device_) {
  o.event_ = nullptr;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_) (void)cudaEventDestroy(event_);
    event_ = o.event_;
    timing_ = o.timing_;
    device_ = o.device_;
    o.event_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& s) {
  DeviceGuard g(s.device());
  if (!event_) {
    ACCEL_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = s.device();
  }
  ACCEL_CHECK(device_ == s.device(), DeviceError, "Event::record", "event of cuda:", device_,
              " recorded on a stream of cuda:", s.device());
  ACCEL_CUDA_CHECK(cudaEventRecord(event_, s.handle()));
}

void Event::block(const Stream& s) const {
  if (!event_) return;
  DeviceGuard g(s.device());
  ACCEL_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), event_, 0));
}

void Event::synchronize() const {
  if (event_) ACCEL_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() const {
  if (!event_) return true;
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  ACCEL_CUDA_CHECK(e);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  ACCEL_CHECK(timing_ && end.timing_ && event_ && end.event_, ValueError, "Event::elapsed_ms",
              "both events must be created with timing = true and recorded");
  float ms = 0;
  ACCEL_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace accel::cuda
