// CPU layer_norm / rms_norm forward and backward over contiguous rows x: (M, n).
//
// Forward: one row per task, two passes over the row (mean, then centred variance: stable for
// rows with a large mean), a third writes y. The backward recomputes xhat from the saved
// mean/rstd. dweight/dbias are column sums over all rows; Note [norm partial sums]: rows are cut
// into fixed blocks of kRowsPerBlock, each block sums into its own scratch row, and the blocks
// are added in order at the end -- no atomics, and the result does not depend on the thread count.
//
// Note [mixed-dtype norms]: a bfloat16 / float16 x may come with float32 weight and bias (autocast
// keeps 16-bit activations 16-bit through the norms while the parameters stay float32, as
// PyTorch's CPU kernels do): T is x's (and y's, grad's, dx's) dtype, P the parameters' (and
// dweight's, dbias's); the arithmetic is float32 either way, so y is the float32 result rounded
// once to T, and dweight / dbias are the float32 column sums without a 16-bit rounding.
#include <cmath>
#include <type_traits>

#include "core/raw.h"
#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/nn_norm.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

constexpr int64_t kRowsPerBlock = 32;

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

template <typename T, typename P, bool kRms>
void norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n, double eps,
                  Tensor& y, Tensor* mean, Tensor& rstd) {
  using A = acc_t<T>;
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
  const P* wp = ptr_or_null<P>(weight);
  const P* bp = kRms ? nullptr : ptr_or_null<P>(bias);
  A* mp = mean ? mean->data<A>() : nullptr;
  A* rp = rstd.data<A>();
  const A inv_n = A(1) / A(n);
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) {
                   const T* xr = xp + r * n;
                   T* yr = yp + r * n;
                   A mu = A(0);
                   if constexpr (!kRms) mu = row_sum(xr, n) * inv_n;
                   const A ss = row_sum_sq_dev(xr, n, mu);
                   const A rs = A(1) / std::sqrt(ss * inv_n + A(eps));
                   if (mp) mp[r] = mu;
                   rp[r] = rs;
                   if (wp && bp) {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i)
                       yr[i] =
                           cast<T>((cast<A>(xr[i]) - mu) * rs * cast<A>(wp[i]) + cast<A>(bp[i]));
                   } else if (wp) {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i)
                       yr[i] = cast<T>((cast<A>(xr[i]) - mu) * rs * cast<A>(wp[i]));
                   } else if (bp) {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i)
                       yr[i] = cast<T>((cast<A>(xr[i]) - mu) * rs + cast<A>(bp[i]));
                   } else {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i) yr[i] = cast<T>((cast<A>(xr[i]) - mu) * rs);
                   }
                 }
               });
}

// One row of dx; kW: weight present (kept a template flag so both loops vectorise).
template <typename T, typename P, bool kRms, bool kW>
inline void norm_dx_row(const T* gr, const T* xr, const P* wp, acc_t<T> mu, acc_t<T> rs,
                        acc_t<T> inv_n, int64_t n, T* dr) {
  using A = acc_t<T>;
  // Both sums in one pass, lane by lane (Note [lane sums] in softmax_rows.h).
  A a1[kLanes<A>] = {}, a2[kLanes<A>] = {};
  const auto dxhat = [&](int64_t i) __attribute__((always_inline)) {
    return kW ? cast<A>(gr[i]) * cast<A>(wp[i]) : cast<A>(gr[i]);
  };
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>) {
#pragma omp simd
    for (int j = 0; j < kLanes<A>; ++j) {
      const A dxh = dxhat(i + j);
      a1[j] += dxh;
      a2[j] += dxh * ((cast<A>(xr[i + j]) - mu) * rs);
    }
  }
  A t1 = A(0), t2 = A(0);
  for (; i < n; ++i) {
    const A dxh = dxhat(i);
    t1 += dxh;
    t2 += dxh * ((cast<A>(xr[i]) - mu) * rs);
  }
  const A s1 = lane_tree(a1) + t1, s2 = lane_tree(a2) + t2;
  const A c1 = kRms ? A(0) : s1 * inv_n, c2 = s2 * inv_n;
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const A dxh = kW ? cast<A>(gr[k]) * cast<A>(wp[k]) : cast<A>(gr[k]);
    const A xh = (cast<A>(xr[k]) - mu) * rs;
    dr[k] = cast<T>(rs * (dxh - c1 - xh * c2));
  }
}

