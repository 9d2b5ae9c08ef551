// CUDA softmax / log_softmax, layer_norm / rms_norm and classification losses, forward and
// backward (semantics: kernels/cpu/nn_softmax.cc, nn_norm.cc, nn_loss.cc). Rows of the last dim run
// one block per row; the row is re-read from L1/L2 for each pass instead of staged in shared
// memory.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// Threads per row block: enough to keep 50k-class rows (GPT-2 logits) short per thread.
constexpr int kRowBlock = 256;
constexpr int kWideRowBlock = 512;
constexpr int64_t kWideRow = 8192;

int row_threads(int64_t n) { return n >= kWideRow ? kWideRowBlock : kRowBlock; }

// A = float for 16-bit and f32, double for f64 (the CPU's acc_t).
template <typename T>
using A_t = acc_t<T>;

// ---------------- softmax ----------------

template <typename T>
__global__ void softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                    bool log) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const T* xr = x + int64_t(blockIdx.x) * n;
  T* yr = y + int64_t(blockIdx.x) * n;
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A v = cvt<A>(xr[i]);
    m = v > m ? v : m;
  }
  m = block_max(m, smem);
  A s = A(0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += m_exp(cvt<A>(xr[i]) - m);
  s = block_sum(s, smem);
  if (log) {
    const A lse = m + m_log(s);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = cvt<T>(cvt<A>(xr[i]) - lse);
  } else {
    const A inv = A(1) / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      yr[i] = cvt<T>(m_exp(cvt<A>(xr[i]) - m) * inv);
  }
}

// inner > 1: one thread per (outer, column), walking the n entries `inner` apart (coalesced
// across the threads of a warp).
template <typename T>
__global__ void softmax_cols_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                    int64_t n, int64_t inner, bool log) {
  using A = A_t<T>;
  const int64_t total = outer * inner, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t o = t / inner, j = t % inner;
    const T* xc = x + o * n * inner + j;
    T* yc = y + o * n * inner + j;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t k = 0; k < n; ++k) {
      const A v = cvt<A>(xc[k * inner]);
      m = v > m ? v : m;
    }
    A s = A(0);
    for (int64_t k = 0; k < n; ++k) s += m_exp(cvt<A>(xc[k * inner]) - m);
    if (log) {
      const A lse = m + m_log(s);
      for (int64_t k = 0; k < n; ++k) yc[k * inner] = cvt<T>(cvt<A>(xc[k * inner]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t k = 0; k < n; ++k)
        yc[k * inner] = cvt<T>(m_exp(cvt<A>(xc[k * inner]) - m) * inv);
    }
  }
}

template <typename T>
__global__ void softmax_backward_rows_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                             T* __restrict__ dx, int64_t n, bool log) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t off = int64_t(blockIdx.x) * n;
  A acc = A(0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    acc += log ? cvt<A>(g[off + i]) : cvt<A>(g[off + i]) * cvt<A>(y[off + i]);
  }
  acc = block_sum(acc, smem);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A gv = cvt<A>(g[off + i]), yv = cvt<A>(y[off + i]);
    dx[off + i] = cvt<T>(log ? gv - m_exp(yv) * acc : yv * (gv - acc));
  }
}

template <typename T>
__global__ void softmax_backward_cols_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                             T* __restrict__ dx, int64_t outer, int64_t n,
                                             int64_t inner, bool log) {
  using A = A_t<T>;
  const int64_t total = outer * inner, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t base = (t / inner) * n * inner + t % inner;
    A acc = A(0);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      acc += log ? cvt<A>(g[i]) : cvt<A>(g[i]) * cvt<A>(y[i]);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      const A gv = cvt<A>(g[i]), yv = cvt<A>(y[i]);
      dx[i] = cvt<T>(log ? gv - m_exp(yv) * acc : yv * (gv - acc));
    }
  }
}

template <typename F>
void dispatch_float(Code t, F&& f) {
  switch (t) {
    case Code::F32: f.template operator()<float>(); return;
    case Code::F64: f.template operator()<double>(); return;
    case Code::F16: f.template operator()<half_t>(); return;
    case Code::BF16: f.template operator()<bf16_t>(); return;
    default: return;  // the host checked the dtype
  }
}

// ---------------- layer_norm / rms_norm ----------------

