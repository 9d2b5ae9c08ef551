// CUDA binary elementwise kernels with broadcasting, and where() (semantics:
// kernels/cpu/elementwise_binary.cc; gradient formulas: kernels/common/scalar_math.h). One kernel
// per (dtype, output kind, layout), op switch outside the loop.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename In, typename Out, Layout L, int VEC, typename F>
__device__ __forceinline__ void binary_loop(F f, const In* __restrict__ a, const In* __restrict__ b,
                                            Out* __restrict__ y, int64_t n,
                                            const OffsetCalc<3>& calc) {
  using A = acc_t<In>;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if constexpr (L == Layout::Strided) {
    for (int64_t i = tid; i < n; i += stride) {
      int64_t off[3];
      calc.get(uint32_t(i), off);
      y[off[0]] = cvt<Out>(f(cvt<A>(a[off[1]]), cvt<A>(b[off[2]])));
    }
  } else {
    // ScalarB: b is one element, read once per thread.
    const A bs = L == Layout::ScalarB ? cvt<A>(b[0]) : A(0);
    const int64_t nv = n / VEC;
    for (int64_t i = tid; i < nv; i += stride) {
      const Vec<In, VEC> va = reinterpret_cast<const Vec<In, VEC>*>(a)[i];
      Vec<Out, VEC> r;
      if constexpr (L == Layout::ScalarB) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.v[k] = cvt<Out>(f(cvt<A>(va.v[k]), bs));
      } else {
        const Vec<In, VEC> vb = reinterpret_cast<const Vec<In, VEC>*>(b)[i];
#pragma unroll
        for (int k = 0; k < VEC; ++k) r.v[k] = cvt<Out>(f(cvt<A>(va.v[k]), cvt<A>(vb.v[k])));
      }
      reinterpret_cast<Vec<Out, VEC>*>(y)[i] = r;
    }
    for (int64_t i = nv * VEC + tid; i < n; i += stride) {
      y[i] = cvt<Out>(f(cvt<A>(a[i]), L == Layout::ScalarB ? bs : cvt<A>(b[i])));
    }
  }
}

template <typename In, typename Out, Layout L, int VEC>
__global__ void __launch_bounds__(kElemThreads)
    binary_kernel(BOp op, double alpha, const In* a, const In* b, Out* y, int64_t n,
                  OffsetCalc<3> calc) {
  using A = acc_t<In>;
  constexpr bool kFloat = std::is_floating_point_v<A>;
#define RUN(expr) \
  return binary_loop<In, Out, L, VEC>([=](A x, A z) { return expr; }, a, b, y, n, calc)
  if constexpr (std::is_same_v<Out, bool> && !std::is_same_v<In, bool>) {
    switch (op) {  // comparisons and logic
      case BOp::Eq: RUN(x == z);
      case BOp::Ne: RUN(x != z);
      case BOp::Lt: RUN(x < z);
      case BOp::Le: RUN(x <= z);
      case BOp::Gt: RUN(x > z);
      case BOp::Ge: RUN(x >= z);
      case BOp::LogicalAnd: RUN(x != A(0) && z != A(0));
      case BOp::LogicalOr: RUN(x != A(0) || z != A(0));
      default: return;
    }
  } else {
    const A al = A(alpha);
    switch (op) {
      case BOp::Add:
        if (alpha == 1.0) RUN(A(x + z));
        RUN(A(x + al * z));
      case BOp::Sub:
        if (alpha == 1.0) RUN(A(x - z));
        RUN(A(x - al * z));
      case BOp::Mul: RUN(A(x * z));
      case BOp::Maximum: RUN((m_isnan(x) || m_isnan(z)) ? A(x + z) : (x > z ? x : z));
      case BOp::Minimum: RUN((m_isnan(x) || m_isnan(z)) ? A(x + z) : (x < z ? x : z));
      default: break;
    }
    if constexpr (std::is_same_v<In, bool>) {
      switch (op) {  // bool inputs: comparisons write bool too
        case BOp::Eq: RUN(x == z);
        case BOp::Ne: RUN(x != z);
        case BOp::Lt: RUN(x < z);
        case BOp::Le: RUN(x <= z);
        case BOp::Gt: RUN(x > z);
        case BOp::Ge: RUN(x >= z);
        case BOp::LogicalAnd: RUN(x && z);
        case BOp::LogicalOr: RUN(x || z);
        default: return;
      }
    } else if constexpr (kFloat) {
      switch (op) {
        case BOp::Div: RUN(x / z);
        case BOp::Pow: RUN(m_pow(x, z));
        case BOp::ReluGrad: RUN(common::relu_grad(x, z));
        case BOp::GeluErfGrad: RUN(common::gelu_erf_grad<CudaMath>(x, z));
        case BOp::GeluTanhGrad: RUN(common::gelu_tanh_grad<CudaMath>(x, z));
        case BOp::SiluGrad: RUN(common::silu_grad<CudaMath>(x, z));
        case BOp::SigmoidGrad: RUN(common::sigmoid_grad(x, z));
        case BOp::TanhGrad: RUN(common::tanh_grad(x, z));
        default: return;
      }
    }
  }
#undef RUN
}

