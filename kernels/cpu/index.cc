// CPU indexing kernels: index_select (and embedding), index_add (and its backward), gather,
// scatter_add. Indices are validated in one serial pass before any parallel loop (exceptions
// must not leave an OpenMP region). Pure data movement is dispatched on the element size only.
#include <cstring>

#include "kernels/common/geometry.h"
#include "kernels/stubs/index.h"
#include "kernels/cpu/loops.h"

namespace accel::cpu {
namespace {

template <typename I>
void check_indices(const I* idx, int64_t k, int64_t size, int64_t dim, const Tensor& t,
                   const char* op) {
  for (int64_t j = 0; j < k; ++j) {
    const int64_t v = int64_t(idx[j]);
    ACCEL_CHECK(v >= 0 && v < size, IndexError, op, "index ", v, " is out of bounds for dimension ",
                dim, " with size ", size, " (shape ", t.sizes(), ")");
  }
}

template <typename T>
T add_values(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else {
    return cast<T>(cast<acc_t<T>>(a) + cast<acc_t<T>>(b));
  }
}

void index_select_kernel(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out,
                         const char* op) {
  const common::RowGeometry g = common::row_geometry(x.sizes(), dim);
  const int64_t k = index.numel();
  ACCEL_DISPATCH_INDEX(index.dtype(), op, [&]<typename I>() {
    const I* ip = static_cast<const I*>(index.data_ptr());
    check_indices(ip, k, g.n, dim, x, op);
    if (out.numel() == 0) return;
    dispatch_bytes(x.element_size(), op, [&]<typename U>() {
      const U* xp = static_cast<const U*>(x.data_ptr());
      U* op_ = static_cast<U*>(out.data_ptr());
      const int64_t inner = g.inner, n = g.n;
      parallel_for(g.outer * k, std::max<int64_t>(1, kParallelGrain / inner),
                   [&](int64_t b, int64_t e) {
                     for (int64_t t = b; t < e; ++t) {
                       const int64_t o = t / k, j = t % k;
                       const U* src = xp + (o * n + int64_t(ip[j])) * inner;
                       U* dst = op_ + t * inner;
                       for (int64_t i = 0; i < inner; ++i) dst[i] = src[i];
                     }
                   });
    });
  });
}

void index_add_kernel(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                      const char* op) {
  const common::RowGeometry g = common::row_geometry(out.sizes(), dim);
  const int64_t k = index.numel();
  ACCEL_DISPATCH_INDEX(index.dtype(), op, [&]<typename I>() {
    const I* ip = static_cast<const I*>(index.data_ptr());
    check_indices(ip, k, g.n, dim, out, op);
    if (src.numel() == 0) return;
    ACCEL_DISPATCH_ALL(out.dtype(), op, [&]<typename T>() {
      T* op_ = static_cast<T*>(out.data_ptr());
      const T* sp = static_cast<const T*>(src.data_ptr());
      const int64_t inner = g.inner, n = g.n, outer = g.outer;
      auto add_row = [&](int64_t o, int64_t j) {
        T* dst = op_ + (o * n + int64_t(ip[j])) * inner;
        const T* s = sp + (o * k + j) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] = add_values(dst[i], s[i]);
      };
      const int64_t work = outer * k * inner;
      if (work < kParallelGrain || omp_get_max_threads() == 1) {
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t j = 0; j < k; ++j) add_row(o, j);
      } else if (outer >= 2 * int64_t(omp_get_max_threads())) {
        // Different outer slices never alias.
        parallel_for(outer, 1, [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o)
            for (int64_t j = 0; j < k; ++j) add_row(o, j);
        });
      } else {
        // Few slices (embedding backward: outer = 1): each thread owns a range of destination
        // rows and scans every index, so duplicates accumulate in index order, without races.
        parallel_for(n, 1, [&](int64_t b, int64_t e) {
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t v = int64_t(ip[j]);
              if (v >= b && v < e) add_row(o, j);
            }
        });
      }
    });
  });
}

// Walks the elements of a contiguous index tensor of rank nd. For element i it yields
//   pos  = sum_d i_d * pos_stride[d]                      (out of gather, src of scatter)
//   self = sum_{d != dim} i_d * self_stride[d] + index[i] * self_stride[dim]
struct IndexWalk {
  int nd = 0;
  int64_t dim = 0;
  int64_t sizes[kMaxLoopDims];
  int64_t pos_stride[kMaxLoopDims];
  int64_t self_stride[kMaxLoopDims];

  IndexWalk(const Tensor& index, int64_t d, const Tensor& pos, const Tensor& self) {
    nd = int(index.dim());
    dim = d;
    for (int i = 0; i < nd; ++i) {
      sizes[i] = index.sizes()[size_t(i)];
      pos_stride[i] = pos.strides()[size_t(i)];
      self_stride[i] = self.strides()[size_t(i)];
    }
  }
  int64_t row_len() const { return sizes[nd - 1]; }
  int64_t rows() const {
    int64_t r = 1;
    for (int i = 0; i < nd - 1; ++i) r *= sizes[i];
    return r;
  }

