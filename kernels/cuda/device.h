// CUDA runtime utilities of the CUDA backend: devices, streams, events, memory, error checks.
//
// Used by the kernels of this folder and by other CUDA code of the library (dist/nccl/); only
// compiled when the backend is built (-Dcuda=auto|enabled), so include it from CUDA-only files.
// See docs/cuda.md for the contract (current device and current stream per thread).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace accel::cuda {

// ---------------- errors ----------------
// Every CUDA runtime call goes through ACCEL_CUDA_CHECK: a failure becomes accel::Error
// "[cuda] <call> failed: <name>: <description> (file:line)". Out-of-memory is reported by the
// allocator with sizes instead.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

#define ACCEL_CUDA_CHECK(expr)                                                     \
  do {                                                                             \
    const cudaError_t accel_cuda_err_ = (expr);                                    \
    if (ACCEL_UNLIKELY(accel_cuda_err_ != cudaSuccess)) {                          \
      ::accel::cuda::throw_cuda_error(accel_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

// Checks the last kernel launch (bad configuration, missing kernel image for this GPU).
#define ACCEL_CUDA_CHECK_LAUNCH() ACCEL_CUDA_CHECK(cudaGetLastError())

// ---------------- devices ----------------
// Number of visible devices; 0 when the driver is missing or reports no device. Never throws.
int device_count();
bool is_available();
// Why is_available() is false ("no CUDA driver", the runtime's message, ...); empty otherwise.
std::string unavailable_reason();
// DeviceError "[op] ..." unless `d` is a CUDA device that exists.
void check_device(Device d, const char* op);

// The calling thread's current device (cudaSetDevice is per thread). Cached, so cheap.
int current_device();
void set_device(int index);  // DeviceError for an index out of range

// Makes `index` current for the scope; restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  explicit DeviceGuard(Device d) : DeviceGuard(int(d.index)) {}
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

const cudaDeviceProp& device_properties(int index = -1);  // -1: current device
int multiprocessor_count(int index = -1);
void synchronize(int index = -1);  // waits for all work on the device

// ---------------- streams ----------------
// A stream handle (not owning). The null handle is the device's legacy default stream, which
// is every thread's current stream until set otherwise. Streams from new_stream() are
// non-blocking (no implicit sync with the default stream) and live until the process ends.
class Stream {
 public:
  Stream() = default;
  Stream(cudaStream_t s, int device) : stream_(s), device_(int16_t(device)) {}
  cudaStream_t handle() const { return stream_; }
  int device() const { return device_; }
  bool is_default() const { return stream_ == nullptr; }
  void synchronize() const;
  bool query() const;  // true when all work queued on it has finished
  bool operator==(const Stream& o) const { return stream_ == o.stream_ && device_ == o.device_; }
  bool operator!=(const Stream& o) const { return !(*this == o); }

 private:
  cudaStream_t stream_ = nullptr;
  int16_t device_ = 0;
};

Stream default_stream(int device = -1);
// The stream kernels of the calling thread are queued on for `device` (-1: current device).
Stream current_stream(int device = -1);
// Sets the current stream of the stream's device for the calling thread.
void set_current_stream(const Stream& s);
// A new non-blocking stream on `device` (high_priority: for communication overlapping compute).
Stream new_stream(int device = -1, bool high_priority = false);

// Makes `s` (and its device) current for the scope; restores both.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_stream_;
  int prev_device_;
};

// ---------------- events ----------------
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Created lazily on first record, on the stream's device.
  void record(const Stream& s);
  void record() { record(current_stream()); }
  // Work queued on `s` after this call waits for the recorded point (no host wait).
  void block(const Stream& s) const;
  void synchronize() const;  // host waits
  bool query() const;        // true when reached (or never recorded)
  // Milliseconds from this event to `end`; both recorded with timing = true.
  float elapsed_ms(const Event& end) const;
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  bool timing_ = false;
  int device_ = -1;
};

// ---------------- memory ----------------
// Stats of the caching device allocator for one device (-1: all devices).
AllocatorStats memory_stats(int device = -1);
// Frees cached (unused) device blocks and pinned host blocks.
void empty_cache();
// Marks `t`'s memory as used by work on `s`, a stream other than the one it was allocated on:
// when freed, the block is reused only after the work queued on `s` so far has finished.
void record_stream(const Tensor& t, const Stream& s);
// True when `p` (a base pointer of a Storage) came from the pinned host allocator.
bool is_pinned(const void* p);
// A CPU tensor in page-locked memory: host<->device copies from/to it run asynchronously.
Tensor empty_pinned(const Shape& shape, DType dtype);

}  // namespace accel::cuda
