// CPU copy (strided, broadcasting, converting) and fill.
#include <cstring>

#include "core/dispatch.h"
#include "kernels/cpu/loops.h"

namespace accel::cpu {
namespace {

void copy_kernel(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    const size_t bytes = dst.nbytes();
    char* d = static_cast<char*>(dst.data_ptr());
    const char* s = static_cast<const char*>(src.data_ptr());
    if (d == s) return;
    parallel_for(int64_t(bytes), int64_t(1) << 20, [&](int64_t b, int64_t e) {
      std::memmove(d + b, s + b, size_t(e - b));
    });
    return;
  }
  const Tensor* ops[2] = {&dst, &src};
  StridedLoop<2> loop(ops);
  ACCEL_DISPATCH_ALL(dst.dtype(), "copy_", [&]<typename D>() {
    ACCEL_DISPATCH_ALL(src.dtype(), "copy_", [&]<typename S>() {
      loop.run([](char* const* p, const int64_t* st, int64_t n) {
        char* d = p[0];
        const char* s = p[1];
        if (st[0] == sizeof(D) && st[1] == sizeof(S)) {
          D* dd = reinterpret_cast<D*>(d);
          const S* ss = reinterpret_cast<const S*>(s);
          for (int64_t i = 0; i < n; ++i) dd[i] = cast<D>(ss[i]);
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<D*>(d + i * st[0]) = cast<D>(*reinterpret_cast<const S*>(s + i * st[1]));
        }
      });
    });
  });
}

void fill_kernel(Tensor& dst, Scalar v) {
  if (dst.numel() == 0) return;
  ACCEL_DISPATCH_ALL(dst.dtype(), "fill_", [&]<typename T>() {
    T value;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      value = v.is_int ? T(v.i) : T(v.d);
    } else {
      value = cast<T>(v.to_double());
    }
    const Tensor* ops[1] = {&dst};
    StridedLoop<1> loop(ops);
    loop.run([value](char* const* p, const int64_t* st, int64_t n) {
      if (st[0] == sizeof(T)) {
        T* d = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) d[i] = value;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st[0]) = value;
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(copy_stub, CPU, &cpu::copy_kernel);
ACCEL_REGISTER_KERNEL(fill_stub, CPU, &cpu::fill_kernel);
}  // namespace accel