template <typename T, bool kRms>
__global__ void norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                    const T* __restrict__ b, int64_t n, A_t<T> eps,
                                    T* __restrict__ y, A_t<T>* __restrict__ mean,
                                    A_t<T>* __restrict__ rstd) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  T* yr = y + r * n;
  A mu = A(0);
  if constexpr (!kRms) {
    A s = A(0);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += cvt<A>(xr[i]);
    mu = block_sum(s, smem) / A(n);
  }
  A ss = A(0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A d = cvt<A>(xr[i]) - mu;
    ss += d * d;
  }
  ss = block_sum(ss, smem);
  const A rs = A(1) / m_sqrt(ss / A(n) + eps);
  if (threadIdx.x == 0) {
    if (mean) mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = (cvt<A>(xr[i]) - mu) * rs;
    if (w) v *= cvt<A>(w[i]);
    if (b) v += cvt<A>(b[i]);
    yr[i] = cvt<T>(v);
  }
}

// dxhat = grad * weight; xhat = (x - mean) * rstd
//   layer_norm: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)); rms: no mean(dxhat)
template <typename T, bool kRms>
__global__ void norm_backward_dx_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                        const A_t<T>* __restrict__ mean,
                                        const A_t<T>* __restrict__ rstd, const T* __restrict__ w,
                                        int64_t n, T* __restrict__ dx) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t r = blockIdx.x, off = r * n;
  const A mu = kRms ? A(0) : mean[r], rs = rstd[r];
  A s1 = A(0), s2 = A(0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A dxh = w ? cvt<A>(g[off + i]) * cvt<A>(w[i]) : cvt<A>(g[off + i]);
    s1 += dxh;
    s2 += dxh * ((cvt<A>(x[off + i]) - mu) * rs);
  }
  if constexpr (!kRms) s1 = block_sum(s1, smem);
  s2 = block_sum(s2, smem);
  const A c1 = kRms ? A(0) : s1 / A(n), c2 = s2 / A(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A dxh = w ? cvt<A>(g[off + i]) * cvt<A>(w[i]) : cvt<A>(g[off + i]);
    const A xh = (cvt<A>(x[off + i]) - mu) * rs;
    dx[off + i] = cvt<T>(rs * (dxh - c1 - xh * c2));
  }
}

constexpr int kColX = 32, kColY = 8;

// Block (32, 8) over 32 columns; grid (columns / 32, splits): each split sums its share of rows
// into partial[split, 0 | 1, c] (no atomics: the sum order is fixed, Note [norm partial sums]).
template <typename T>
__global__ void norm_params_partial_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                           const A_t<T>* __restrict__ mean,
                                           const A_t<T>* __restrict__ rstd, int64_t rows, int64_t n,
                                           int64_t chunk, A_t<T>* __restrict__ partial) {
  using A = A_t<T>;
  __shared__ A sdw[kColY][kColX + 1], sdb[kColY][kColX + 1];
  const int64_t c = int64_t(blockIdx.x) * kColX + threadIdx.x;
  const int64_t split = blockIdx.y;
  A dw = A(0), db = A(0);
  if (c < n) {
    const int64_t end = min(rows, (split + 1) * chunk);
    for (int64_t r = split * chunk + threadIdx.y; r < end; r += kColY) {
      const A gv = cvt<A>(g[r * n + c]);
      const A mu = mean ? mean[r] : A(0);
      dw += gv * ((cvt<A>(x[r * n + c]) - mu) * rstd[r]);
      db += gv;
    }
  }
  sdw[threadIdx.y][threadIdx.x] = dw;
  sdb[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    for (int k = 1; k < kColY; ++k) {
      dw += sdw[k][threadIdx.x];
      db += sdb[k][threadIdx.x];
    }
    partial[(split * 2) * n + c] = dw;
    partial[(split * 2 + 1) * n + c] = db;
  }
}

template <typename T>
__global__ void norm_params_finish_kernel(const A_t<T>* __restrict__ partial, int64_t splits,
                                          int64_t n, T* __restrict__ dw, T* __restrict__ db) {
  using A = A_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  A sw = A(0), sb = A(0);
  for (int64_t s = 0; s < splits; ++s) {
    sw += partial[(s * 2) * n + c];
    sb += partial[(s * 2 + 1) * n + c];
  }
  if (dw) dw[c] = cvt<T>(sw);
  if (db) db[c] = cvt<T>(sb);
}

