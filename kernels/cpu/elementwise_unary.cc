// CPU unary elementwise kernels. Math runs in acc_t (float for f16/bf16).
#include <cmath>

#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/common/scalar_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/elementwise_unary.cc"
#include "kernels/cpu/isa_foreach.h"
#else
// elementwise.h holds the loop drivers, so it is compiled in every pass.
#include "kernels/cpu/elementwise.h"

namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// The polynomial ops (erf, exp, GELU, SiLU, sigmoid) must inline into unary_loop's `omp simd`
// loop to vectorise: left to itself GCC kept the erf-based GELU lambda out of line (a scalar
// call per element: GELU 8.5 ms per 1M floats against oneDNN's 0.65, 18 % of a gpt step).
#define ACCEL_INLINE __attribute__((always_inline))

template <typename T>
void unary_float(UnaryOp op, const Tensor& in, Tensor& out, const UnaryParams& prm) {
  using A = acc_t<T>;
  const A p0 = A(prm.p0), p1 = A(prm.p1);
  switch (op) {
    case UnaryOp::Neg: return unary_loop<T, T>(in, out, [](A x) { return -x; });
    case UnaryOp::Exp:
      return unary_loop_poly<T, T>(in, out, [](A x) ACCEL_INLINE { return fast_exp(x); });
    case UnaryOp::Log: return unary_loop<T, T>(in, out, [](A x) { return std::log(x); });
    case UnaryOp::Sqrt: return unary_loop<T, T>(in, out, [](A x) { return std::sqrt(x); });
    case UnaryOp::Rsqrt: return unary_loop<T, T>(in, out, [](A x) { return A(1) / std::sqrt(x); });
    case UnaryOp::Abs: return unary_loop<T, T>(in, out, [](A x) { return std::abs(x); });
    case UnaryOp::Tanh:
      return unary_loop_poly<T, T>(in, out, [](A x) ACCEL_INLINE { return fast_tanh(x); });
    case UnaryOp::Sigmoid:
      return unary_loop_poly<T, T>(in, out,
                                   [](A x) ACCEL_INLINE { return common::sigmoid<CpuMath>(x); });
    case UnaryOp::Relu: return unary_loop<T, T>(in, out, [](A x) { return common::relu(x); });
    case UnaryOp::GeluErf:
      return unary_loop_poly<T, T>(in, out,
                                   [](A x) ACCEL_INLINE { return common::gelu_erf<CpuMath>(x); });
    case UnaryOp::GeluTanh:
      return unary_loop_poly<T, T>(in, out,
                                   [](A x) ACCEL_INLINE { return common::gelu_tanh<CpuMath>(x); });
    case UnaryOp::Silu:
      return unary_loop_poly<T, T>(in, out,
                                   [](A x) ACCEL_INLINE { return common::silu<CpuMath>(x); });
    case UnaryOp::Sin: return unary_loop<T, T>(in, out, [](A x) { return std::sin(x); });
    case UnaryOp::Cos: return unary_loop<T, T>(in, out, [](A x) { return std::cos(x); });
    case UnaryOp::Sign: return unary_loop<T, T>(in, out, [](A x) { return common::sign(x); });
    case UnaryOp::Reciprocal: return unary_loop<T, T>(in, out, [](A x) { return A(1) / x; });
    case UnaryOp::Square: return unary_loop<T, T>(in, out, [](A x) { return x * x; });
    case UnaryOp::Log1p: return unary_loop<T, T>(in, out, [](A x) { return std::log1p(x); });
    case UnaryOp::Expm1: return unary_loop<T, T>(in, out, [](A x) { return std::expm1(x); });
    case UnaryOp::Erf:
      return unary_loop_poly<T, T>(in, out, [](A x) ACCEL_INLINE { return fast_erf(x); });
    case UnaryOp::PowScalar:
      if (p0 == A(2)) return unary_loop<T, T>(in, out, [](A x) { return x * x; });
      return unary_loop<T, T>(in, out, [p0](A x) { return std::pow(x, p0); });
    case UnaryOp::Clamp:
      return unary_loop<T, T>(in, out, [p0, p1](A x) { return common::clamp(x, p0, p1); });
    case UnaryOp::AddScalar: return unary_loop<T, T>(in, out, [p0](A x) { return x + p0; });
    case UnaryOp::MulScalar: return unary_loop<T, T>(in, out, [p0](A x) { return x * p0; });
    case UnaryOp::RSubScalar: return unary_loop<T, T>(in, out, [p0](A x) { return p0 - x; });
    case UnaryOp::RDivScalar: return unary_loop<T, T>(in, out, [p0](A x) { return p0 / x; });
    case UnaryOp::LogicalNot: return unary_loop<bool, T>(in, out, [](A x) { return x == A(0); });
    case UnaryOp::Count: break;
  }
  ACCEL_THROW(ValueError, "unary", "unknown unary op ", int(op));
}

