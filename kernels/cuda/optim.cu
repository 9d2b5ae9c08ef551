// Fused Adam/AdamW step (update: kernels/common/optim.h, contract: kernels/stubs/optim.h): one pass
// reads param, grad, m, v and writes param, m, v; 16-bit types compute in float.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

template <typename P, typename S>
__global__ void __launch_bounds__(kElemThreads)
    adam_kernel(P* __restrict__ p, const P* __restrict__ g, S* __restrict__ m, S* __restrict__ v,
                int64_t n, AdamScalars sc) {
  using A = std::conditional_t<std::is_same_v<P, double>, double, float>;
  const common::AdamCoeffs<A> c(sc);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    A pi = cvt<A>(p[i]), mi = cvt<A>(m[i]), vi = cvt<A>(v[i]);
    common::adam_update<CudaMath>(pi, cvt<A>(g[i]), mi, vi, c);
    m[i] = cvt<S>(mi);
    v[i] = cvt<S>(vi);
    p[i] = cvt<P>(pi);
  }
}

template <typename P, typename S>
void run(void* p, const void* g, void* m, void* v, int64_t n, const AdamScalars& s, int max_blocks,
         cudaStream_t stream) {
  adam_kernel<P, S><<<grid_for(n, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
      static_cast<P*>(p), static_cast<const P*>(g), static_cast<S*>(m), static_cast<S*>(v), n, s);
}

}  // namespace

void launch_adam(Code param_t, Code state_t, void* p, const void* g, void* m, void* v, int64_t n,
                 const AdamScalars& s, int max_blocks, cudaStream_t stream) {
  const bool f32_state = state_t == Code::F32;
  switch (param_t) {
    case Code::F32: run<float, float>(p, g, m, v, n, s, max_blocks, stream); break;
    case Code::F64: run<double, double>(p, g, m, v, n, s, max_blocks, stream); break;
    case Code::F16:
      f32_state ? run<half_t, float>(p, g, m, v, n, s, max_blocks, stream)
                : run<half_t, half_t>(p, g, m, v, n, s, max_blocks, stream);
      break;
    case Code::BF16:
      f32_state ? run<bf16_t, float>(p, g, m, v, n, s, max_blocks, stream)
                : run<bf16_t, bf16_t>(p, g, m, v, n, s, max_blocks, stream);
      break;
    default: return;
  }
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