// ---------------- losses ----------------

template <typename T, typename I>
__global__ void cross_entropy_kernel(const T* __restrict__ logits, const I* __restrict__ target,
                                     int64_t classes, int64_t ignore, A_t<T> ls,
                                     T* __restrict__ loss, A_t<T>* __restrict__ lse) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t r = blockIdx.x;
  const T* xr = logits + r * classes;
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const A v = cvt<A>(xr[c]);
    m = v > m ? v : m;
  }
  m = block_max(m, smem);
  A s = A(0), sx = A(0);
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const A v = cvt<A>(xr[c]);
    s += m_exp(v - m);
    sx += v;
  }
  s = block_sum(s, smem);
  if (ls != A(0)) sx = block_sum(sx, smem);
  if (threadIdx.x != 0) return;
  const A l = m + m_log(s);
  lse[r] = l;
  const int64_t t = int64_t(target[r]);
  if (t == ignore || t < 0 || t >= classes) {  // out of range was reported by the index check
    loss[r] = cvt<T>(A(0));
    return;
  }
  A v = l - cvt<A>(xr[t]);
  if (ls != A(0)) v = (A(1) - ls) * v + ls * (l - sx / A(classes));
  loss[r] = cvt<T>(v);
}

template <typename T, typename I>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ grad, bool per_row,
                                              const T* __restrict__ logits,
                                              const I* __restrict__ target,
                                              const A_t<T>* __restrict__ lse, int64_t classes,
                                              int64_t ignore, A_t<T> ls, T* __restrict__ dlogits) {
  using A = A_t<T>;
  const int64_t r = blockIdx.x;
  T* dr = dlogits + r * classes;
  const int64_t t = int64_t(target[r]);
  if (t == ignore || t < 0 || t >= classes) {
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) dr[c] = cvt<T>(A(0));
    return;
  }
  const T* xr = logits + r * classes;
  const A g = cvt<A>(grad[per_row ? r : 0]);
  const A l = lse[r], smooth = ls / A(classes);
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const A onehot = c == t ? A(1) - ls : A(0);
    dr[c] = cvt<T>(g * (m_exp(cvt<A>(xr[c]) - l) - smooth - onehot));
  }
}

// weight: null (every class weighs 1) or (C).
template <typename T, typename I>
__global__ void nll_loss_kernel(const T* __restrict__ lp, const I* __restrict__ target,
                                const T* __restrict__ weight, int64_t rows, int64_t classes,
                                int64_t ignore, T* __restrict__ loss) {
  using A = A_t<T>;
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t t = int64_t(target[r]);
  if (t == ignore || t < 0 || t >= classes) {
    loss[r] = cvt<T>(A(0));
    return;
  }
  const A w = weight ? cvt<A>(weight[t]) : A(1);
  loss[r] = cvt<T>(-w * cvt<A>(lp[r * classes + t]));
}

// One block: out[0] = sum of weight[target[r]] over the rows not ignored.
template <typename T, typename I>
__global__ void nll_weight_sum_kernel(const I* __restrict__ target, const T* __restrict__ weight,
                                      int64_t rows, int64_t classes, int64_t ignore,
                                      T* __restrict__ out) {
  using A = A_t<T>;
  __shared__ A smem[32];
  A s = A(0);
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = int64_t(target[r]);
    if (t != ignore && t >= 0 && t < classes) s += cvt<A>(weight[t]);
  }
  s = block_sum(s, smem);
  if (threadIdx.x == 0) out[0] = cvt<T>(s);
}

template <typename T, typename I>
__global__ void nll_loss_backward_kernel(const T* __restrict__ grad, bool per_row,
                                         const I* __restrict__ target, const T* __restrict__ weight,
                                         int64_t rows, int64_t classes, int64_t ignore,
                                         T* __restrict__ dlp) {
  using A = A_t<T>;
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t t = int64_t(target[r]);
  if (t == ignore || t < 0 || t >= classes) return;
  const A w = weight ? cvt<A>(weight[t]) : A(1);
  dlp[r * classes + t] = cvt<T>(-w * cvt<A>(grad[per_row ? r : 0]));
}

// ---------------- attention softmax ----------------

