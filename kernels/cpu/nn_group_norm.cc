// CPU group_norm forward and backward (contract: kernels/stubs/nn.h). x: (N, C, S) contiguous;
// the channels of group g of image n are one contiguous block of D = (C / G) S elements.
//
// Forward: one (n, g) block per task; two passes for the statistics (mean, then the centred
// variance: stable for a large mean), one writing y = x * scale[c] + shift[c] with
// scale = rstd * weight[c], shift = bias[c] - mean * scale folded per channel.
//
// Backward, with xhat = (x - mean) rstd and per channel sums ds[n, c] = sum_S grad * x,
// db[n, c] = sum_S grad (one pass over the block):
//   sum1 = sum_c w[c] db[n, c],  sum2 = sum_c w[c] rstd (ds[n, c] - mean db[n, c])
//   dx = rstd (grad w[c] - sum1 / D - xhat sum2 / D) = grad a[c] + x bx + c0  (a second pass)
//   dweight[c] = sum_n rstd (ds[n, c] - mean db[n, c]),  dbias[c] = sum_n db[n, c]
// dweight / dbias add the per-image sums in image order after the parallel pass, so the result
// does not depend on the thread count (Note [norm partial sums] in nn_norm.cc).
#include <cmath>

#include "core/raw.h"
#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/nn_group_norm.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

struct GnGeom {
  int64_t n, c, s, groups, cg, d;  // d = cg * s elements per (n, g) block
};

GnGeom gn_geom(const Tensor& x, int64_t groups) {
  GnGeom g;
  g.n = x.size(0), g.c = x.size(1), g.groups = groups, g.cg = g.c / groups;
  g.s = g.n * g.c == 0 ? 0 : x.numel() / (g.n * g.c);
  g.d = g.cg * g.s;
  return g;
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

template <typename T>
void gn_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t groups,
                double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  using A = acc_t<T>;
  const GnGeom g = gn_geom(x, groups);
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
  const T* wp = ptr_or_null<T>(weight);
  const T* bp = ptr_or_null<T>(bias);
  A* mp = mean.data<A>();
  A* rp = rstd.data<A>();
  const int64_t blocks = g.n * g.groups;
  if (g.d == 0) {  // empty groups: mean 0, rstd 1 / sqrt(eps) as a zero-variance group
    for (int64_t i = 0; i < blocks; ++i) mp[i] = A(0), rp[i] = A(1) / std::sqrt(A(eps));
    return;
  }
  const A inv_d = A(1) / A(g.d);
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / g.d), [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const T* xb = xp + blk * g.d;
      T* yb = yp + blk * g.d;
      const A mu = row_sum(xb, g.d) * inv_d;
      A ss = A(0);
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < g.d; ++i) {
        const A dv = cast<A>(xb[i]) - mu;
        ss += dv * dv;
      }
      const A rs = A(1) / std::sqrt(ss * inv_d + A(eps));
      mp[blk] = mu;
      rp[blk] = rs;
      const int64_t c0 = (blk % g.groups) * g.cg;
      for (int64_t k = 0; k < g.cg; ++k) {
        const A scale = wp ? rs * cast<A>(wp[c0 + k]) : rs;
        const A shift = (bp ? cast<A>(bp[c0 + k]) : A(0)) - mu * scale;
        const T* xc = xb + k * g.s;
        T* yc = yb + k * g.s;
#pragma omp simd
        for (int64_t i = 0; i < g.s; ++i) yc[i] = cast<T>(cast<A>(xc[i]) * scale + shift);
      }
    }
  });
}