  // Rows [rb, re) of the (rows, row_len) flattening, columns [jb, je).
  template <typename I, typename F>
  void run(const I* index, int64_t rb, int64_t re, int64_t jb, int64_t je, F&& f) const {
    const int64_t len = row_len();
    const int last = nd - 1;
    int64_t mi[kMaxLoopDims];
    int64_t r = rb;
    for (int d = last - 1; d >= 0; --d) {
      mi[d] = r % sizes[d];
      r /= sizes[d];
    }
    for (int64_t row = rb; row < re; ++row) {
      int64_t pb = 0, sb = 0;
      for (int d = 0; d < last; ++d) {
        pb += mi[d] * pos_stride[d];
        if (d != dim) sb += mi[d] * self_stride[d];
      }
      const I* ir = index + row * len;
      if (dim == last) {
        for (int64_t j = jb; j < je; ++j)
          f(pb + j * pos_stride[last], sb + int64_t(ir[j]) * self_stride[last]);
      } else {
        for (int64_t j = jb; j < je; ++j)
          f(pb + j * pos_stride[last],
            sb + j * self_stride[last] + int64_t(ir[j]) * self_stride[dim]);
      }
      for (int d = last - 1; d >= 0; --d) {
        if (++mi[d] < sizes[d]) break;
        mi[d] = 0;
      }
    }
  }
};

void gather_kernel(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out, const char* op) {
  ACCEL_CHECK(index.dim() >= 1 && index.dim() <= kMaxLoopDims, ShapeError, op,
              "index rank must be in [1, ", kMaxLoopDims, "], got shape ", index.sizes());
  ACCEL_DISPATCH_INDEX(index.dtype(), op, [&]<typename I>() {
    const I* ip = static_cast<const I*>(index.data_ptr());
    check_indices(ip, index.numel(), x.sizes()[size_t(dim)], dim, x, op);
    if (index.numel() == 0) return;
    const IndexWalk walk(index, dim, out, x);
    dispatch_bytes(x.element_size(), op, [&]<typename U>() {
      const U* xp = static_cast<const U*>(x.data_ptr());
      U* o = static_cast<U*>(out.data_ptr());
      const int64_t len = walk.row_len();
      parallel_for(walk.rows(), std::max<int64_t>(1, kParallelGrain / len),
                   [&](int64_t b, int64_t e) {
                     walk.run(ip, b, e, 0, len, [&](int64_t p, int64_t s) { o[p] = xp[s]; });
                   });
    });
  });
}

void scatter_add_kernel(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                        const char* op) {
  ACCEL_CHECK(index.dim() >= 1 && index.dim() <= kMaxLoopDims, ShapeError, op,
              "index rank must be in [1, ", kMaxLoopDims, "], got shape ", index.sizes());
  ACCEL_DISPATCH_INDEX(index.dtype(), op, [&]<typename I>() {
    const I* ip = static_cast<const I*>(index.data_ptr());
    check_indices(ip, index.numel(), out.sizes()[size_t(dim)], dim, out, op);
    if (index.numel() == 0) return;
    const IndexWalk walk(index, dim, src, out);
    ACCEL_DISPATCH_ALL(out.dtype(), op, [&]<typename T>() {
      T* o = static_cast<T*>(out.data_ptr());
      const T* sp = static_cast<const T*>(src.data_ptr());
      const int64_t len = walk.row_len(), rows = walk.rows();
      auto body = [&](int64_t p, int64_t s) { o[s] = add_values(o[s], sp[p]); };
      const bool big = index.numel() >= kParallelGrain;
      if (big && walk.nd >= 2 && dim != 0) {
        // Slices along dim 0 write disjoint parts of out (out's dim-0 coordinate is i_0).
        const int64_t d0 = walk.sizes[0], per = rows / d0;
        parallel_for(d0, 1,
                     [&](int64_t b, int64_t e) { walk.run(ip, b * per, e * per, 0, len, body); });
      } else if (big && walk.nd >= 2) {
        // dim == 0: columns along the last dim are disjoint instead.
        parallel_for(len, 1, [&](int64_t b, int64_t e) { walk.run(ip, 0, rows, b, e, body); });
      } else {
        walk.run(ip, 0, rows, 0, len, body);
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(index_select_stub, CPU, &cpu::index_select_kernel);
ACCEL_REGISTER_KERNEL(index_add_stub, CPU, &cpu::index_add_kernel);
ACCEL_REGISTER_KERNEL(gather_stub, CPU, &cpu::gather_kernel);
ACCEL_REGISTER_KERNEL(scatter_add_stub, CPU, &cpu::scatter_add_kernel);
}  // namespace accel