template <typename T>
__global__ void sdpa_softmax_kernel(T* __restrict__ p, int64_t T_, int64_t S, A_t<T> scale,
                                    bool causal, SdpaMaskArgs mk, T* __restrict__ lse) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % T_;
  const int64_t len = causal ? min(S, i + 1) : S;
  T* pr = p + row * S;
  const T* mr = nullptr;
  if (mk.mask != nullptr) {
    const int64_t bh = row / T_;
    mr = static_cast<const T*>(mk.mask) + (bh / mk.H) * mk.sb + (bh % mk.H) * mk.sh + i * mk.si;
  }
  // The scaled, masked score, in the math type.
  auto score = [&](int64_t j) {
    const A v = scale * cvt<A>(pr[j]);
    return mr ? v + cvt<A>(mr[j * mk.sj]) : v;
  };
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const A v = score(j);
    m = v > m ? v : m;
  }
  m = block_max(m, smem);
  A s = A(0);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += m_exp(score(j) - m);
  s = block_sum(s, smem);
  const A inv = A(1) / s;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
    pr[j] = j < len ? cvt<T>(m_exp(score(j) - m) * inv) : cvt<T>(A(0));
  }
  if (lse != nullptr && threadIdx.x == 0) lse[row] = cvt<T>(m + m_log(s));
}

template <typename T>
__global__ void sdpa_softmax_backward_kernel(T* __restrict__ dp, const T* __restrict__ p, int64_t S,
                                             A_t<T> scale) {
  using A = A_t<T>;
  __shared__ A smem[32];
  const int64_t off = int64_t(blockIdx.x) * S;
  A dot = A(0);
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    dot += cvt<A>(dp[off + j]) * cvt<A>(p[off + j]);
  dot = block_sum(dot, smem);
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
    const A pv = cvt<A>(p[off + j]);
    dp[off + j] = cvt<T>(scale * pv * (cvt<A>(dp[off + j]) - dot));
  }
}

// ---------------- 2-D pooling ----------------

template <typename T>
__device__ __forceinline__ void atomic_add_float(T* p, T v) {
  atomicAdd(p, v);  // float, double, __half (sm_70+), __nv_bfloat16 (sm_80+)
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    pool_forward_kernel(bool is_max, PoolArgs a, const T* __restrict__ x, T* __restrict__ y,
                        int32_t* __restrict__ idx) {
  using A = A_t<T>;
  const int64_t total = a.planes * a.ho * a.wo, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % a.wo, oh = (o / a.wo) % a.ho, pl = o / (a.wo * a.ho);
    const T* xp = x + pl * a.h * a.w;
    const int64_t h0 = oh * a.sh - a.ph, w0 = ow * a.sw - a.pw;
    const int64_t hb = max(h0, int64_t(0)), he = min(h0 + a.kh, a.h);
    const int64_t wb = max(w0, int64_t(0)), we = min(w0 + a.kw, a.w);
    if (is_max) {
      A best = -std::numeric_limits<A>::infinity();
      int64_t bi = -1;
      for (int64_t ih = hb; ih < he; ++ih) {
        for (int64_t iw = wb; iw < we; ++iw) {
          const A v = cvt<A>(xp[ih * a.w + iw]);  // NaN wins and then stays, as on the CPU
          if (bi < 0 || (!m_isnan(best) && (v > best || m_isnan(v)))) {
            best = v;
            bi = ih * a.w + iw;
          }
        }
      }
      y[o] = cvt<T>(best);
      if (idx) idx[o] = int32_t(bi);
    } else {
      A s = A(0);
      for (int64_t ih = hb; ih < he; ++ih)
        for (int64_t iw = wb; iw < we; ++iw) s += cvt<A>(xp[ih * a.w + iw]);
      const int64_t count = a.count_include_pad ? a.kh * a.kw : (he - hb) * (we - wb);
      y[o] = cvt<T>(s / A(count));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kElemThreads)
    pool_backward_kernel(bool is_max, PoolArgs a, const T* __restrict__ gy,
                         const int32_t* __restrict__ idx, T* __restrict__ gx) {
  using A = A_t<T>;
  const int64_t total = a.planes * a.ho * a.wo, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t pl = o / (a.wo * a.ho);
    T* gxp = gx + pl * a.h * a.w;
    if (is_max) {
      if (idx[o] >= 0) atomic_add_float(gxp + idx[o], gy[o]);
      continue;
    }
    const int64_t ow = o % a.wo, oh = (o / a.wo) % a.ho;
    const int64_t h0 = oh * a.sh - a.ph, w0 = ow * a.sw - a.pw;
    const int64_t hb = max(h0, int64_t(0)), he = min(h0 + a.kh, a.h);
    const int64_t wb = max(w0, int64_t(0)), we = min(w0 + a.kw, a.w);
    const int64_t count = a.count_include_pad ? a.kh * a.kw : (he - hb) * (we - wb);
    const T v = cvt<T>(cvt<A>(gy[o]) / A(count));
    for (int64_t ih = hb; ih < he; ++ih)
      for (int64_t iw = wb; iw < we; ++iw) atomic_add_float(gxp + ih * a.w + iw, v);
  }
}

}  // namespace

