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
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
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
// True while a StubCallRecorder or a Profiler (core/profiler.h) is alive.
extern std::atomic<bool> g_trace_stub_calls;
void trace_stub_call(const char* stub, DeviceType t);

// ---- profiler hooks (core/profiler.h; Note [stub profiler] in core/profiler.cc) ----
struct ProfiledTensor {
  const Tensor* tensor;
  bool written;  // passed as Tensor& or Tensor*: the kernel writes it
};
bool profiler_on();
// The profiler wants `stub`'s calls on `t` captured for replay.
bool profiler_wants_replay(const char* stub, DeviceType t);
// True when a call with this key was captured before (its count is then incremented).
bool profiler_seen_replay(const std::string& key);
void profiler_add_replay(const char* stub, const std::string& key, std::function<void()> run);
Tensor profiler_clone(const Tensor& t);  // same sizes, strides, offset and bytes; fresh storage
int64_t profiler_enter();                // pushes a frame, returns its start time (ns)
void profiler_exit(const char* stub, const char* label, int64_t t0, const ProfiledTensor* ts,
                   size_t n);
// The label of a stub's op argument (UnaryOp and friends overload it next to their enums).
template <typename A>
const char* profile_label(const A&) {
  return nullptr;
}
std::string profile_key_bytes(const void* p, size_t n);
std::string profile_key_tensor(const Tensor& t);

// A copy of one stub argument that a replay passes again: tensors are cloned into fresh storage
// (the originals are freed or reused long before the replay), other values copied.
template <typename T>
constexpr bool kReplayable = std::is_trivially_copyable_v<std::remove_cvref_t<T>> &&
                             !std::is_pointer_v<std::remove_cvref_t<T>>;
template <>
inline constexpr bool kReplayable<const Tensor&> = true;
template <>
inline constexpr bool kReplayable<Tensor&> = true;
template <>
inline constexpr bool kReplayable<Tensor*> = true;

template <typename T>
struct ReplayArg {
  using V = std::remove_cvref_t<T>;
  explicit ReplayArg(T v) : v_(v) {}
  T get() { return v_; }
  V v_;
};
template <>
struct ReplayArg<const Tensor&> {
  explicit ReplayArg(const Tensor& t) : t_(t.defined() ? profiler_clone(t) : Tensor()) {}
  const Tensor& get() { return t_; }
  Tensor t_;
};
template <>
struct ReplayArg<Tensor&> {
  explicit ReplayArg(Tensor& t) : t_(t.defined() ? profiler_clone(t) : Tensor()) {}
  Tensor& get() { return t_; }
  Tensor t_;
};
template <>
struct ReplayArg<Tensor*> {
  explicit ReplayArg(Tensor* t) : null_(t == nullptr) {
    if (t != nullptr && t->defined()) t_ = profiler_clone(*t);
  }
  Tensor* get() { return null_ ? nullptr : &t_; }
  bool null_;
  Tensor t_;
};

template <typename A>
void profile_arg(std::vector<ProfiledTensor>& ts, const char*& label, std::string& key, A& a) {
  using V = std::remove_cvref_t<A>;
  if constexpr (std::is_same_v<V, Tensor>) {
    if (a.defined()) ts.push_back({&a, !std::is_const_v<A>});
    key += a.defined() ? profile_key_tensor(a) : std::string("undef;");
  } else if constexpr (std::is_same_v<V, Tensor*> || std::is_same_v<V, const Tensor*>) {
    if (a != nullptr && a->defined()) ts.push_back({a, std::is_same_v<V, Tensor*>});
    key += a != nullptr && a->defined() ? profile_key_tensor(*a) : std::string("null;");
  } else if constexpr (std::is_same_v<V, std::vector<Tensor>>) {
    for (const Tensor& t : a) {
      if (t.defined()) ts.push_back({&t, !std::is_const_v<A>});
      key += t.defined() ? profile_key_tensor(t) : std::string("undef;");
    }
  } else {
    if (label == nullptr) label = profile_label(a);  // ADL finds the enums' overloads
    if constexpr (std::is_trivially_copyable_v<V> && !std::is_pointer_v<V>) {
      key += profile_key_bytes(&a, sizeof(V));
    } else {
      key += "?;";
    }
  }
}

// The slow path of DispatchStub::operator() while a Profiler is alive.
template <typename R, typename... Args>
R profiled_call(const char* name, Device dev, R (*f)(Args...), Args... args) {
  std::vector<ProfiledTensor> ts;
  const char* label = nullptr;
  std::string key = name;
  key += ':';
  (profile_arg<std::remove_reference_t<Args>>(ts, label, key, args), ...);
  if constexpr ((kReplayable<Args> && ...)) {
    if (profiler_wants_replay(name, dev.type) && !profiler_seen_replay(key)) {
      auto held = std::make_shared<std::tuple<ReplayArg<Args>...>>(ReplayArg<Args>(args)...);
      profiler_add_replay(name, key,
                          [f, held] { std::apply([f](auto&... h) { f(h.get()...); }, *held); });
    }
  }
  struct Frame {
    const char* name;
    const char* label;
    int64_t t0;
    const std::vector<ProfiledTensor>& ts;
    ~Frame() { profiler_exit(name, label, t0, ts.data(), ts.size()); }
  } frame{name, label, profiler_enter(), ts};
  return f(args...);
}
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
    if (ACCEL_UNLIKELY(detail::g_trace_stub_calls.load(std::memory_order_relaxed))) {
      detail::trace_stub_call(name, dev.type);
      if (detail::profiler_on()) return detail::profiled_call<R, Args...>(name, dev, f, args...);
    }
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
