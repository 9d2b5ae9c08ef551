// CPU classification losses over rows: fused log-softmax + NLL (cross_entropy) and nll_loss,
// forward and backward. logits/log_probs: contiguous (R, C); target: contiguous (R).
//
// Targets are validated in one serial pass before the parallel loops (an exception must never
// leave an OpenMP region), which also counts the rows that are not ignored.
#include <cmath>

#include "core/raw.h"
#include "kernels/stubs/nn.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/cpu_isa.h"

// One pass per instruction-set level (Note [portable builds and ISA dispatch] in cpu_isa.h).
#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "kernels/cpu/nn_loss.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::cpu::ACCEL_ISA_NS {
namespace {

constexpr int64_t kLossGrain = kParallelGrain / 4;

template <typename I>
int64_t check_targets(const I* t, int64_t rows, int64_t classes, int64_t ignore_index,
                      const char* op) {
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t v = int64_t(t[r]);
    if (v == ignore_index) continue;
    ACCEL_CHECK(v >= 0 && v < classes, IndexError, op, "target ", v, " at position ", r,
                " is out of bounds for ", classes, " classes (ignore_index is ", ignore_index, ")");
    ++valid;
  }
  return valid;
}

int64_t row_grain(int64_t c) { return std::max<int64_t>(1, kLossGrain / std::max<int64_t>(c, 1)); }

// dr[c] = g * (exp(x[c] - lse) - ls / C - (1 - ls) [c == t]). Kept out of the dispatch macros:
// a pragma cannot sit inside a macro argument.
template <typename T>
void cross_entropy_grad_row(const T* xr, int64_t classes, int64_t t, acc_t<T> g, acc_t<T> lse,
                            acc_t<T> ls, acc_t<T> smooth, T* dr) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
#pragma omp simd
    for (int64_t c = 0; c < classes; ++c) dr[c] = g * (exp_acc<A>(xr[c] - lse) - smooth);
    dr[t] -= g * (A(1) - ls);
  } else {
    for (int64_t c = 0; c < classes; ++c) {
      const A onehot = c == t ? A(1) - ls : A(0);
      dr[c] = cast<T>(g * (exp_acc<A>(cast<A>(xr[c]) - lse) - smooth - onehot));
    }
  }
}

void cross_entropy_kernel(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          double label_smoothing, const char* op, Tensor& loss, Tensor& lse,
                          Tensor& valid) {
  const int64_t rows = logits.sizes()[0], classes = logits.sizes()[1];
  ACCEL_DISPATCH_FLOATING(logits.dtype(), op, [&]<typename T>() {
    using A = acc_t<T>;
    ACCEL_DISPATCH_INDEX(target.dtype(), op, [&]<typename I>() {
      const I* tp = static_cast<const I*>(target.data_ptr());
      const int64_t n_valid = check_targets(tp, rows, classes, ignore_index, op);
      const T* xp = static_cast<const T*>(logits.data_ptr());
      // Losses in T, or in A for 16-bit logits under autocast (Note [autocast cross-entropy]).
      const bool acc_out = loss.dtype() != logits.dtype();
      T* lp = acc_out ? nullptr : static_cast<T*>(loss.data_ptr());
      A* la = acc_out ? loss.data<A>() : nullptr;
      auto put = [&](int64_t r, A v) {
        if (acc_out) {
          la[r] = v;
        } else {
          lp[r] = cast<T>(v);
        }
      };
      A* sp = lse.data<A>();
      const A ls = A(label_smoothing), inv_c = A(1) / A(classes);
      parallel_for(rows, row_grain(classes), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* xr = xp + r * classes;
          const A m = row_max(xr, classes);
          const A l = m + std::log(row_sum_exp(xr, classes, m));
          sp[r] = l;
          const int64_t t = int64_t(tp[r]);
          if (t == ignore_index) {
            put(r, A(0));
            continue;
          }
          A v = l - cast<A>(xr[t]);
          if (ls != A(0)) v = (A(1) - ls) * v + ls * (l - row_sum(xr, classes) * inv_c);
          put(r, v);
        }
      });
      if (acc_out) {
        *valid.data<A>() = A(n_valid);
      } else {
        *static_cast<T*>(valid.data_ptr()) = cast<T>(A(n_valid));
      }
    });
  });
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, int64_t ignore_index, double label_smoothing,
                                   Tensor& dlogits) {
  const int64_t rows = logits.sizes()[0], classes = logits.sizes()[1];
  ACCEL_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using A = acc_t<T>;
    ACCEL_DISPATCH_INDEX(target.dtype(), "cross_entropy_backward", [&]<typename I>() {
      const I* tp = static_cast<const I*>(target.data_ptr());
      const T* xp = static_cast<const T*>(logits.data_ptr());
      // The row gradients in T, or in A (Note [autocast cross-entropy]).
      const bool acc_grad = grad.dtype() != logits.dtype();
      const T* gp = acc_grad ? nullptr : static_cast<const T*>(grad.data_ptr());
      const A* ga = acc_grad ? grad.data<A>() : nullptr;
      const bool per_row = grad.numel() != 1;
      const A* sp = lse.data<A>();
      T* dp = static_cast<T*>(dlogits.data_ptr());
      const A ls = A(label_smoothing), smooth = A(label_smoothing) / A(classes);
      parallel_for(rows, row_grain(classes), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          T* dr = dp + r * classes;
          const int64_t t = int64_t(tp[r]);
          if (t == ignore_index) {
            for (int64_t c = 0; c < classes; ++c) dr[c] = cast<T>(A(0));
            continue;
          }
          const T* xr = xp + r * classes;
          const A g = acc_grad ? ga[per_row ? r : 0] : cast<A>(gp[per_row ? r : 0]);
          const A l = sp[r];
          cross_entropy_grad_row(xr, classes, t, g, l, ls, smooth, dr);
        }
      });
    });
  });
}

