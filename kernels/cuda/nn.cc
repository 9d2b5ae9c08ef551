// CUDA softmax, layer_norm / rms_norm, cross_entropy and nll_loss: checks on the host, kernels in
// nn.cu. Contract: kernels/stubs/nn.h (all tensors contiguous, statistics in the accumulate type).
#include "core/raw.h"
#include "kernels/common/acc_dtype.h"
#include "kernels/common/geometry.h"
#include "kernels/stubs/nn.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// The op layer (autograd/ops/nn.cc) validated shapes and dtypes and made every tensor contiguous
// on x's device (kernels/stubs/nn.h). The asserts stay because they are cheap and a kernel called
// directly with a mix of devices would read foreign memory.
void assert_float(const Tensor& t, const char*) { ACCEL_INTERNAL_ASSERT(is_floating(t.dtype())); }

// Every defined tensor contiguous and on `d`.
void assert_contract(std::initializer_list<const Tensor*> ts, Device d, const char*) {
  for (const Tensor* t : ts)
    ACCEL_INTERNAL_ASSERT(!t->defined() || (t->device() == d && t->is_contiguous()));
}

const void* ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

void softmax_kernel(const Tensor& x, int64_t dim, bool log, Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  assert_float(x, op);
  assert_contract({&x, &y}, x.device(), op);
  if (x.numel() == 0) return;
  const common::RowGeometry g = common::row_geometry(x.sizes(), dim);
  DeviceGuard guard(x.device());
  launch_softmax(code_of(x.dtype()), x.data_ptr(), y.data_ptr(), g.outer, g.n, g.inner, log,
                 max_blocks(x.device().index), current_stream().handle());
}

void softmax_backward_kernel(const Tensor& grad, const Tensor& y, int64_t dim, bool log,
                             Tensor& dx) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  assert_float(y, op);
  assert_contract({&grad, &y, &dx}, y.device(), op);
  if (y.numel() == 0) return;
  const common::RowGeometry g = common::row_geometry(y.sizes(), dim);
  DeviceGuard guard(y.device());
  launch_softmax_backward(code_of(y.dtype()), grad.data_ptr(), y.data_ptr(), dx.data_ptr(), g.outer,
                          g.n, g.inner, log, max_blocks(y.device().index),
                          current_stream().handle());
}

void norm_forward(const char* op, bool rms, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, int64_t n, double eps, Tensor& y, Tensor* mean,
                  Tensor& rstd) {
  assert_float(x, op);
  assert_contract({&x, &weight, &bias, &y, &rstd}, x.device(), op);
  const DType acc = acc_dtype(x.dtype());
  ACCEL_INTERNAL_ASSERT(rstd.dtype() == acc && (!mean || mean->dtype() == acc));
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  if (rows == 0) return;
  DeviceGuard guard(x.device());
  launch_norm_forward(code_of(x.dtype()), rms, x.data_ptr(), ptr(weight), rms ? nullptr : ptr(bias),
                      rows, n, eps, y.data_ptr(), mean ? mean->data_ptr() : nullptr,
                      rstd.data_ptr(), current_stream().handle());
}

// Rows per split of the dweight/dbias column sums: enough splits to fill the GPU, each long
// enough to amortise its partial row.
constexpr int64_t kRowsPerSplit = 128;
constexpr int64_t kMaxSplits = 512;

void norm_backward(const char* op, bool rms, const Tensor& grad, const Tensor& x,
                   const Tensor* mean, const Tensor& rstd, const Tensor& weight, int64_t n,
                   Tensor& dx, Tensor& dweight, Tensor* dbias) {
  assert_float(x, op);
  assert_contract({&grad, &x, &rstd, &weight, &dx, &dweight}, x.device(), op);
  if (dbias) assert_contract({dbias}, x.device(), op);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  DeviceGuard guard(x.device());
  cudaStream_t s = current_stream().handle();
  const Code t = code_of(x.dtype());
  const void* mp = mean ? mean->data_ptr() : nullptr;
  if (rows > 0 && dx.defined()) {
    launch_norm_backward_dx(t, rms, grad.data_ptr(), x.data_ptr(), mp, rstd.data_ptr(), ptr(weight),
                            rows, n, dx.data_ptr(), s);
  }
  const bool want_dw = dweight.defined(), want_db = dbias && dbias->defined();
  if (!want_dw && !want_db) return;
  if (rows == 0) {
    if (want_dw) raw::fill_(dweight, 0);
    if (want_db) raw::fill_(*dbias, 0);
    return;
  }
  const int64_t splits =
      std::clamp<int64_t>((rows + kRowsPerSplit - 1) / kRowsPerSplit, 1, kMaxSplits);
  Tensor partial = empty({splits, 2, n}, TensorOptions(acc_dtype(x.dtype()), x.device()));
  launch_norm_backward_params(t, grad.data_ptr(), x.data_ptr(), mp, rstd.data_ptr(), rows, n,
                              splits, partial.data_ptr(), want_dw ? dweight.data_ptr() : nullptr,
                              want_db ? dbias->data_ptr() : nullptr, s);
}

void layer_norm_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                       double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  norm_forward("layer_norm", false, x, weight, bias, n, eps, y, &mean, rstd);
}

void layer_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& weight, int64_t n, Tensor& dx,
                                Tensor& dweight, Tensor& dbias) {
  norm_backward("layer_norm_backward", false, grad, x, &mean, rstd, weight, n, dx, dweight, &dbias);
}

void rms_norm_kernel(const Tensor& x, const Tensor& weight, int64_t n, double eps, Tensor& y,
                     Tensor& rstd) {
  norm_forward("rms_norm", true, x, weight, Tensor(), n, eps, y, nullptr, rstd);
}