// dxhat = grad * weight; xhat = (x - mean) * rstd
//   layer_norm: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   rms_norm:   dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
//   dweight = sum_rows grad * xhat, dbias = sum_rows grad
template <typename T, typename P, bool kRms>
void norm_backward(const Tensor& grad, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                   const Tensor& weight, int64_t n, Tensor& dx, Tensor& dweight, Tensor* dbias) {
  using A = acc_t<T>;
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const T* gp = static_cast<const T*>(grad.data_ptr());
  const T* xp = static_cast<const T*>(x.data_ptr());
  const P* wp = ptr_or_null<P>(weight);
  const A* mp = mean ? mean->data<A>() : nullptr;
  const A* rp = rstd.data<A>();
  T* dxp = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
  const bool want_dw = dweight.defined();
  const bool want_db = dbias && dbias->defined();
  const int64_t nblocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // Per block: [dweight partial (n), dbias partial (n)].
  Tensor scratch;
  A* sp = nullptr;
  if ((want_dw || want_db) && nblocks > 0) {
    scratch = zeros({nblocks, 2, n}, TensorOptions(dtype_of<A>::value, kCPU));
    sp = scratch.data<A>();
  }
  const A inv_n = A(1) / A(n);
  const int64_t block_work = kRowsPerBlock * std::max<int64_t>(n, 1);
  parallel_for(nblocks, std::max<int64_t>(1, kParallelGrain / block_work),
               [&](int64_t b, int64_t e) {
                 for (int64_t blk = b; blk < e; ++blk) {
                   A* pdw = sp ? sp + blk * 2 * n : nullptr;
                   A* pdb = sp ? pdw + n : nullptr;
                   const int64_t r_end = std::min(rows, (blk + 1) * kRowsPerBlock);
                   for (int64_t r = blk * kRowsPerBlock; r < r_end; ++r) {
                     const T* gr = gp + r * n;
                     const T* xr = xp + r * n;
                     const A mu = mp ? mp[r] : A(0);
                     const A rs = rp[r];
                     if (dxp) {
                       if (wp) {
                         norm_dx_row<T, P, kRms, true>(gr, xr, wp, mu, rs, inv_n, n, dxp + r * n);
                       } else {
                         norm_dx_row<T, P, kRms, false>(gr, xr, wp, mu, rs, inv_n, n, dxp + r * n);
                       }
                     }
                     if (want_dw) {
#pragma omp simd
                       for (int64_t i = 0; i < n; ++i)
                         pdw[i] += cast<A>(gr[i]) * ((cast<A>(xr[i]) - mu) * rs);
                     }
                     if (want_db) {
#pragma omp simd
                       for (int64_t i = 0; i < n; ++i) pdb[i] += cast<A>(gr[i]);
                     }
                   }
                 }
               });
  auto finish = [&](Tensor& out, int64_t part) {
    P* op = static_cast<P*>(out.data_ptr());
    parallel_for(n, kParallelGrain / std::max<int64_t>(nblocks, 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        A s = A(0);
        for (int64_t blk = 0; blk < nblocks; ++blk) s += sp[(blk * 2 + part) * n + i];
        op[i] = cast<P>(s);
      }
    });
  };
  if (want_dw) {
    if (sp)
      finish(dweight, 0);
    else
      raw::fill_(dweight, 0);
  }
  if constexpr (!kRms) {
    if (want_db) {
      if (sp)
        finish(*dbias, 1);
      else
        raw::fill_(*dbias, 0);
    }
  }
}

// Whether any parameter tensor has another dtype than x (Note [mixed-dtype norms]): then x is
// 16-bit and they are float32 (the op checks it).
bool mixed_params(const Tensor& x, std::initializer_list<const Tensor*> params) {
  for (const Tensor* p : params)
    if (p->defined() && p->dtype() != x.dtype()) {
      ACCEL_INTERNAL_ASSERT(p->dtype() == kFloat32 &&
                            (x.dtype() == kBFloat16 || x.dtype() == kFloat16));
      return true;
    }
  return false;
}

// Runs f.template operator()<T, P>() for x's dtype T and the parameters' dtype P (T or float).
template <typename F>
void dispatch_norm(const Tensor& x, bool mixed, const char* op, F&& f) {
  ACCEL_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      if (mixed) return f.template operator()<T, float>();
    }
    f.template operator()<T, T>();
  });
}

void layer_norm_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                       double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  dispatch_norm(x, mixed_params(x, {&weight, &bias}), "layer_norm", [&]<typename T, typename P>() {
    norm_forward<T, P, false>(x, weight, bias, n, eps, y, &mean, rstd);
  });
}

void layer_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& weight, int64_t n, Tensor& dx,
                                Tensor& dweight, Tensor& dbias) {
  dispatch_norm(x, mixed_params(x, {&weight, &dweight, &dbias}), "layer_norm_backward",
                [&]<typename T, typename P>() {
                  norm_backward<T, P, false>(grad, x, &mean, rstd, weight, n, dx, dweight, &dbias);
                });
}

void rms_norm_kernel(const Tensor& x, const Tensor& weight, int64_t n, double eps, Tensor& y,
                     Tensor& rstd) {
  dispatch_norm(x, mixed_params(x, {&weight}), "rms_norm", [&]<typename T, typename P>() {
    norm_forward<T, P, true>(x, weight, Tensor(), n, eps, y, nullptr, rstd);
  });
}

void rms_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                              const Tensor& weight, int64_t n, Tensor& dx, Tensor& dweight) {
  dispatch_norm(
      x, mixed_params(x, {&weight, &dweight}), "rms_norm_backward", [&]<typename T, typename P>() {
        norm_backward<T, P, true>(grad, x, nullptr, rstd, weight, n, dx, dweight, nullptr);
      });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(layer_norm_stub, CPU, ACCEL_ISA_DISPATCH(layer_norm_kernel));
ACCEL_REGISTER_KERNEL(layer_norm_backward_stub, CPU,
                      ACCEL_ISA_DISPATCH(layer_norm_backward_kernel));
ACCEL_REGISTER_KERNEL(rms_norm_stub, CPU, ACCEL_ISA_DISPATCH(rms_norm_kernel));
ACCEL_REGISTER_KERNEL(rms_norm_backward_stub, CPU, ACCEL_ISA_DISPATCH(rms_norm_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