void nll_loss_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                     int64_t ignore_index, const char* op, Tensor& loss, Tensor& valid) {
  const int64_t rows = log_probs.sizes()[0], classes = log_probs.sizes()[1];
  ACCEL_DISPATCH_FLOATING(log_probs.dtype(), op, [&]<typename T>() {
    using A = acc_t<T>;
    ACCEL_DISPATCH_INDEX(target.dtype(), op, [&]<typename I>() {
      const I* tp = static_cast<const I*>(target.data_ptr());
      const int64_t n_valid = check_targets(tp, rows, classes, ignore_index, op);
      const T* xp = static_cast<const T*>(log_probs.data_ptr());
      const T* wp = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
      T* lp = static_cast<T*>(loss.data_ptr());
      A wsum = A(0);  // the weighted mean's denominator, summed in row order
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = int64_t(tp[r]);
        if (t == ignore_index) {
          lp[r] = cast<T>(A(0));
          continue;
        }
        const A w = wp ? cast<A>(wp[t]) : A(1);
        wsum += w;
        lp[r] = cast<T>(-w * cast<A>(xp[r * classes + t]));
      }
      *static_cast<T*>(valid.data_ptr()) = cast<T>(wp ? wsum : A(n_valid));
    });
  });
}

void nll_loss_backward_kernel(const Tensor& grad, const Tensor& target, const Tensor& weight,
                              int64_t ignore_index, Tensor& dlog_probs) {
  const int64_t rows = dlog_probs.sizes()[0], classes = dlog_probs.sizes()[1];
  raw::fill_(dlog_probs, 0);
  ACCEL_DISPATCH_FLOATING(dlog_probs.dtype(), "nll_loss_backward", [&]<typename T>() {
    using A = acc_t<T>;
    ACCEL_DISPATCH_INDEX(target.dtype(), "nll_loss_backward", [&]<typename I>() {
      const I* tp = static_cast<const I*>(target.data_ptr());
      const T* gp = static_cast<const T*>(grad.data_ptr());
      const bool per_row = grad.numel() != 1;
      const T* wp = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
      T* dp = static_cast<T*>(dlog_probs.data_ptr());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = int64_t(tp[r]);
        if (t == ignore_index) continue;
        const A w = wp ? cast<A>(wp[t]) : A(1);
        dp[r * classes + t] = cast<T>(-w * cast<A>(gp[per_row ? r : 0]));
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)

namespace accel {
ACCEL_REGISTER_KERNEL(cross_entropy_stub, CPU, ACCEL_ISA_DISPATCH(cross_entropy_kernel));
ACCEL_REGISTER_KERNEL(cross_entropy_backward_stub, CPU,
                      ACCEL_ISA_DISPATCH(cross_entropy_backward_kernel));
ACCEL_REGISTER_KERNEL(nll_loss_stub, CPU, ACCEL_ISA_DISPATCH(nll_loss_kernel));
ACCEL_REGISTER_KERNEL(nll_loss_backward_stub, CPU, ACCEL_ISA_DISPATCH(nll_loss_backward_kernel));
}  // namespace accel
#endif  // !ACCEL_ISA_NS