void launch_sdpa_softmax(Code t, void* p, int64_t rows, int64_t T, int64_t S, double scale,
                         bool causal, const SdpaMaskArgs& mask, void* lse, cudaStream_t stream) {
  dispatch_float(t, [&]<typename U>() {
    sdpa_softmax_kernel<U><<<unsigned(rows), row_threads(S), 0, stream>>>(
        static_cast<U*>(p), T, S, A_t<U>(scale), causal, mask, static_cast<U*>(lse));
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_sdpa_softmax_backward(Code t, void* dp, const void* p, int64_t rows, int64_t S,
                                  double scale, cudaStream_t stream) {
  dispatch_float(t, [&]<typename U>() {
    sdpa_softmax_backward_kernel<U><<<unsigned(rows), row_threads(S), 0, stream>>>(
        static_cast<U*>(dp), static_cast<const U*>(p), S, A_t<U>(scale));
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_pool_forward(Code t, bool max, const PoolArgs& a, const void* x, void* y, int32_t* idx,
                         int max_blocks, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    pool_forward_kernel<T>
        <<<grid_for(a.planes * a.ho * a.wo, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
            max, a, static_cast<const T*>(x), static_cast<T*>(y), idx);
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_pool_backward(Code t, bool max, const PoolArgs& a, const void* gy, const int32_t* idx,
                          void* gx, int max_blocks, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    pool_backward_kernel<T>
        <<<grid_for(a.planes * a.ho * a.wo, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
            max, a, static_cast<const T*>(gy), idx, static_cast<T*>(gx));
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_softmax(Code t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                    bool log, int max_blocks, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    if (inner == 1) {
      softmax_rows_kernel<T><<<unsigned(outer), row_threads(n), 0, stream>>>(xp, yp, n, log);
    } else {
      softmax_cols_kernel<T>
          <<<grid_for(outer * inner, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
              xp, yp, outer, n, inner, log);
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_softmax_backward(Code t, const void* grad, const void* y, void* dx, int64_t outer,
                             int64_t n, int64_t inner, bool log, int max_blocks,
                             cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    const T* gp = static_cast<const T*>(grad);
    const T* yp = static_cast<const T*>(y);
    T* dp = static_cast<T*>(dx);
    if (inner == 1) {
      softmax_backward_rows_kernel<T>
          <<<unsigned(outer), row_threads(n), 0, stream>>>(gp, yp, dp, n, log);
    } else {
      softmax_backward_cols_kernel<T>
          <<<grid_for(outer * inner, kElemThreads, max_blocks), kElemThreads, 0, stream>>>(
              gp, yp, dp, outer, n, inner, log);
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_norm_forward(Code t, bool rms, const void* x, const void* weight, const void* bias,
                         int64_t rows, int64_t n, double eps, void* y, void* mean, void* rstd,
                         cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    using A = A_t<T>;
    auto args = [&](auto kernel) {
      kernel<<<unsigned(rows), row_threads(n), 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), n,
          A(eps), static_cast<T*>(y), static_cast<A*>(mean), static_cast<A*>(rstd));
    };
    if (rms) {
      args(norm_forward_kernel<T, true>);
    } else {
      args(norm_forward_kernel<T, false>);
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_norm_backward_dx(Code t, bool rms, const void* grad, const void* x, const void* mean,
                             const void* rstd, const void* weight, int64_t rows, int64_t n,
                             void* dx, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    using A = A_t<T>;
    auto args = [&](auto kernel) {
      kernel<<<unsigned(rows), row_threads(n), 0, stream>>>(
          static_cast<const T*>(grad), static_cast<const T*>(x), static_cast<const A*>(mean),
          static_cast<const A*>(rstd), static_cast<const T*>(weight), n, static_cast<T*>(dx));
    };
    if (rms) {
      args(norm_backward_dx_kernel<T, true>);
    } else {
      args(norm_backward_dx_kernel<T, false>);
    }
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_norm_backward_params(Code t, const void* grad, const void* x, const void* mean,
                                 const void* rstd, int64_t rows, int64_t n, int64_t splits,
                                 void* partial, void* dweight, void* dbias, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    using A = A_t<T>;
    const int64_t chunk = (rows + splits - 1) / splits;
    const dim3 grid(unsigned((n + kColX - 1) / kColX), unsigned(splits));
    norm_params_partial_kernel<T><<<grid, dim3(kColX, kColY), 0, stream>>>(
        static_cast<const T*>(grad), static_cast<const T*>(x), static_cast<const A*>(mean),
        static_cast<const A*>(rstd), rows, n, chunk, static_cast<A*>(partial));
    norm_params_finish_kernel<T><<<unsigned((n + 255) / 256), 256, 0, stream>>>(
        static_cast<const A*>(partial), splits, n, static_cast<T*>(dweight),
        static_cast<T*>(dbias));
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_cross_entropy(Code t, Code idx_t, const void* logits, const void* target, int64_t rows,
                          int64_t classes, int64_t ignore_index, double label_smoothing, void* loss,
                          void* lse, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    using A = A_t<T>;
    dispatch_index(idx_t, [&]<typename I>() {
      cross_entropy_kernel<T, I><<<unsigned(rows), row_threads(classes), 0, stream>>>(
          static_cast<const T*>(logits), static_cast<const I*>(target), classes, ignore_index,
          A(label_smoothing), static_cast<T*>(loss), static_cast<A*>(lse));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_cross_entropy_backward(Code t, Code idx_t, const void* grad, bool grad_per_row,
                                   const void* logits, const void* target, const void* lse,
                                   int64_t rows, int64_t classes, int64_t ignore_index,
                                   double label_smoothing, void* dlogits, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    using A = A_t<T>;
    dispatch_index(idx_t, [&]<typename I>() {
      cross_entropy_backward_kernel<T, I><<<unsigned(rows), row_threads(classes), 0, stream>>>(
          static_cast<const T*>(grad), grad_per_row, static_cast<const T*>(logits),
          static_cast<const I*>(target), static_cast<const A*>(lse), classes, ignore_index,
          A(label_smoothing), static_cast<T*>(dlogits));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_nll_loss(Code t, Code idx_t, const void* log_probs, const void* target,
                     const void* weight, int64_t rows, int64_t classes, int64_t ignore_index,
                     void* loss, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    dispatch_index(idx_t, [&]<typename I>() {
      nll_loss_kernel<T, I><<<unsigned((rows + 255) / 256), 256, 0, stream>>>(
          static_cast<const T*>(log_probs), static_cast<const I*>(target),
          static_cast<const T*>(weight), rows, classes, ignore_index, static_cast<T*>(loss));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_nll_weight_sum(Code t, Code idx_t, const void* target, const void* weight, int64_t rows,
                           int64_t classes, int64_t ignore_index, void* out, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    dispatch_index(idx_t, [&]<typename I>() {
      nll_weight_sum_kernel<T, I>
          <<<1, 256, 0, stream>>>(static_cast<const I*>(target), static_cast<const T*>(weight),
                                  rows, classes, ignore_index, static_cast<T*>(out));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

void launch_nll_loss_backward(Code t, Code idx_t, const void* grad, bool grad_per_row,
                              const void* target, const void* weight, int64_t rows, int64_t classes,
                              int64_t ignore_index, void* dlog_probs, cudaStream_t stream) {
  dispatch_float(t, [&]<typename T>() {
    dispatch_index(idx_t, [&]<typename I>() {
      nll_loss_backward_kernel<T, I><<<unsigned((rows + 255) / 256), 256, 0, stream>>>(
          static_cast<const T*>(grad), grad_per_row, static_cast<const I*>(target),
          static_cast<const T*>(weight), rows, classes, ignore_index, static_cast<T*>(dlog_probs));
    });
  });
  ACCEL_CUDA_LAUNCH_CHECK();
}

}  // namespace accel::cuda
