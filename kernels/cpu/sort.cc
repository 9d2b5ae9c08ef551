// CPU sorting and sampling kernels (contract: kernels/stubs/sort.h): the sorted first k of each
// row (sort and topk) and multinomial sampling by inverse CDF. Rows run in parallel.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/stubs/sort.h"

namespace accel::cpu {
namespace {

// "a before b" in the one total order of kernels/stubs/sort.h: by value (NaN above every number;
// descending reverses the value comparison), then by position. Sorting (value, position) pairs
// keeps the comparisons in one contiguous buffer.
template <typename A>
struct Entry {
  A v;
  int64_t i;
};

template <typename A>
struct Before {
  bool descending;
  bool operator()(const Entry<A>& a, const Entry<A>& b) const {
    if constexpr (std::is_floating_point_v<A>) {
      const bool na = std::isnan(a.v), nb = std::isnan(b.v);
      if (na || nb) {
        if (na && nb) return a.i < b.i;
        return descending ? na : nb;  // NaN is the largest
      }
    }
    if (a.v != b.v) return descending ? a.v > b.v : a.v < b.v;
    return a.i < b.i;
  }
};

void sort_kernel(const Tensor& x, int64_t k, bool descending, Tensor& values, Tensor& indices) {
  ACCEL_INTERNAL_ASSERT(x.dim() == 2 && x.is_contiguous() && values.is_contiguous() &&
                        indices.is_contiguous() && indices.dtype() == kInt64);
  const int64_t rows = x.sizes()[0], n = x.sizes()[1];
  ACCEL_INTERNAL_ASSERT(k >= 0 && k <= n);
  if (rows == 0 || k == 0) return;
  ACCEL_DISPATCH_ALL(x.dtype(), "sort", [&]<typename T>() {
    using A = std::conditional_t<std::is_same_v<T, bool>, uint8_t, acc_t<T>>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* vp = static_cast<T*>(values.data_ptr());
    int64_t* ip = static_cast<int64_t*>(indices.data_ptr());
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
                 [&](int64_t b, int64_t e) {
                   std::vector<Entry<A>> row(static_cast<size_t>(n));
                   const Before<A> before{descending};
                   for (int64_t r = b; r < e; ++r) {
                     const T* xr = xp + r * n;
                     for (int64_t j = 0; j < n; ++j) row[size_t(j)] = {cast<A>(xr[j]), j};
                     if (k < n) {
                       std::partial_sort(row.begin(), row.begin() + k, row.end(), before);
                     } else {
                       std::sort(row.begin(), row.end(), before);
                     }
                     for (int64_t j = 0; j < k; ++j) {
                       const int64_t src = row[size_t(j)].i;
                       vp[r * k + j] = xr[src];
                       ip[r * k + j] = src;
                     }
                   }
                 });
  });
}

void multinomial_kernel(const Tensor& probs, const Tensor& uniforms, Tensor& out) {
  ACCEL_INTERNAL_ASSERT(probs.dim() == 2 && probs.is_contiguous() && uniforms.is_contiguous() &&
                        uniforms.dtype() == kFloat64 && out.dtype() == kInt64);
  const int64_t rows = probs.sizes()[0], n = probs.sizes()[1], s = uniforms.sizes()[1];
  ACCEL_DISPATCH_FLOATING(probs.dtype(), "multinomial", [&]<typename T>() {
    const T* pp = static_cast<const T*>(probs.data_ptr());
    const double* up = static_cast<const double*>(uniforms.data_ptr());
    int64_t* op = static_cast<int64_t*>(out.data_ptr());
    parallel_for(rows, 1, [&](int64_t b, int64_t e) {
      std::vector<double> cdf(static_cast<size_t>(n));
      for (int64_t r = b; r < e; ++r) {
        double run = 0;
        int64_t last = 0;  // the last category of nonzero probability
        for (int64_t c = 0; c < n; ++c) {
          const double p = cast<double>(pp[r * n + c]);
          run += p;
          cdf[size_t(c)] = run;
          if (p > 0) last = c;
        }
        for (int64_t j = 0; j < s; ++j) {
          const double target = up[r * s + j] * run;
          const int64_t c = std::upper_bound(cdf.begin(), cdf.end(), target) - cdf.begin();
          op[r * s + j] = std::min(c, last);  // rounding can put target at the total
        }
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(sort_stub, CPU, &cpu::sort_kernel);
ACCEL_REGISTER_KERNEL(multinomial_stub, CPU, &cpu::multinomial_kernel);
}  // namespace accel
