// CPU binary elementwise kernels (broadcasting) and where().
#include <cmath>

#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/common/scalar_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/elementwise_binary.cc"
#include "kernels/cpu/isa_foreach.h"
#else
// elementwise.h holds the loop drivers, so it is compiled in every pass.
#include "kernels/cpu/elementwise.h"

namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// The activation-gradient lambdas below (kernels/common/scalar_math.h formulas on CpuMath) are
// large enough (erf + exp polynomials) that GCC stops inlining them into binary_loop's six call
// sites; the `omp simd` loops then call a scalar
// function per element and GELU's backward took 28 % of a gpt step. Forcing the inline restores
// the vector code (bench/kernels gelu_backward rows, tests/kernels gelu grad).
#define ACCEL_VEC_LAMBDA __attribute__((always_inline))

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha) {
  using A = acc_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<A>;
  switch (op) {
    case BinaryOp::Add:
      if (alpha == 1.0) return binary_loop<T, T>(a, b, out, [](A x, A y) { return A(x + y); });
      return binary_loop<T, T>(a, b, out, [al = A(alpha)](A x, A y) { return A(x + al * y); });
    case BinaryOp::Sub:
      if (alpha == 1.0) return binary_loop<T, T>(a, b, out, [](A x, A y) { return A(x - y); });
      return binary_loop<T, T>(a, b, out, [al = A(alpha)](A x, A y) { return A(x - al * y); });
    case BinaryOp::Mul: return binary_loop<T, T>(a, b, out, [](A x, A y) { return A(x * y); });
    case BinaryOp::Div:
      if constexpr (kFloat) {
        return binary_loop<T, T>(a, b, out, [](A x, A y) { return x / y; });
      } else {
        break;  // integer division is routed to a float dtype by the op layer
      }
    case BinaryOp::Pow:
      if constexpr (kFloat) {
        return binary_loop<T, T>(a, b, out, [](A x, A y) { return std::pow(x, y); });
      } else {
        break;
      }
    case BinaryOp::Maximum:
      return binary_loop<T, T>(a, b, out, [](A x, A y) {
        if constexpr (kFloat) {
          if (std::isnan(x) || std::isnan(y)) return x + y;  // NaN propagates
        }
        return x > y ? x : y;
      });
    case BinaryOp::Minimum:
      return binary_loop<T, T>(a, b, out, [](A x, A y) {
        if constexpr (kFloat) {
          if (std::isnan(x) || std::isnan(y)) return x + y;
        }
        return x < y ? x : y;
      });
    case BinaryOp::Eq: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x == y; });
    case BinaryOp::Ne: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x != y; });
    case BinaryOp::Lt: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x < y; });
    case BinaryOp::Le: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x <= y; });
    case BinaryOp::Gt: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x > y; });
    case BinaryOp::Ge: return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x >= y; });
    case BinaryOp::LogicalAnd:
      return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x != A(0) && y != A(0); });
    case BinaryOp::LogicalOr:
      return binary_loop<bool, T>(a, b, out, [](A x, A y) { return x != A(0) || y != A(0); });
    default: break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case BinaryOp::ReluGrad:
        return binary_loop<T, T>(a, b, out, [](A g, A x) { return common::relu_grad(g, x); });
      case BinaryOp::GeluErfGrad:
        return binary_loop_grad_poly<T, T>(a, b, out, [](A g, A x) ACCEL_VEC_LAMBDA {
          if constexpr (std::is_same_v<A, float>) {
            return gelu_erf_grad_f32(g, x);  // one exp, not two (vec_math.h)
          } else {
            return common::gelu_erf_grad<CpuMath>(g, x);
          }
        });
      case BinaryOp::GeluTanhGrad:
        return binary_loop_grad_poly<T, T>(a, b, out, [](A g, A x) ACCEL_VEC_LAMBDA {
          return common::gelu_tanh_grad<CpuMath>(g, x);
        });
      case BinaryOp::SiluGrad:
        return binary_loop_grad_poly<T, T>(
            a, b, out, [](A g, A x) ACCEL_VEC_LAMBDA { return common::silu_grad<CpuMath>(g, x); });
      case BinaryOp::SigmoidGrad:
        return binary_loop<T, T>(a, b, out, [](A g, A y) { return common::sigmoid_grad(g, y); });
      case BinaryOp::TanhGrad:
        return binary_loop<T, T>(a, b, out, [](A g, A y) { return common::tanh_grad(g, y); });
      default: break;
    }
  }
  ACCEL_THROW(DTypeError, "binary", "op ", int(op), " is not defined for dtype ", a.dtype());
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha) {
  if (out.numel() == 0) return;
  ACCEL_DISPATCH_ALL(a.dtype(), "binary",
                     [&]<typename T>() { binary_typed<T>(op, a, b, out, alpha); });
}

void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  const Tensor* ops[4] = {&out, &cond, &a, &b};
  StridedLoop<4> loop(ops);
  ACCEL_DISPATCH_ALL(out.dtype(), "where", [&]<typename T>() {
    loop.run([](char* const* p, const int64_t* st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const bool c = *reinterpret_cast<const bool*>(p[1] + i * st[1]);
        *reinterpret_cast<T*>(p[0] + i * st[0]) = c ? *reinterpret_cast<const T*>(p[2] + i * st[2])
                                                    : *reinterpret_cast<const T*>(p[3] + i * st[3]);
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(binary_stub, CPU, ACCEL_ISA_DISPATCH(binary_kernel));
ACCEL_REGISTER_KERNEL(where_stub, CPU, ACCEL_ISA_DISPATCH(where_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