void rms_norm_backward_kernel(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                              const Tensor& weight, int64_t n, Tensor& dx, Tensor& dweight) {
  norm_backward("rms_norm_backward", true, grad, x, nullptr, rstd, weight, n, dx, dweight, nullptr);
}

void cross_entropy_kernel(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          double label_smoothing, const char* op, Tensor& loss, Tensor& lse,
                          Tensor& valid) {
  assert_float(logits, op);
  assert_contract({&logits, &target, &loss, &lse, &valid}, logits.device(), op);
  const int64_t rows = logits.sizes()[0], classes = logits.sizes()[1];
  DeviceGuard guard(logits.device());
  const int64_t n_valid = check_indices(target, classes, 1, logits, op, true, ignore_index);
  if (rows > 0) {
    launch_cross_entropy(code_of(logits.dtype()), code_of(target.dtype()), logits.data_ptr(),
                         target.data_ptr(), rows, classes, ignore_index, label_smoothing,
                         loss.data_ptr(), lse.data_ptr(), current_stream().handle());
  }
  raw::fill_(valid, double(n_valid));
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, int64_t ignore_index, double label_smoothing,
                                   Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  assert_float(logits, op);
  assert_contract({&grad, &logits, &target, &lse, &dlogits}, logits.device(), op);
  const int64_t rows = logits.sizes()[0], classes = logits.sizes()[1];
  if (rows == 0) return;
  DeviceGuard guard(logits.device());
  launch_cross_entropy_backward(code_of(logits.dtype()), code_of(target.dtype()), grad.data_ptr(),
                                grad.numel() != 1, logits.data_ptr(), target.data_ptr(),
                                lse.data_ptr(), rows, classes, ignore_index, label_smoothing,
                                dlogits.data_ptr(), current_stream().handle());
}

// weight: undefined or (C) of log_probs' dtype (kernels/stubs/nn.h); null on the device side.
const void* weight_ptr(const Tensor& weight) {
  return weight.defined() ? weight.data_ptr() : nullptr;
}

void nll_loss_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                     int64_t ignore_index, const char* op, Tensor& loss, Tensor& valid) {
  assert_float(log_probs, op);
  assert_contract({&log_probs, &target, &loss, &valid}, log_probs.device(), op);
  if (weight.defined()) assert_contract({&weight}, log_probs.device(), op);
  const int64_t rows = log_probs.sizes()[0], classes = log_probs.sizes()[1];
  DeviceGuard guard(log_probs.device());
  const int64_t n_valid = check_indices(target, classes, 1, log_probs, op, true, ignore_index);
  if (rows > 0) {
    launch_nll_loss(code_of(log_probs.dtype()), code_of(target.dtype()), log_probs.data_ptr(),
                    target.data_ptr(), weight_ptr(weight), rows, classes, ignore_index,
                    loss.data_ptr(), current_stream().handle());
  }
  if (weight.defined() && rows > 0) {
    // The weighted mean's denominator: sum of w[target] over the rows not ignored, on the device.
    launch_nll_weight_sum(code_of(log_probs.dtype()), code_of(target.dtype()), target.data_ptr(),
                          weight.data_ptr(), rows, classes, ignore_index, valid.data_ptr(),
                          current_stream().handle());
  } else {
    raw::fill_(valid, double(n_valid));
  }
}

void nll_loss_backward_kernel(const Tensor& grad, const Tensor& target, const Tensor& weight,
                              int64_t ignore_index, Tensor& dlog_probs) {
  const char* op = "nll_loss_backward";
  assert_float(dlog_probs, op);
  assert_contract({&grad, &target, &dlog_probs}, dlog_probs.device(), op);
  if (weight.defined()) assert_contract({&weight}, dlog_probs.device(), op);
  const int64_t rows = dlog_probs.sizes()[0], classes = dlog_probs.sizes()[1];
  DeviceGuard guard(dlog_probs.device());
  raw::fill_(dlog_probs, 0);
  if (rows == 0) return;
  launch_nll_loss_backward(code_of(dlog_probs.dtype()), code_of(target.dtype()), grad.data_ptr(),
                           grad.numel() != 1, target.data_ptr(), weight_ptr(weight), rows, classes,
                           ignore_index, dlog_probs.data_ptr(), current_stream().handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(softmax_stub, CUDA, &cuda::softmax_kernel);
ACCEL_REGISTER_KERNEL(softmax_backward_stub, CUDA, &cuda::softmax_backward_kernel);
ACCEL_REGISTER_KERNEL(layer_norm_stub, CUDA, &cuda::layer_norm_kernel);
ACCEL_REGISTER_KERNEL(layer_norm_backward_stub, CUDA, &cuda::layer_norm_backward_kernel);
ACCEL_REGISTER_KERNEL(rms_norm_stub, CUDA, &cuda::rms_norm_kernel);
ACCEL_REGISTER_KERNEL(rms_norm_backward_stub, CUDA, &cuda::rms_norm_backward_kernel);
ACCEL_REGISTER_KERNEL(cross_entropy_stub, CUDA, &cuda::cross_entropy_kernel);
ACCEL_REGISTER_KERNEL(cross_entropy_backward_stub, CUDA, &cuda::cross_entropy_backward_kernel);
ACCEL_REGISTER_KERNEL(nll_loss_stub, CUDA, &cuda::nll_loss_kernel);
ACCEL_REGISTER_KERNEL(nll_loss_backward_stub, CUDA, &cuda::nll_loss_backward_kernel);
}  // namespace accel
