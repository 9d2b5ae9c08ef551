// CUDA sorting and sampling: sort / topk (one bitonic network, Note [CUDA bitonic sort] in
// sort.cu) and multinomial. Contract: kernels/stubs/sort.h.
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"
#include "kernels/stubs/sort.h"

namespace accel::cuda {
namespace {

void sort_kernel(const Tensor& x, int64_t k, bool descending, Tensor& values, Tensor& indices) {
  ACCEL_INTERNAL_ASSERT(x.dim() == 2 && x.is_contiguous() && values.is_contiguous() &&
                        indices.is_contiguous() && indices.dtype() == kInt64);
  ACCEL_CHECK(x.device() == values.device() && x.device() == indices.device(), DeviceError, "sort",
              "tensors on different devices: ", x.device(), ", ", values.device(), ", ",
              indices.device());
  const int64_t rows = x.sizes()[0], n = x.sizes()[1];
  if (rows == 0 || k == 0) return;
  int64_t p = 1;
  while (p < n) p <<= 1;
  DeviceGuard guard(x.device());
  Tensor keys = empty({rows, p}, TensorOptions(x.dtype(), x.device()));
  Tensor idx = empty({rows, p}, TensorOptions(kInt64, x.device()));
  launch_sort(code_of(x.dtype()), x.data_ptr(), rows, n, p, k, descending, keys.data_ptr(),
              static_cast<int64_t*>(idx.data_ptr()), values.data_ptr(),
              static_cast<int64_t*>(indices.data_ptr()), max_blocks(x.device().index),
              current_stream().handle());
}

void multinomial_kernel(const Tensor& probs, const Tensor& uniforms, Tensor& out) {
  ACCEL_INTERNAL_ASSERT(probs.dim() == 2 && probs.is_contiguous() && uniforms.is_contiguous() &&
                        uniforms.dtype() == kFloat64 && out.dtype() == kInt64);
  ACCEL_CHECK(is_floating(probs.dtype()), DTypeError, "multinomial",
              "probabilities must be floating, got ", probs.dtype());
  const int64_t rows = probs.sizes()[0], n = probs.sizes()[1], s = uniforms.sizes()[1];
  if (rows == 0 || s == 0) return;
  DeviceGuard guard(probs.device());
  Tensor cdf = empty({rows, n}, TensorOptions(kFloat64, probs.device()));
  Tensor last = empty({rows}, TensorOptions(kInt64, probs.device()));
  launch_multinomial(code_of(probs.dtype()), probs.data_ptr(),
                     static_cast<const double*>(uniforms.data_ptr()), rows, n, s,
                     static_cast<double*>(cdf.data_ptr()), static_cast<int64_t*>(last.data_ptr()),
                     static_cast<int64_t*>(out.data_ptr()), max_blocks(probs.device().index),
                     current_stream().handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(sort_stub, CUDA, &cuda::sort_kernel);
ACCEL_REGISTER_KERNEL(multinomial_stub, CUDA, &cuda::multinomial_kernel);
}  // namespace accel