template <typename T>
void gn_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                 const Tensor& weight, int64_t groups, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  using A = acc_t<T>;
  const GnGeom g = gn_geom(x, groups);
  const T* gp = static_cast<const T*>(grad.data_ptr());
  const T* xp = static_cast<const T*>(x.data_ptr());
  const T* wp = ptr_or_null<T>(weight);
  const A* mp = mean.data<A>();
  const A* rp = rstd.data<A>();
  T* dxp = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
  // Per (n, c): [ds, db].
  Tensor sums = empty({g.n, g.c, 2}, TensorOptions(dtype_of<A>::value, kCPU));
  A* sp = sums.data<A>();
  const int64_t blocks = g.n * g.groups;
  const A inv_d = g.d == 0 ? A(0) : A(1) / A(g.d);
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(g.d, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t blk = b; blk < e; ++blk) {
                   const int64_t n = blk / g.groups, c0 = (blk % g.groups) * g.cg;
                   const T* gb = gp + blk * g.d;
                   const T* xb = xp + blk * g.d;
                   const A mu = mp[blk], rs = rp[blk];
                   A sum1 = A(0), sum2 = A(0);
                   for (int64_t k = 0; k < g.cg; ++k) {
                     const T* gc = gb + k * g.s;
                     const T* xc = xb + k * g.s;
                     A ds = A(0), db = A(0);
#pragma omp simd reduction(+ : ds, db)
                     for (int64_t i = 0; i < g.s; ++i) {
                       const A gv = cast<A>(gc[i]);
                       ds += gv * cast<A>(xc[i]);
                       db += gv;
                     }
                     A* s = sp + ((n * g.c) + c0 + k) * 2;
                     s[0] = ds, s[1] = db;
                     const A w = wp ? cast<A>(wp[c0 + k]) : A(1);
                     sum1 += w * db;
                     sum2 += w * rs * (ds - mu * db);
                   }
                   if (!dxp) continue;
                   const A bx = -rs * rs * sum2 * inv_d;
                   const A cst = mu * rs * rs * sum2 * inv_d - rs * sum1 * inv_d;
                   T* db_ = dxp + blk * g.d;
                   for (int64_t k = 0; k < g.cg; ++k) {
                     const A a = wp ? rs * cast<A>(wp[c0 + k]) : rs;
                     const T* gc = gb + k * g.s;
                     const T* xc = xb + k * g.s;
                     T* dc = db_ + k * g.s;
#pragma omp simd
                     for (int64_t i = 0; i < g.s; ++i)
                       dc[i] = cast<T>(cast<A>(gc[i]) * a + cast<A>(xc[i]) * bx + cst);
                   }
                 }
               });
  T* dwp = dweight.defined() ? static_cast<T*>(dweight.data_ptr()) : nullptr;
  T* dbp = dbias.defined() ? static_cast<T*>(dbias.data_ptr()) : nullptr;
  if (!dwp && !dbp) return;
  for (int64_t c = 0; c < g.c; ++c) {
    const int64_t grp = c / g.cg;
    A sw = A(0), sb = A(0);
    for (int64_t n = 0; n < g.n; ++n) {
      const A* s = sp + (n * g.c + c) * 2;
      const int64_t blk = n * g.groups + grp;
      sw += rp[blk] * (s[0] - mp[blk] * s[1]);
      sb += s[1];
    }
    if (dwp) dwp[c] = cast<T>(sw);
    if (dbp) dbp[c] = cast<T>(sb);
  }
}

void group_norm_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t groups,
                       double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  ACCEL_DISPATCH_FLOATING(x.dtype(), "group_norm", [&]<typename T>() {
    gn_forward<T>(x, weight, bias, groups, eps, y, mean, rstd);
  });
}

void group_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& weight, int64_t groups,
                                Tensor& dx, Tensor& dweight, Tensor& dbias) {
  ACCEL_DISPATCH_FLOATING(x.dtype(), "group_norm_backward", [&]<typename T>() {
    gn_backward<T>(grad, x, mean, rstd, weight, groups, dx, dweight, dbias);
  });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(group_norm_stub, CPU, ACCEL_ISA_DISPATCH(group_norm_kernel));
ACCEL_REGISTER_KERNEL(group_norm_backward_stub, CPU,
                      ACCEL_ISA_DISPATCH(group_norm_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
