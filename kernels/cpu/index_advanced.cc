// CPU kernels of advanced indexing (contract: kernels/stubs/index.h): index (a gather by
// precomputed offsets), index_put (the scatter, assigning or accumulating) and nonzero (the
// compaction behind boolean masks).
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/stubs/index.h"

namespace accel::cpu {
namespace {

void index_kernel(const Tensor& src, const Tensor& offsets, Tensor& out) {
  ACCEL_INTERNAL_ASSERT(out.is_contiguous() && src.sizes() == out.sizes() &&
                        offsets.sizes() == out.sizes() && offsets.dtype() == kInt64);
  if (out.numel() == 0) return;
  const Tensor* ops[3] = {&out, &src, &offsets};
  const StridedLoop<3> loop(ops);
  dispatch_bytes(out.element_size(), "index", [&]<typename U>() {
    loop.run([](char* const* p, const int64_t* st, int64_t n) {
      constexpr int64_t es = int64_t(sizeof(U));
      if (st[2] == 0) {
        // The inner dim is a kept one (x[idx] picking rows): one offset for the whole run.
        const char* s = p[1] + *reinterpret_cast<const int64_t*>(p[2]) * es;
        if (st[0] == es && st[1] == es) {
          std::memcpy(p[0], s, size_t(n) * sizeof(U));
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<U*>(p[0] + i * st[0]) = *reinterpret_cast<const U*>(s + i * st[1]);
        }
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = *reinterpret_cast<const int64_t*>(p[2] + i * st[2]);
        *reinterpret_cast<U*>(p[0] + i * st[0]) = reinterpret_cast<const U*>(p[1] + i * st[1])[off];
      }
    });
  });
}

template <typename T>
T add_value(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else {
    return cast<T>(cast<acc_t<T>>(a) + cast<acc_t<T>>(b));
  }
}

// Serial, in the row-major order of dst's shape: two elements that land on one address differ
// only in the index dims, so the later one in index order is written (or added) last. (A
// parallel loop over the kept dims would be race-free too; the ops that call this with large
// kept dims are rare enough that the simple loop stays.) A run along a kept dim has one offset:
// it is a row copy (or a row add, which vectorises).
void index_put_kernel(Tensor& dst, const Tensor& offsets, const Tensor& values, bool accumulate) {
  ACCEL_INTERNAL_ASSERT(values.dtype() == dst.dtype() && offsets.sizes() == dst.sizes() &&
                        values.sizes() == dst.sizes() && offsets.dtype() == kInt64);
  if (dst.numel() == 0) return;
  const Tensor* ops[3] = {&dst, &values, &offsets};
  const StridedLoop<3> loop(ops);
  constexpr int64_t kSerial = std::numeric_limits<int64_t>::max();
  if (!accumulate) {
    dispatch_bytes(dst.element_size(), "index_put_", [&]<typename U>() {
      loop.run(
          [](char* const* p, const int64_t* st, int64_t n) {
            constexpr int64_t es = int64_t(sizeof(U));
            if (st[2] == 0) {
              char* d = p[0] + *reinterpret_cast<const int64_t*>(p[2]) * es;
              if (st[0] == es && st[1] == es) {
                std::memcpy(d, p[1], size_t(n) * sizeof(U));
              } else {
                for (int64_t i = 0; i < n; ++i)
                  *reinterpret_cast<U*>(d + i * st[0]) =
                      *reinterpret_cast<const U*>(p[1] + i * st[1]);
              }
              return;
            }
            for (int64_t i = 0; i < n; ++i) {
              const int64_t off = *reinterpret_cast<const int64_t*>(p[2] + i * st[2]);
              reinterpret_cast<U*>(p[0] + i * st[0])[off] =
                  *reinterpret_cast<const U*>(p[1] + i * st[1]);
            }
          },
          kSerial);
    });
    return;
  }
  ACCEL_DISPATCH_ALL(dst.dtype(), "index_put_", [&]<typename T>() {
    loop.run(
        [](char* const* p, const int64_t* st, int64_t n) {
          constexpr int64_t es = int64_t(sizeof(T));
          if (st[2] == 0 && st[0] == es && st[1] == es) {
            T* d = reinterpret_cast<T*>(p[0]) + *reinterpret_cast<const int64_t*>(p[2]);
            const T* v = reinterpret_cast<const T*>(p[1]);
            for (int64_t i = 0; i < n; ++i) d[i] = add_value(d[i], v[i]);
            return;
          }
          for (int64_t i = 0; i < n; ++i) {
            const int64_t off = *reinterpret_cast<const int64_t*>(p[2] + i * st[2]);
            T* d = reinterpret_cast<T*>(p[0] + i * st[0]) + off;
            *d = add_value(*d, *reinterpret_cast<const T*>(p[1] + i * st[1]));
          }
        },
        kSerial);
  });
}

template <typename T>
bool is_nonzero(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else {
    return cast<double>(v) != 0.0;  // NaN != 0; -0.0 == 0
  }
}

// Two passes over the same chunks: count per chunk, then write each chunk's coordinates from its
// prefix offset, so the result is row-major whatever the thread count.
Tensor nonzero_kernel(const Tensor& x) {
  ACCEL_INTERNAL_ASSERT(x.is_contiguous());
  const int64_t n = x.numel();
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  const Shape sizes = x.dim() == 0 ? Shape{1} : x.sizes();
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads() * 4, n / kParallelGrain));
  const int64_t per = (n + chunks - 1) / chunks;
  std::vector<int64_t> counts(size_t(chunks) + 1, 0);
  Tensor out;
  ACCEL_DISPATCH_ALL(x.dtype(), "nonzero", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        int64_t cnt = 0;
        const int64_t lo = c * per, hi = std::min(n, lo + per);
        for (int64_t i = lo; i < hi; ++i) cnt += is_nonzero(xp[i]) ? 1 : 0;
        counts[size_t(c) + 1] = cnt;
      }
    });
    for (int64_t c = 0; c < chunks; ++c) counts[size_t(c) + 1] += counts[size_t(c)];
    const int64_t total = counts[size_t(chunks)];
    out = empty({total, nd}, TensorOptions(kInt64, x.device()));
    if (total == 0) return;
    int64_t* op = static_cast<int64_t*>(out.data_ptr());
    parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t lo = c * per, hi = std::min(n, lo + per);
        if (lo >= hi) continue;
        Shape coord(size_t(nd), 0);
        int64_t r = lo;
        for (int64_t d = nd - 1; d >= 0; --d) {
          coord[d] = r % sizes[size_t(d)];
          r /= sizes[size_t(d)];
        }
        int64_t* w = op + counts[size_t(c)] * nd;
        for (int64_t i = lo; i < hi; ++i) {
          if (is_nonzero(xp[i])) {
            for (int64_t d = 0; d < nd; ++d) w[d] = coord[d];
            w += nd;
          }
          for (int64_t d = nd - 1; d >= 0; --d) {
            if (++coord[d] < sizes[size_t(d)]) break;
            coord[d] = 0;
          }
        }
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(index_stub, CPU, &cpu::index_kernel);
ACCEL_REGISTER_KERNEL(index_put_stub, CPU, &cpu::index_put_kernel);
ACCEL_REGISTER_KERNEL(nonzero_stub, CPU, &cpu::nonzero_kernel);
}  // namespace accel
