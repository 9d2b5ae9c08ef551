// CUDA unary elementwise kernels (semantics: kernels/cpu/elementwise_unary.cc; activation formulas:
// kernels/common/scalar_math.h). Math runs in acc_t (float for
// f16/bf16, double for f64). One kernel per (dtype, layout); the op switch sits outside the
// element loop, so the loop of each op is compiled straight-line.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename In, typename Out, Layout L, int VEC, typename F>
__device__ __forceinline__ void unary_loop(F f, const In* __restrict__ x, Out* __restrict__ y,
                                           int64_t n, const OffsetCalc<2>& calc) {
  using A = acc_t<In>;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if constexpr (L == Layout::Strided) {
    for (int64_t i = tid; i < n; i += stride) {
      int64_t off[2];
      calc.get(uint32_t(i), off);
      y[off[0]] = cvt<Out>(f(cvt<A>(x[off[1]])));
    }
  } else {
    const int64_t nv = n / VEC;
    for (int64_t i = tid; i < nv; i += stride) {
      const Vec<In, VEC> a = reinterpret_cast<const Vec<In, VEC>*>(x)[i];
      Vec<Out, VEC> r;
#pragma unroll
      for (int k = 0; k < VEC; ++k) r.v[k] = cvt<Out>(f(cvt<A>(a.v[k])));
      reinterpret_cast<Vec<Out, VEC>*>(y)[i] = r;
    }
    for (int64_t i = nv * VEC + tid; i < n; i += stride) y[i] = cvt<Out>(f(cvt<A>(x[i])));
  }
}

template <typename In, typename Out, Layout L, int VEC>
__global__ void __launch_bounds__(kElemThreads)
    unary_kernel(UOp op, double p0d, double p1d, const In* x, Out* y, int64_t n,
                 OffsetCalc<2> calc) {
  using A = acc_t<In>;
#define RUN(expr) return unary_loop<In, Out, L, VEC>([=](A v) { return expr; }, x, y, n, calc)
  if constexpr (!std::is_same_v<In, Out>) {
    RUN(v == A(0));  // LogicalNot of a non-bool input: the only op with another output type
  } else if constexpr (std::is_floating_point_v<A>) {
    const A p0 = A(p0d), p1 = A(p1d);
    switch (op) {
      case UOp::Neg: RUN(-v);
      case UOp::Exp: RUN(m_exp(v));
      case UOp::Log: RUN(m_log(v));
      case UOp::Sqrt: RUN(m_sqrt(v));
      case UOp::Rsqrt: RUN(A(1) / m_sqrt(v));
      case UOp::Abs: RUN(m_fabs(v));
      case UOp::Tanh: RUN(m_tanh(v));
      case UOp::Sigmoid: RUN(common::sigmoid<CudaMath>(v));
      case UOp::Relu: RUN(common::relu(v));
      case UOp::GeluErf: RUN(common::gelu_erf<CudaMath>(v));
      case UOp::GeluTanh: RUN(common::gelu_tanh<CudaMath>(v));
      case UOp::Silu: RUN(common::silu<CudaMath>(v));
      case UOp::Sin: RUN(m_sin(v));
      case UOp::Cos: RUN(m_cos(v));
      case UOp::Sign: RUN(common::sign(v));
      case UOp::Reciprocal: RUN(A(1) / v);
      case UOp::Square: RUN(v * v);
      case UOp::Log1p: RUN(m_log1p(v));
      case UOp::Expm1: RUN(m_expm1(v));
      case UOp::Erf: RUN(m_erf(v));
      case UOp::PowScalar:
        if (p0 == A(2)) RUN(v * v);
        RUN(m_pow(v, p0));
      case UOp::Clamp: RUN(common::clamp(v, p0, p1));
      case UOp::AddScalar: RUN(v + p0);
      case UOp::MulScalar: RUN(v * p0);
      case UOp::RSubScalar: RUN(p0 - v);
      case UOp::RDivScalar: RUN(p0 / v);
      default: return;  // LogicalNot has a bool output (other instantiation); host rejects the rest
    }
  } else {
    // Integer and bool: the ops the CPU keeps integral (host checks the op first).
    switch (op) {
      case UOp::Neg: RUN(A(-v));
      case UOp::Abs:
        if constexpr (std::is_unsigned_v<A> || std::is_same_v<A, bool>) {
          RUN(v);
        } else {
          RUN(v < 0 ? A(-v) : v);
        }
      case UOp::Sign:
        if constexpr (std::is_unsigned_v<A> || std::is_same_v<A, bool>) {
          RUN(A(v > A(0)));
        } else {
          RUN(common::sign(v));
        }
      case UOp::Square: RUN(A(v * v));
      case UOp::Relu: RUN(common::relu(v));
      case UOp::LogicalNot: RUN(A(v == A(0)));
      case UOp::Clamp: RUN(A(common::clamp(double(v), p0d, p1d)));
      case UOp::AddScalar: RUN(A(double(v) + p0d));
      case UOp::MulScalar: RUN(A(double(v) * p0d));
      case UOp::RSubScalar: RUN(A(p0d - double(v)));
      case UOp::PowScalar: {
        const int64_t e = int64_t(p0d);
        return unary_loop<In, Out, L, VEC>(
            [=](A v) {
              A r = A(1);
              for (int64_t i = 0; i < e; ++i) r = A(r * v);
              return r;
            },
            x, y, n, calc);
      }
      default: return;
    }
  }
#undef RUN
}

template <typename In, typename Out>
void launch_typed(UOp op, double p0, double p1, Layout layout, int vec, const void* in, void* out,
                  int64_t n, const OffsetCalc<2>& calc, int max_blocks, cudaStream_t s) {
  constexpr int kVec = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
  const In* x = static_cast<const In*>(in);
  Out* y = static_cast<Out*>(out);
  if (layout == Layout::Strided) {
    unary_kernel<In, Out, Layout::Strided, 1>
        <<<grid_for(n, kElemThreads, max_blocks), kElemThreads, 0, s>>>(op, p0, p1, x, y, n, calc);
  } else if (vec == kVec) {
    unary_kernel<In, Out, Layout::Contiguous, kVec>
        <<<grid_for(n / kVec + 1, kElemThreads, max_blocks), kElemThreads, 0, s>>>(op, p0, p1, x, y,
                                                                                   n, calc);
  } else {
    unary_kernel<In, Out, Layout::Contiguous, 1>
        <<<grid_for(n, kElemThreads, max_blocks), kElemThreads, 0, s>>>(op, p0, p1, x, y, n, calc);
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_unary(UOp op, double p0, double p1, Code in_t, Code out_t, Layout layout, int vec,
                  const void* in, void* out, int64_t n, const OffsetCalc<2>& calc, int max_blocks,
                  cudaStream_t stream) {
  dispatch_code(in_t, [&]<typename T>() {
    if (out_t == Code::Bool && !std::is_same_v<T, bool>) {
      launch_typed<T, bool>(op, p0, p1, layout, vec, in, out, n, calc, max_blocks, stream);
    } else {
      launch_typed<T, T>(op, p0, p1, layout, vec, in, out, n, calc, max_blocks, stream);
    }
  });
}

}  // namespace accel::cuda
