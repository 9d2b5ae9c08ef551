// CUDA reductions: layout planning on the host; kernels in reduce.cu. Same contract and output
// dtypes as kernels/cpu/reduce.cc.
#include <cmath>

#include "core/raw.h"
#include "kernels/common/acc_dtype.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// A row shorter than kSplitMinRow stays in one block; a longer one is split into chunks of at
// least kMinChunk when there are too few rows to fill the GPU. Columns (one thread per column,
// 32 columns per block) split sooner: a bias gradient over 8192 rows of 768 columns is only 24
// blocks otherwise.
constexpr int64_t kSplitMinRow = 16384;
constexpr int64_t kMinChunk = 4096;
constexpr int64_t kSplitMinCol = 512;
constexpr int64_t kMinColChunk = 128;
constexpr int64_t kMaxSplits = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of a reduction of length n when `parallel` independent outputs exist.
int64_t plan_splits(int64_t n, int64_t parallel, int sms, int64_t min_n, int64_t min_chunk) {
  if (n < min_n || parallel >= 2 * int64_t(sms)) return 1;
  const int64_t want = ceil_div(4 * int64_t(sms), parallel);
  return std::clamp<int64_t>(std::min(want, ceil_div(n, min_chunk)), 1, kMaxSplits);
}

// x: (rows, n) contiguous.
void reduce_rows(ROp op, const Tensor& x, int64_t rows, int64_t n, Tensor& out, int dev,
                 cudaStream_t s) {
  const bool arg = op == ROp::ArgMax || op == ROp::ArgMin;
  const int64_t mean_div = op == ROp::Mean ? n : 0;
  const int64_t splits =
      arg ? 1 : plan_splits(n, rows, multiprocessor_count(dev), kSplitMinRow, kMinChunk);
  if (splits == 1) {
    launch_reduce_rows(op, code_of(x.dtype()), x.data_ptr(), rows, n, 1, n, code_of(out.dtype()),
                       out.data_ptr(), mean_div, s);
    return;
  }
  const int64_t chunk = ceil_div(n, splits);
  const int64_t used = ceil_div(n, chunk);
  const DType acc = (op == ROp::Sum || op == ROp::Mean || op == ROp::Prod)
                        ? sum_acc_dtype(x.dtype())
                        : acc_dtype(x.dtype());
  Tensor partial = empty({rows, used}, TensorOptions(acc, out.device()));
  launch_reduce_rows(op, code_of(x.dtype()), x.data_ptr(), rows, n, used, chunk, code_of(acc),
                     partial.data_ptr(), 0, s);
  launch_reduce_rows(op, code_of(acc), partial.data_ptr(), rows, used, 1, used,
                     code_of(out.dtype()), out.data_ptr(), mean_div, s);
}

// x: (n, cols) contiguous, sum over n.
void reduce_cols(bool mean, const Tensor& x, int64_t n, int64_t cols, Tensor& out, int dev,
                 cudaStream_t s) {
  const int64_t mean_div = mean ? n : 0;
  const int64_t splits =
      plan_splits(n, ceil_div(cols, 32), multiprocessor_count(dev), kSplitMinCol, kMinColChunk);
  if (splits == 1) {
    launch_reduce_cols(code_of(x.dtype()), x.data_ptr(), n, cols, 1, n, code_of(out.dtype()),
                       out.data_ptr(), mean_div, s);
    return;
  }
  const int64_t chunk = ceil_div(n, splits);
  const int64_t used = ceil_div(n, chunk);
  const DType acc = sum_acc_dtype(x.dtype());
  Tensor partial = empty({used, cols}, TensorOptions(acc, out.device()));
  launch_reduce_cols(code_of(x.dtype()), x.data_ptr(), n, cols, used, chunk, code_of(acc),
                     partial.data_ptr(), 0, s);
  launch_reduce_cols(code_of(acc), partial.data_ptr(), used, cols, 1, used, code_of(out.dtype()),
                     out.data_ptr(), mean_div, s);
}

void reduce_kernel(ReduceOp op, const Tensor& in, const Shape& dims, Tensor& out) {
  // The op layer (autograd/ops/reduce.cc) validated the call (kernels/stubs/reduce.h).
  ACCEL_INTERNAL_ASSERT(in.device() == out.device());
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
  ACCEL_INTERNAL_ASSERT(out.is_contiguous());
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  if (arg) {
    ACCEL_INTERNAL_ASSERT(out.dtype() == kInt64);
  } else {
    ACCEL_INTERNAL_ASSERT(out.dtype() == in.dtype() || out.dtype() == kInt64 ||
                          out.dtype() == kFloat32 || out.dtype() == kFloat64);
  }
  const int dev = out.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const bool sumlike = op == ReduceOp::Sum || op == ReduceOp::Mean;

  // Reduced dims leading and the input contiguous: a column reduction, no copy.
  bool leading = in.is_contiguous();
  {
    bool seen_kept = false;
    for (int64_t d = 0; d < nd && leading; ++d) {
      if (!rd.mask[size_t(d)]) {
        seen_kept = true;
      } else if (seen_kept) {
        leading = false;
      }
    }
  }
  if (leading && sumlike && rows > 1) {
    reduce_cols(op == ReduceOp::Mean, in, rd.numel, rows, out, dev, s);
    return;
  }
  // Kept dims first, reduced dims last; copy when the input is not already laid out that way.
  Shape perm;
  for (int64_t d = 0; d < nd; ++d)
    if (!rd.mask[size_t(d)]) perm.push_back(d);
  for (int64_t d = 0; d < nd; ++d)
    if (rd.mask[size_t(d)]) perm.push_back(d);
  Shape psizes, pstrides;
  for (int64_t d : perm) {
    psizes.push_back(in.sizes()[size_t(d)]);
    pstrides.push_back(in.strides()[size_t(d)]);
  }
  Tensor p(make_intrusive<TensorImpl>(in.storage(), psizes, pstrides, in.offset(), in.dtype()));
  if (!p.is_contiguous()) {
    Tensor c = empty(p.sizes(), TensorOptions(p.dtype(), p.device()));
    copy_stub(p.device(), c, p);
    p = c;
  }
  reduce_rows(ROp(op), p, rows, rd.numel, out, dev, s);
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(reduce_stub, CUDA, &cuda::reduce_kernel);
}
