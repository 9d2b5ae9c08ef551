// The op x device kernel table.
//
// Each kernel family declares its stubs in kernels/stubs/<family>.h with their function types
// (core itself declares only the copy/fill stubs it needs to create tensors, below) and defines
// them in kernels/stubs/stubs.cc; each backend registers its kernel from kernels/<backend>/ with
// ACCEL_REGISTER_KERNEL. Calling a stub for a device with no kernel
// throws DeviceError naming the op and the device.
//
// Note [stub initialisation]: DispatchStub has a constexpr constructor, so every stub is
// constant-initialised before any dynamic initialiser (the registrations) runs, whatever the
// order of translation units.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"

namespace accel {

namespace detail {
[[noreturn]] void throw_no_kernel(const char* op, Device d);
// Registration log and call tracing (Note [kernel coverage]).
void note_kernel_registration(const char* stub, DeviceType t);
extern std::atomic<bool> g_trace_stub_calls;
void trace_stub_call(const char* stub, DeviceType t);
}  // namespace detail

// Note [kernel coverage]: every ACCEL_REGISTER_KERNEL is logged, and while a StubCallRecorder is
// alive every stub call is recorded (one relaxed atomic load per call otherwise). The op table's
// runners compare the two: a kernel registered for a device that no case reaches fails the suite.
struct KernelRegistration {
  std::string stub;
  DeviceType device;
};
std::vector<KernelRegistration> registered_kernels();

// Records (stub, device type) of every stub call on any thread while alive. One at a time.
class StubCallRecorder {
 public:
  StubCallRecorder();
  ~StubCallRecorder();
  StubCallRecorder(const StubCallRecorder&) = delete;
  StubCallRecorder& operator=(const StubCallRecorder&) = delete;
  // Sorted, without duplicates.
  std::vector<std::pair<std::string, DeviceType>> calls() const;
};

template <typename Fn>
struct DispatchStub;

template <typename R, typename... Args>
struct DispatchStub<R (*)(Args...)> {
  using FnPtr = R (*)(Args...);
  const char* name;
  FnPtr table[kNumDeviceTypes] = {};

  constexpr explicit DispatchStub(const char* n) : name(n) {}
  R operator()(Device dev, Args... args) const {
    FnPtr f = table[int(dev.type)];
    if (ACCEL_UNLIKELY(f == nullptr)) detail::throw_no_kernel(name, dev);
    if (ACCEL_UNLIKELY(detail::g_trace_stub_calls.load(std::memory_order_relaxed)))
      detail::trace_stub_call(name, dev.type);
    return f(args...);
  }
  bool has(DeviceType t) const { return table[int(t)] != nullptr; }
};

}  // namespace accel

#define ACCEL_DECLARE_STUB(stub, fn_type) \
  using stub##_fn = fn_type;              \
  extern ::accel::DispatchStub<stub##_fn> stub
#define ACCEL_DEFINE_STUB(stub) constinit ::accel::DispatchStub<stub##_fn> stub(#stub)
#define ACCEL_REGISTER_KERNEL(stub, devtype, fn)                      \
  static const bool stub##_registered_##devtype [[maybe_unused]] =    \
      (::accel::stub.table[int(::accel::DeviceType::devtype)] = (fn), \
       ::accel::detail::note_kernel_registration(#stub, ::accel::DeviceType::devtype), true)

namespace accel {

// dst = src (same device, any strides, src broadcast to dst's shape, dtype converted).
ACCEL_DECLARE_STUB(copy_stub, void (*)(Tensor& dst, const Tensor& src));
ACCEL_DECLARE_STUB(fill_stub, void (*)(Tensor& dst, Scalar v));
// Copy between devices (registered by a non-CPU backend under its own device type): dst and src
// both contiguous, same dtype and numel.
ACCEL_DECLARE_STUB(cross_device_copy_stub,
                   void (*)(Tensor& dst, const Tensor& src, bool non_blocking));

}  // namespace accel
