// CPU softmax / log_softmax and their backward.
//   x: contiguous, viewed as (outer, n, inner) around the softmax dim.
// inner == 1 (the last dim; attention rows) runs row by row with `omp simd` passes; inner > 1
// vectorises across a block of kBlock neighbouring columns instead, so no transpose is needed.
#include <cmath>

#include "kernels/common/geometry.h"
#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/nn_softmax.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

// exp is several times the cost of an add: parallelise smaller problems than plain elementwise.
constexpr int64_t kSoftmaxGrain = kParallelGrain / 4;
constexpr int64_t kBlock = 32;  // columns per block on the strided (inner > 1) path

template <typename T>
void softmax_row(const T* x, T* y, int64_t n, bool log) {
  using A = acc_t<T>;
  const A m = row_max(x, n);
  if (log) {
    const A lse = m + std::log(row_sum_exp(x, n, m));
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = cast<T>(cast<A>(x[i]) - lse);
    return;
  }
  if constexpr (std::is_same_v<T, A>) {
    const A inv = A(1) / row_exp_store(x, n, m, y);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  } else {
    // 16-bit storage: recompute exp rather than round it twice through T.
    const A inv = A(1) / row_sum_exp(x, n, m);
    for (int64_t i = 0; i < n; ++i) y[i] = cast<T>(exp_acc<A>(cast<A>(x[i]) - m) * inv);
  }
}

// Columns [j0, j0 + w) of one (n, inner) slab.
template <typename T>
void softmax_cols(const T* x, T* y, int64_t n, int64_t inner, int64_t w, bool log) {
  using A = acc_t<T>;
  A mx[kBlock], sm[kBlock];
  for (int64_t j = 0; j < w; ++j) {
    mx[j] = -std::numeric_limits<A>::infinity();
    sm[j] = A(0);
  }
  for (int64_t k = 0; k < n; ++k) {
    const T* r = x + k * inner;
    for (int64_t j = 0; j < w; ++j) {
      const A v = cast<A>(r[j]);
      mx[j] = v > mx[j] ? v : mx[j];
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    const T* r = x + k * inner;
    for (int64_t j = 0; j < w; ++j) sm[j] += exp_acc<A>(cast<A>(r[j]) - mx[j]);
  }
  for (int64_t j = 0; j < w; ++j) sm[j] = log ? mx[j] + std::log(sm[j]) : A(1) / sm[j];
  for (int64_t k = 0; k < n; ++k) {
    const T* r = x + k * inner;
    T* o = y + k * inner;
    if (log) {
      for (int64_t j = 0; j < w; ++j) o[j] = cast<T>(cast<A>(r[j]) - sm[j]);
    } else {
      for (int64_t j = 0; j < w; ++j) o[j] = cast<T>(exp_acc<A>(cast<A>(r[j]) - mx[j]) * sm[j]);
    }
  }
}

template <typename T>
void softmax_backward_row(const T* g, const T* y, T* dx, int64_t n, bool log) {
  using A = acc_t<T>;
  if (log) {
    const A gs = row_sum(g, n);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = cast<T>(cast<A>(g[i]) - exp_acc<A>(cast<A>(y[i])) * gs);
    return;
  }
  const A dot = row_dot(g, y, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = cast<T>(cast<A>(y[i]) * (cast<A>(g[i]) - dot));
}

template <typename T>
void softmax_backward_cols(const T* g, const T* y, T* dx, int64_t n, int64_t inner, int64_t w,
                           bool log) {
  using A = acc_t<T>;
  A acc[kBlock];
  for (int64_t j = 0; j < w; ++j) acc[j] = A(0);
  for (int64_t k = 0; k < n; ++k) {
    const T* gr = g + k * inner;
    const T* yr = y + k * inner;
    for (int64_t j = 0; j < w; ++j)
      acc[j] += log ? cast<A>(gr[j]) : cast<A>(gr[j]) * cast<A>(yr[j]);
  }
  for (int64_t k = 0; k < n; ++k) {
    const T* gr = g + k * inner;
    const T* yr = y + k * inner;
    T* o = dx + k * inner;
    for (int64_t j = 0; j < w; ++j) {
      const A gv = cast<A>(gr[j]), yv = cast<A>(yr[j]);
      o[j] = cast<T>(log ? gv - exp_acc<A>(yv) * acc[j] : yv * (gv - acc[j]));
    }
  }
}

// Runs row_fn(slab_offset, col0, width) over every (outer, column block); each call owns its
// slab columns, so there are no races.
template <typename F>
void for_each_block(const common::RowGeometry& g, F&& fn) {
  if (g.inner == 1) {
    parallel_for(g.outer, std::max<int64_t>(1, kSoftmaxGrain / std::max<int64_t>(g.n, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t o = b; o < e; ++o) fn(o * g.n, int64_t(0), int64_t(1));
                 });
    return;
  }
  const int64_t nblk = (g.inner + kBlock - 1) / kBlock;
  const int64_t work = std::max<int64_t>(1, g.n * std::min(g.inner, kBlock));
  parallel_for(g.outer * nblk, std::max<int64_t>(1, kSoftmaxGrain / work),
               [&](int64_t b, int64_t e) {
                 for (int64_t t = b; t < e; ++t) {
                   const int64_t o = t / nblk, j0 = (t % nblk) * kBlock;
                   fn(o * g.n * g.inner + j0, j0, std::min(kBlock, g.inner - j0));
                 }
               });
}

void softmax_kernel(const Tensor& x, int64_t dim, bool log, Tensor& y) {
  if (x.numel() == 0) return;
  const common::RowGeometry geo = common::row_geometry(x.sizes(), dim);
  ACCEL_DISPATCH_FLOATING(x.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    for_each_block(geo, [&](int64_t off, int64_t, int64_t w) {
      if (geo.inner == 1) {
        softmax_row<T>(xp + off, yp + off, geo.n, log);
      } else {
        softmax_cols<T>(xp + off, yp + off, geo.n, geo.inner, w, log);
      }
    });
  });
}

void softmax_backward_kernel(const Tensor& grad, const Tensor& y, int64_t dim, bool log,
                             Tensor& dx) {
  if (y.numel() == 0) return;
  const common::RowGeometry geo = common::row_geometry(y.sizes(), dim);
  ACCEL_DISPATCH_FLOATING(
      y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<typename T>() {
        const T* gp = static_cast<const T*>(grad.data_ptr());
        const T* yp = static_cast<const T*>(y.data_ptr());
        T* dp = static_cast<T*>(dx.data_ptr());
        for_each_block(geo, [&](int64_t off, int64_t, int64_t w) {
          if (geo.inner == 1) {
            softmax_backward_row<T>(gp + off, yp + off, dp + off, geo.n, log);
          } else {
            softmax_backward_cols<T>(gp + off, yp + off, dp + off, geo.n, geo.inner, w, log);
          }
        });
      });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(softmax_stub, CPU, ACCEL_ISA_DISPATCH(softmax_kernel));
ACCEL_REGISTER_KERNEL(softmax_backward_stub, CPU, ACCEL_ISA_DISPATCH(softmax_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
