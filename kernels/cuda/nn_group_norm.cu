// CUDA group_norm forward and backward (semantics and formulas: kernels/cpu/nn_group_norm.cc).
// x: (N, C, S) contiguous; the (n, g) block of D = (C / G) S elements is contiguous.
//   forward:  one thread block per (n, g): sum, centred sum of squares, then y.
//   backward: one block per (n, c) for ds = sum_S grad x and db = sum_S grad; one block per (n, g)
//             for dx; one thread per channel sums dweight / dbias over n in order (deterministic).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

constexpr int kGnThreads = 256;

template <typename T>
using A_t = acc_t<T>;

template <typename F>
void dispatch_floating(Code t, F&& f) {
  switch (t) {
    case Code::F32: f.template operator()<float>(); return;
    case Code::F64: f.template operator()<double>(); return;
    case Code::F16: f.template operator()<half_t>(); return;
    case Code::BF16: f.template operator()<bf16_t>(); return;
    default: return;  // the host checked the dtype
  }
}

template <typename T>
__global__ void gn_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ b, int64_t groups, int64_t cg, int64_t s,
                                  A_t<T> eps, T* __restrict__ y, A_t<T>* __restrict__ mean,
                                  A_t<T>* __restrict__ rstd) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t blk = blockIdx.x, d = cg * s;
  const T* xb = x + blk * d;
  T* yb = y + blk * d;
  A sum = A(0);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += cvt<A>(xb[i]);
  const A mu = block_sum(sum, smem) / A(d);
  A ss = A(0);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A dv = cvt<A>(xb[i]) - mu;
    ss += dv * dv;
  }
  ss = block_sum(ss, smem);
  const A rs = A(1) / m_sqrt(ss / A(d) + eps);
  if (threadIdx.x == 0) mean[blk] = mu, rstd[blk] = rs;
  const int64_t c0 = (blk % groups) * cg;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const int64_t c = c0 + i / s;
    const A scale = w ? rs * cvt<A>(w[c]) : rs;
    const A shift = (b ? cvt<A>(b[c]) : A(0)) - mu * scale;
    yb[i] = cvt<T>(cvt<A>(xb[i]) * scale + shift);
  }
}

// sums[(n C + c) 2 + {0, 1}] = {sum_S grad x, sum_S grad}; one block per (n, c).
template <typename T>
__global__ void gn_channel_sums_kernel(const T* __restrict__ g, const T* __restrict__ x, int64_t s,
                                       A_t<T>* __restrict__ sums) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t nc = blockIdx.x;
  const T* gc = g + nc * s;
  const T* xc = x + nc * s;
  A ds = A(0), db = A(0);
  for (int64_t i = threadIdx.x; i < s; i += blockDim.x) {
    const A gv = cvt<A>(gc[i]);
    ds += gv * cvt<A>(xc[i]);
    db += gv;
  }
  ds = block_sum(ds, smem);
  db = block_sum(db, smem);
  if (threadIdx.x == 0) sums[nc * 2] = ds, sums[nc * 2 + 1] = db;
}

template <typename T>
__global__ void gn_backward_dx_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                      const A_t<T>* __restrict__ mean,
                                      const A_t<T>* __restrict__ rstd, const T* __restrict__ w,
                                      const A_t<T>* __restrict__ sums, int64_t groups, int64_t cg,
                                      int64_t s, T* __restrict__ dx) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t blk = blockIdx.x, d = cg * s;
  const int64_t n = blk / groups, c0 = (blk % groups) * cg, c_total = groups * cg;
  const A mu = mean[blk], rs = rstd[blk];
  A sum1 = A(0), sum2 = A(0);
  for (int64_t k = threadIdx.x; k < cg; k += blockDim.x) {
    const A* sc = sums + (n * c_total + c0 + k) * 2;
    const A wv = w ? cvt<A>(w[c0 + k]) : A(1);
    sum1 += wv * sc[1];
    sum2 += wv * rs * (sc[0] - mu * sc[1]);
  }
  sum1 = block_sum(sum1, smem);
  sum2 = block_sum(sum2, smem);
  const A bx = -rs * rs * sum2 / A(d);
  const A cst = mu * rs * rs * sum2 / A(d) - rs * sum1 / A(d);
  const T* gb = g + blk * d;
  const T* xb = x + blk * d;
  T* db = dx + blk * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const int64_t c = c0 + i / s;
    const A a = w ? rs * cvt<A>(w[c]) : rs;
    db[i] = cvt<T>(cvt<A>(gb[i]) * a + cvt<A>(xb[i]) * bx + cst);
  }
}

template <typename T>
__global__ void gn_params_kernel(const A_t<T>* __restrict__ sums, const A_t<T>* __restrict__ mean,
                                 const A_t<T>* __restrict__ rstd, int64_t n, int64_t c_total,
                                 int64_t cg, T* __restrict__ dw, T* __restrict__ dbias) {
  using A = A_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= c_total) return;
  const int64_t groups = c_total / cg, grp = c / cg;
  A sw = A(0), sb = A(0);
  for (int64_t i = 0; i < n; ++i) {
    const A* sc = sums + (i * c_total + c) * 2;
    const int64_t blk = i * groups + grp;
    sw += rstd[blk] * (sc[0] - mean[blk] * sc[1]);
    sb += sc[1];
  }
  if (dw) dw[c] = cvt<T>(sw);
  if (dbias) dbias[c] = cvt<T>(sb);
}

}  // namespace

void launch_group_norm_forward(Code t, const void* x, const void* weight, const void* bias,
                               int64_t n, int64_t c, int64_t s, int64_t groups, double eps, void* y,
                               void* mean, void* rstd, cudaStream_t stream) {
  dispatch_floating(t, [&]<typename T>() {
    using A = A_t<T>;
    gn_forward_kernel<T><<<unsigned(n * groups), kGnThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
        groups, c / groups, s, A(eps), static_cast<T*>(y), static_cast<A*>(mean),
        static_cast<A*>(rstd));
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_group_norm_backward(Code t, const void* grad, const void* x, const void* mean,
                                const void* rstd, const void* weight, int64_t n, int64_t c,
                                int64_t s, int64_t groups, void* sums, void* dx, void* dweight,
                                void* dbias, cudaStream_t stream) {
  dispatch_floating(t, [&]<typename T>() {
    using A = A_t<T>;
    const int64_t cg = c / groups;
    gn_channel_sums_kernel<T><<<unsigned(n * c), kGnThreads, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<const T*>(x), s, static_cast<A*>(sums));
    if (dx) {
      gn_backward_dx_kernel<T><<<unsigned(n * groups), kGnThreads, 0, stream>>>(
          static_cast<const T*>(grad), static_cast<const T*>(x), static_cast<const A*>(mean),
          static_cast<const A*>(rstd), static_cast<const T*>(weight), static_cast<const A*>(sums),
          groups, cg, s, static_cast<T*>(dx));
    }
    if (dweight || dbias) {
      gn_params_kernel<T><<<unsigned((c + 255) / 256), 256, 0, stream>>>(
          static_cast<const A*>(sums), static_cast<const A*>(mean), static_cast<const A*>(rstd), n,
          c, cg, static_cast<T*>(dweight), static_cast<T*>(dbias));
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
