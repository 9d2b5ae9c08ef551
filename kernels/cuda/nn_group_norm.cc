// CUDA group_norm: checks on the host, kernels in nn_group_norm.cu. Contract: kernels/stubs/nn.h.
#include <cmath>

#include "core/raw.h"
#include "kernels/common/acc_dtype.h"
#include "kernels/stubs/nn.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// The op layer (autograd/ops/nn.cc) validated shapes and dtypes and made every tensor
// contiguous on x's device; the asserts keep a direct call from reading foreign memory.
void assert_contract(std::initializer_list<const Tensor*> ts, Device d) {
  for (const Tensor* t : ts)
    ACCEL_INTERNAL_ASSERT(!t->defined() || (t->device() == d && t->is_contiguous()));
}

const void* cptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mptr(Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// (n, c, s) of x: (N, C, *).
void geometry(const Tensor& x, int64_t& n, int64_t& c, int64_t& s) {
  n = x.size(0), c = x.size(1);
  s = n * c == 0 ? 0 : x.numel() / (n * c);
}

void group_norm_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t groups,
                       double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  ACCEL_INTERNAL_ASSERT(is_floating(x.dtype()) && x.dim() >= 2 && groups > 0);
  assert_contract({&x, &weight, &bias, &y, &mean, &rstd}, x.device());
  ACCEL_INTERNAL_ASSERT(mean.dtype() == acc_dtype(x.dtype()) && rstd.dtype() == mean.dtype());
  int64_t n, c, s;
  geometry(x, n, c, s);
  if (n * groups == 0) return;
  ACCEL_CHECK(n * groups <= INT32_MAX, ShapeError, "group_norm",
              "too many groups for one grid: ", x.sizes(), " with ", groups, " groups");
  if (s == 0 || c == 0) {  // empty groups: mean 0, rstd 1 / sqrt(eps), as the CPU kernel
    raw::fill_(mean, 0);
    raw::fill_(rstd, 1.0 / std::sqrt(eps));
    return;
  }
  DeviceGuard guard(x.device());
  launch_group_norm_forward(code_of(x.dtype()), x.data_ptr(), cptr(weight), cptr(bias), n, c, s,
                            groups, eps, y.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                            current_stream().handle());
}

void group_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& weight, int64_t groups,
                                Tensor& dx, Tensor& dweight, Tensor& dbias) {
  ACCEL_INTERNAL_ASSERT(is_floating(x.dtype()) && x.dim() >= 2 && groups > 0);
  assert_contract({&grad, &x, &mean, &rstd, &weight, &dx, &dweight, &dbias}, x.device());
  int64_t n, c, s;
  geometry(x, n, c, s);
  if (n * c == 0 || s == 0) {
    for (Tensor* t : {&dx, &dweight, &dbias})
      if (t->defined() && t->numel() > 0) raw::fill_(*t, 0);
    return;
  }
  ACCEL_CHECK(n * c <= INT32_MAX, ShapeError, "group_norm_backward",
              "too many channels for one grid: ", x.sizes());
  DeviceGuard guard(x.device());
  Tensor sums = empty({n, c, 2}, TensorOptions(acc_dtype(x.dtype()), x.device()));
  launch_group_norm_backward(code_of(x.dtype()), grad.data_ptr(), x.data_ptr(), mean.data_ptr(),
                             rstd.data_ptr(), cptr(weight), n, c, s, groups, sums.data_ptr(),
                             mptr(dx), mptr(dweight), mptr(dbias), current_stream().handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(group_norm_stub, CUDA, &cuda::group_norm_kernel);
ACCEL_REGISTER_KERNEL(group_norm_backward_stub, CUDA, &cuda::group_norm_backward_kernel);
}  // namespace accel
