// CPU reductions. Three layouts cover training: reduced dims innermost (row reduction, e.g. a
// softmax denominator), reduced dims outermost (column reduction, e.g. a bias gradient over the
// batch), and anything else via a permuted contiguous copy.
#include <cmath>
#include <limits>

#include "core/raw.h"
#include "kernels/stubs/reduce.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/reduce.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

template <typename T, typename A>
A row_sum(const T* x, int64_t n) {
  constexpr int kLanes = 8;
  A acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += A(cast<acc_t<T>>(x[i + l]));
  A s = A(0);
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += A(cast<acc_t<T>>(x[i]));
  return s;
}

template <typename T>
bool greater(acc_t<T> a, acc_t<T> b) {  // a > b, NaN largest
  if constexpr (std::is_floating_point_v<acc_t<T>>) {
    if (std::isnan(a)) return !std::isnan(b);
    if (std::isnan(b)) return false;
  }
  return a > b;
}

// x: rows x n contiguous -> out[r].
template <typename T, typename O>
void reduce_rows(ReduceOp op, const T* x, int64_t rows, int64_t n, O* out) {
  using A = sum_acc_t<T>;
  using V = acc_t<T>;
  parallel_for(
      rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* p = x + r * n;
          switch (op) {
            case ReduceOp::Sum: out[r] = cast<O>(row_sum<T, A>(p, n)); break;
            case ReduceOp::Mean: out[r] = cast<O>(double(row_sum<T, A>(p, n)) / double(n)); break;
            case ReduceOp::Prod: {
              A s = A(1);
              for (int64_t i = 0; i < n; ++i) s *= A(cast<V>(p[i]));
              out[r] = cast<O>(s);
              break;
            }
            case ReduceOp::Max:
            case ReduceOp::Min: {
              V m = cast<V>(p[0]);
              const bool is_max = op == ReduceOp::Max;
              for (int64_t i = 1; i < n; ++i) {
                const V v = cast<V>(p[i]);
                if (is_max
                        ? greater<T>(v, m)
                        : (greater<T>(m, v) || (std::isnan(double(v)) && !std::isnan(double(m)))))
                  m = v;
              }
              out[r] = cast<O>(m);
              break;
            }
            case ReduceOp::ArgMax:
            case ReduceOp::ArgMin: {
              V m = cast<V>(p[0]);
              int64_t mi = 0;
              const bool is_max = op == ReduceOp::ArgMax;
              for (int64_t i = 1; i < n; ++i) {
                const V v = cast<V>(p[i]);
                const bool better = is_max ? greater<T>(v, m)
                                           : (greater<T>(m, v) ||
                                              (std::isnan(double(v)) && !std::isnan(double(m))));
                if (better) {
                  m = v;
                  mi = i;
                }
              }
              out[r] = O(mi);
              break;
            }
            case ReduceOp::Count: break;
          }
        }
      });
}

// x: n x cols contiguous, reduce over n -> out[cols]. Sum/Mean only (others go through rows).
template <typename T, typename O>
void reduce_cols_sum(const T* x, int64_t n, int64_t cols, O* out, bool mean) {
  using A = sum_acc_t<T>;
  parallel_for(cols, std::max<int64_t>(16, kParallelGrain / std::max<int64_t>(n, 1)),
               [&](int64_t b, int64_t e) {
                 constexpr int64_t kBlock = 256;
                 A acc[kBlock];
                 for (int64_t c0 = b; c0 < e; c0 += kBlock) {
                   const int64_t w = std::min(kBlock, e - c0);
                   for (int64_t j = 0; j < w; ++j) acc[j] = A(0);
                   for (int64_t i = 0; i < n; ++i) {
                     const T* row = x + i * cols + c0;
                     for (int64_t j = 0; j < w; ++j) acc[j] += A(cast<acc_t<T>>(row[j]));
                   }
                   for (int64_t j = 0; j < w; ++j)
                     out[c0 + j] = mean ? cast<O>(double(acc[j]) / double(n)) : cast<O>(acc[j]);
                 }
               });
}

void reduce_kernel(ReduceOp op, const Tensor& in, const Shape& dims, Tensor& out) {
  const int64_t nd = in.dim();
  const ReducedDims rd = reduced_dims(in, dims);
  const int64_t rows = out.numel();
  if (rows == 0) return;
  if (rd.numel == 0) {
    // The op checked that max/min/argmax/argmin reduce no empty dim (kernels/stubs/reduce.h).
    ACCEL_INTERNAL_ASSERT(has_identity(op));
    raw::fill_(out, reduce_identity(op));
    return;
  }
  // Leading reduced dims + contiguous input: column reduction.
  bool leading = in.is_contiguous();
  {
    bool seen_kept = false;
    for (int64_t d = 0; d < nd && leading; ++d) {
      if (!rd.mask[size_t(d)])
        seen_kept = true;
      else if (seen_kept)
        leading = false;
    }
  }
  const bool sumlike = op == ReduceOp::Sum || op == ReduceOp::Mean;
  ACCEL_DISPATCH_ALL(in.dtype(), "reduce", [&]<typename T>() {
    auto run_out = [&]<typename O>() {
      O* o = out.data<O>();
      if (leading && sumlike && rows > 1) {
        reduce_cols_sum<T, O>(static_cast<const T*>(in.data_ptr()), rd.numel, rows, o,
                              op == ReduceOp::Mean);
        return;
      }
      // Permute kept dims first, reduced dims last; copy when not already laid out that way.
      Shape perm;
      for (int64_t d = 0; d < nd; ++d)
        if (!rd.mask[size_t(d)]) perm.push_back(d);
      for (int64_t d = 0; d < nd; ++d)
        if (rd.mask[size_t(d)]) perm.push_back(d);
      Tensor p = raw::permute(in, perm);
      if (!p.is_contiguous()) {
        Tensor c = empty(p.sizes(), TensorOptions(p.dtype(), kCPU));
        copy_stub(kCPU, c, p);
        p = c;
      }
      reduce_rows<T, O>(op, static_cast<const T*>(p.data_ptr()), rows, rd.numel, o);
    };
    if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
      ACCEL_CHECK(out.dtype() == kInt64, DTypeError, "reduce",
                  "argmax/argmin output must be int64");
      run_out.template operator()<int64_t>();
    } else {
      // Output dtype is the input's, or int64 (integer sums), or a float (means of integers).
      if (out.dtype() == in.dtype()) {
        run_out.template operator()<T>();
      } else if (out.dtype() == kInt64) {
        run_out.template operator()<int64_t>();
      } else if (out.dtype() == kFloat32) {
        run_out.template operator()<float>();
      } else if (out.dtype() == kFloat64) {
        run_out.template operator()<double>();
      } else {
        ACCEL_THROW(DTypeError, "reduce", "unsupported output dtype ", out.dtype(), " for input ",
                    in.dtype());
      }
    }
  });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(reduce_stub, CPU, ACCEL_ISA_DISPATCH(reduce_kernel));
}
#endif  // !ACCEL_ISA_NS
