// The op x device kernel table.
//
// Each kernel family declares a stub here (or in core/dispatch_<family>.h) with its function
// type. The op's file in autograd/ops/ defines the stub; each backend registers its kernel from
// kernels/<backend>/ with ACCEL_REGISTER_KERNEL. Calling a stub for a device with no kernel
// throws DeviceError naming the op and the device.
//
// Note [stub initialisation]: DispatchStub has a constexpr constructor, so every stub is
// constant-initialised before any dynamic initialiser (the registrations) runs, whatever the
// order of translation units.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"

namespace accel {

namespace detail {
[[noreturn]] void throw_no_kernel(const char* op, Device d);
}

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
    return f(args...);
  }
  bool has(DeviceType t) const { return table[int(t)] != nullptr; }
};

}  // namespace accel

#define ACCEL_DECLARE_STUB(stub, fn_type) \
  using stub##_fn = fn_type;              \
  extern ::accel::DispatchStub<stub##_fn> stub
#define ACCEL_DEFINE_STUB(stub) constinit ::accel::DispatchStub<stub##_fn> stub(#stub)
#define ACCEL_REGISTER_KERNEL(stub, devtype, fn)                                \
  static const bool stub##_registered_##devtype [[maybe_unused]] =             \
      (::accel::stub.table[int(::accel::DeviceType::devtype)] = (fn), true)

namespace accel {

// ---------------- elementwise family (kernels/<backend>/unary.*, binary.*, copy.*) -------------

enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Silu,
  Sin, Cos, Sign, Reciprocal, Square, Log1p, Expm1, Erf, LogicalNot,
  PowScalar,   // x ^ p0
  Clamp,       // min(max(x, p0), p1)
  AddScalar,   // x + p0
  MulScalar,   // x * p0
  RSubScalar,  // p0 - x
  RDivScalar,  // p0 / x
  Count
};
struct UnaryParams {
  double p0 = 0, p1 = 0;
};

enum class BinaryOp : uint8_t {
  Add,  // a + alpha * b
  Sub,  // a - alpha * b
  Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge,  // out is bool
  LogicalAnd, LogicalOr,   // out is bool
  // Backward helpers, out = f(grad=a, x=b): not differentiable themselves.
  ReluGrad,      // a * (b > 0)
  GeluErfGrad,   // a * gelu_erf'(b)
  GeluTanhGrad,  // a * gelu_tanh'(b)
  SiluGrad,      // a * silu'(b)
  SigmoidGrad,   // a * b * (1 - b), b = sigmoid output
  TanhGrad,      // a * (1 - b^2), b = tanh output
  Count
};
constexpr bool is_comparison(BinaryOp op) {
  return op >= BinaryOp::Eq && op <= BinaryOp::LogicalOr;
}

// out = op(in). `in` and `out` have the same shape; dtypes may differ only for ops with a bool
// result (LogicalNot). `in` may be strided; `out` is freshly allocated (contiguous) or a view.
ACCEL_DECLARE_STUB(unary_stub, void (*)(UnaryOp op, const Tensor& in, Tensor& out,
                                        const UnaryParams& p));
// out = op(a, b). a and b share a dtype and broadcast to out's shape (the kernel computes the
// broadcast strides itself, so no expanded views are built on the hot path).
ACCEL_DECLARE_STUB(binary_stub, void (*)(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out,
                                         double alpha));
// out = cond ? a : b; cond bool, a/b same dtype as out, all broadcast to out.
ACCEL_DECLARE_STUB(where_stub, void (*)(const Tensor& cond, const Tensor& a, const Tensor& b,
                                        Tensor& out));
// dst = src (same device, any strides, src broadcast to dst's shape, dtype converted).
ACCEL_DECLARE_STUB(copy_stub, void (*)(Tensor& dst, const Tensor& src));
ACCEL_DECLARE_STUB(fill_stub, void (*)(Tensor& dst, Scalar v));
// Copy between devices (registered by a non-CPU backend under its own device type): dst and src
// both contiguous, same dtype and numel.
ACCEL_DECLARE_STUB(cross_device_copy_stub, void (*)(Tensor& dst, const Tensor& src, bool non_blocking));

}  // namespace accel
