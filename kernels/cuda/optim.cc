// CUDA fused Adam/AdamW step: checks on the host, kernel in optim.cu.
#include "kernels/stubs/optim.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

void adamw_kernel(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const AdamStepParams& hp) {
  const char* op = "adamw_step";
  const Tensor* ts[4] = {&param, &grad, &exp_avg, &exp_avg_sq};
  for (const Tensor* t : ts) {
    ACCEL_CHECK(t->device() == param.device(), DeviceError, op,
                "tensors on different devices: param on ", param.device(), ", another on ",
                t->device());
    ACCEL_CHECK(t->is_contiguous() && t->numel() == param.numel(), ShapeError, op,
                "param, grad and states must be contiguous with one size: param ", param.sizes(),
                ", got ", t->sizes(), " strides ", t->strides());
  }
  ACCEL_CHECK(is_floating(param.dtype()) && grad.dtype() == param.dtype(), DTypeError, op,
              "param and grad must share a floating dtype, got ", param.dtype(), " and ",
              grad.dtype());
  const DType st = exp_avg.dtype();
  const bool half_param = param.dtype() == kFloat16 || param.dtype() == kBFloat16;
  ACCEL_CHECK(exp_avg_sq.dtype() == st && (st == param.dtype() || (half_param && st == kFloat32)),
              DTypeError, op,
              "optimizer states must have the param dtype (or float32 for 16-bit params); param ",
              param.dtype(), ", states ", st, " and ", exp_avg_sq.dtype());
  if (param.numel() == 0) return;
  const AdamScalars sc = common::adam_scalars(hp);
  const int dev = param.device().index;
  DeviceGuard g(dev);
  launch_adam(code_of(param.dtype()), code_of(st), param.data_ptr(), grad.data_ptr(),
              exp_avg.data_ptr(), exp_avg_sq.data_ptr(), param.numel(), sc, max_blocks(dev),
              current_stream(dev).handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(adamw_stub, CUDA, &cuda::adamw_kernel);
}
