// CPU tril/triu (kernels/stubs/index.h): keep or zero a prefix/suffix of every matrix row.
// cat/stack/split need no kernel of their own: they copy through copy_stub into narrowed views.
#include "kernels/stubs/index.h"
#include "kernels/cpu/loops.h"

namespace accel::cpu {
namespace {

void trilu_kernel(const Tensor& x, int64_t diagonal, bool upper, Tensor& out) {
  if (x.numel() == 0) return;
  const int64_t nr = x.sizes()[size_t(x.dim() - 2)], nc = x.sizes()[size_t(x.dim() - 1)];
  const int64_t rows = x.numel() / nc;
  ACCEL_DISPATCH_ALL(x.dtype(), upper ? "triu" : "tril", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const T zero = cast<T>(0);
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / nc), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t i = r % nr;
        const T* xr = xp + r * nc;
        T* orow = op + r * nc;
        // tril keeps columns j <= i + diagonal; triu keeps j >= i + diagonal.
        const int64_t split = std::clamp<int64_t>(upper ? i + diagonal : i + diagonal + 1, 0, nc);
        for (int64_t j = 0; j < split; ++j) orow[j] = upper ? zero : xr[j];
        for (int64_t j = split; j < nc; ++j) orow[j] = upper ? xr[j] : zero;
      }
    });
  });
}

}  // namespace
}  // namespace accel::cpu

namespace accel {
ACCEL_REGISTER_KERNEL(trilu_stub, CPU, &cpu::trilu_kernel);
}  // namespace accel