template <typename T>
void unary_int(UnaryOp op, const Tensor& in, Tensor& out, const UnaryParams& prm) {
  // Integer (and bool) inputs: the ops that keep an integer result. The op layer converts to a
  // float dtype before calling for exp, log, ...
  using A = acc_t<T>;
  const bool pint = prm.p0 == std::floor(prm.p0);
  switch (op) {
    case UnaryOp::Neg: return unary_loop<T, T>(in, out, [](A x) { return A(-x); });
    case UnaryOp::Abs:
      if constexpr (std::is_same_v<T, bool>) {
        return unary_loop<T, T>(in, out, [](A x) { return x; });
      } else {
        return unary_loop<T, T>(in, out, [](A x) { return x < 0 ? A(-x) : x; });
      }
    case UnaryOp::Sign: return unary_loop<T, T>(in, out, [](A x) { return common::sign(x); });
    case UnaryOp::Square: return unary_loop<T, T>(in, out, [](A x) { return A(x * x); });
    case UnaryOp::Relu: return unary_loop<T, T>(in, out, [](A x) { return common::relu(x); });
    case UnaryOp::LogicalNot: return unary_loop<bool, T>(in, out, [](A x) { return x == A(0); });
    case UnaryOp::Clamp: {
      const double lo = prm.p0, hi = prm.p1;
      return unary_loop<T, T>(in, out,
                              [lo, hi](A x) { return A(common::clamp(double(x), lo, hi)); });
    }
    case UnaryOp::AddScalar: {
      const double s = prm.p0;
      return unary_loop<T, T>(in, out, [s](A x) { return A(double(x) + s); });
    }
    case UnaryOp::MulScalar: {
      const double s = prm.p0;
      return unary_loop<T, T>(in, out, [s](A x) { return A(double(x) * s); });
    }
    case UnaryOp::RSubScalar: {
      const double s = prm.p0;
      return unary_loop<T, T>(in, out, [s](A x) { return A(s - double(x)); });
    }
    case UnaryOp::PowScalar:
      if (pint && prm.p0 >= 0) {
        const int64_t e = int64_t(prm.p0);
        return unary_loop<T, T>(in, out, [e](A x) {
          A r = A(1);
          for (int64_t i = 0; i < e; ++i) r = A(r * x);
          return r;
        });
      }
      break;
    default: break;
  }
  ACCEL_THROW(DTypeError, "unary", "op ", int(op), " is not defined for dtype ", in.dtype());
}

void unary_kernel(UnaryOp op, const Tensor& in, Tensor& out, const UnaryParams& p) {
  if (out.numel() == 0) return;
  ACCEL_DISPATCH_ALL(in.dtype(), "unary", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      unary_float<T>(op, in, out, p);
    } else {
      unary_int<T>(op, in, out, p);
    }
  });
}

// The level this pass was compiled for: cpu_isa_kernel_probe() tells tests which variant ran.
const char* compiled_isa() {
#if defined(ACCEL_CPU_NATIVE)
  return "native";
#elif ACCEL_ISA_LEVEL == 2
  return "avx512";
#elif ACCEL_ISA_LEVEL == 1
  return "avx2";
#else
  return "baseline";
#endif
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)
namespace accel {
ACCEL_REGISTER_KERNEL(unary_stub, CPU, ACCEL_ISA_DISPATCH(unary_kernel));
}

namespace accel::cpu {
const char* cpu_isa_kernel_probe() { return ACCEL_ISA_DISPATCH(compiled_isa)(); }
}  // namespace accel::cpu
#endif  // !ACCEL_ISA_NS