template <typename In, typename Out>
void launch_typed(BOp op, double alpha, Layout layout, int vec, const void* pa, const void* pb,
                  void* out, int64_t n, const OffsetCalc<3>& calc, int max_blocks, cudaStream_t s) {
  constexpr int kVec = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
  const In* a = static_cast<const In*>(pa);
  const In* b = static_cast<const In*>(pb);
  Out* y = static_cast<Out*>(out);
  const int g1 = grid_for(n, kElemThreads, max_blocks);
  const int gv = grid_for(n / kVec + 1, kElemThreads, max_blocks);
  switch (layout) {
    case Layout::Strided:
      binary_kernel<In, Out, Layout::Strided, 1>
          <<<g1, kElemThreads, 0, s>>>(op, alpha, a, b, y, n, calc);
      break;
    case Layout::Contiguous:
      if (vec == kVec) {
        binary_kernel<In, Out, Layout::Contiguous, kVec>
            <<<gv, kElemThreads, 0, s>>>(op, alpha, a, b, y, n, calc);
      } else {
        binary_kernel<In, Out, Layout::Contiguous, 1>
            <<<g1, kElemThreads, 0, s>>>(op, alpha, a, b, y, n, calc);
      }
      break;
    case Layout::ScalarB:
      if (vec == kVec) {
        binary_kernel<In, Out, Layout::ScalarB, kVec>
            <<<gv, kElemThreads, 0, s>>>(op, alpha, a, b, y, n, calc);
      } else {
        binary_kernel<In, Out, Layout::ScalarB, 1>
            <<<g1, kElemThreads, 0, s>>>(op, alpha, a, b, y, n, calc);
      }
      break;
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    where_kernel(const bool* cond, const T* a, const T* b, T* y, int64_t n, OffsetCalc<4> calc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[4];
    calc.get(uint32_t(i), off);
    y[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

}  // namespace

void launch_binary(BOp op, double alpha, Code in_t, Code out_t, Layout layout, int vec,
                   const void* a, const void* b, void* out, int64_t n, const OffsetCalc<3>& calc,
                   int max_blocks, cudaStream_t stream) {
  dispatch_code(in_t, [&]<typename T>() {
    if (out_t == Code::Bool && !std::is_same_v<T, bool>) {
      launch_typed<T, bool>(op, alpha, layout, vec, a, b, out, n, calc, max_blocks, stream);
    } else {
      launch_typed<T, T>(op, alpha, layout, vec, a, b, out, n, calc, max_blocks, stream);
    }
  });
}

void launch_where(int elem_size, const void* cond, const void* a, const void* b, void* out,
                  int64_t n, const OffsetCalc<4>& calc, int max_blocks, cudaStream_t stream) {
  const int g = grid_for(n, kElemThreads, max_blocks);
  const bool* c = static_cast<const bool*>(cond);
  switch (elem_size) {
#define CASE(sz, T)                                                                            \
  case sz:                                                                                     \
    where_kernel<T><<<g, kElemThreads, 0, stream>>>(                                           \
        c, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, calc); \
    break;
    CASE(1, uint8_t)
    CASE(2, uint16_t)
    CASE(4, uint32_t)
    CASE(8, uint64_t)
#undef CASE
    default: return;
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
