// CUDA indexing: index_select, index_add, gather, scatter_add, tril/triu. Checks and layouts on
// the host, kernels in index.cu. Contract: kernels/stubs/index.h.
//
// Note [CUDA index checks]: a kernel cannot throw, and an out-of-range index must be an
// IndexError, never a wild read or write. Each op first runs a check kernel over the indices
// and copies back {first bad position, count}; the host throws before the op's kernel is queued.
// That costs one small synchronous copy per call (a few microseconds plus waiting for the queued
// work) -- once or twice per training step for embeddings and the loss.
#include "kernels/common/geometry.h"
#include "kernels/stubs/index.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {

int64_t check_indices(const Tensor& index, int64_t size, int64_t dim, const Tensor& indexed,
                      const char* op, bool has_ignore, int64_t ignore) {
  ACCEL_CHECK(index.dtype() == kInt32 || index.dtype() == kInt64, DTypeError, op,
              "indices must be int32 or int64, got ", index.dtype());
  ACCEL_CHECK(index.is_contiguous(), ValueError, op, "indices must be contiguous, got strides ",
              index.strides());
  const int64_t n = index.numel();
  if (n == 0) return 0;
  const int dev = index.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  Tensor result = empty({2}, TensorOptions(kInt64, index.device()));
  unsigned long long init[2] = {~0ull, 0};
  ACCEL_CUDA_CHECK(
      cudaMemcpyAsync(result.data_ptr(), init, sizeof(init), cudaMemcpyHostToDevice, s));
  launch_check_indices(code_of(index.dtype()), index.data_ptr(), n, size, has_ignore, ignore,
                       static_cast<unsigned long long*>(result.data_ptr()), max_blocks(dev), s);
  unsigned long long host[2];
  ACCEL_CUDA_CHECK(
      cudaMemcpyAsync(host, result.data_ptr(), sizeof(host), cudaMemcpyDeviceToHost, s));
  ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  if (host[0] != ~0ull) {
    int64_t v = 0;
    const size_t es = index.element_size();
    const char* p = static_cast<const char*>(index.data_ptr()) + host[0] * es;
    if (index.dtype() == kInt32) {
      int32_t v32 = 0;
      ACCEL_CUDA_CHECK(cudaMemcpy(&v32, p, es, cudaMemcpyDeviceToHost));
      v = v32;
    } else {
      ACCEL_CUDA_CHECK(cudaMemcpy(&v, p, es, cudaMemcpyDeviceToHost));
    }
    if (has_ignore) {
      ACCEL_THROW(IndexError, op, "target ", v, " at position ", host[0], " is out of bounds for ",
                  size, " classes (ignore_index is ", ignore, ")");
    }
    ACCEL_THROW(IndexError, op, "index ", v, " is out of bounds for dimension ", dim, " with size ",
                size, " (shape ", indexed.sizes(), ")");
  }
  return has_ignore ? int64_t(host[1]) : n;
}

namespace {

void same_device(const Tensor& a, const Tensor& b, const char* op) {
  ACCEL_CHECK(a.device() == b.device(), DeviceError, op,
              "tensors on different devices: ", a.device(), " ", a.sizes(), " and ", b.device(),
              " ", b.sizes());
}

void index_select_kernel(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out,
                         const char* op) {
  same_device(x, index, op);
  same_device(x, out, op);
  const common::RowGeometry g = common::row_geometry(x.sizes(), dim);
  const int64_t k = index.numel();
  DeviceGuard guard(x.device());
  check_indices(index, g.n, dim, x, op);
  if (out.numel() == 0) return;
  launch_index_select(int(x.element_size()), x.data_ptr(), code_of(index.dtype()), index.data_ptr(),
                      g.outer, g.n, g.inner, k, out.data_ptr(), current_stream().handle());
}

void index_add_kernel(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                      const char* op) {
  same_device(out, index, op);
  same_device(out, src, op);
  const common::RowGeometry g = common::row_geometry(out.sizes(), dim);
  const int64_t k = index.numel();
  DeviceGuard guard(out.device());
  check_indices(index, g.n, dim, out, op);
  if (src.numel() == 0) return;
  launch_index_add(code_of(out.dtype()), out.data_ptr(), code_of(index.dtype()), index.data_ptr(),
                   src.data_ptr(), g.outer, g.n, g.inner, k, current_stream().handle());
}

// `t` viewed with `sizes`, its strides, and stride 0 along `dim` (no autograd).
Tensor view_with_dim_zeroed(const Tensor& t, const Shape& sizes, int64_t dim) {
  Shape st = t.strides();
  st[size_t(dim)] = 0;
  return Tensor(make_intrusive<TensorImpl>(t.storage(), sizes, st, t.offset(), t.dtype()));
}

void gather_kernel(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out, const char* op) {
  same_device(x, index, op);
  same_device(x, out, op);
  ACCEL_INTERNAL_ASSERT(index.dim() == x.dim());
  DeviceGuard guard(x.device());
  check_indices(index, x.sizes()[size_t(dim)], dim, x, op);
  if (index.numel() == 0) return;
  const Tensor xv = view_with_dim_zeroed(x, index.sizes(), dim);
  const Tensor* ops[3] = {&out, &index, &xv};
  const int64_t xs = x.strides()[size_t(dim)];
  cudaStream_t s = current_stream().handle();
  const int mb = max_blocks(x.device().index);
  for_each_32bit_piece<3>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<3> calc = make_offset_calc<3>(pc, op);
    launch_gather(int(x.element_size()), pc[2]->data_ptr(), code_of(index.dtype()),
                  pc[1]->data_ptr(), pc[0]->data_ptr(), pc[0]->numel(), calc, xs, mb, s);
  });
}

void scatter_add_kernel(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                        const char* op) {
  same_device(out, index, op);
  same_device(out, src, op);
  ACCEL_INTERNAL_ASSERT(index.dim() == out.dim() && src.dim() == out.dim());
  DeviceGuard guard(out.device());
  check_indices(index, out.sizes()[size_t(dim)], dim, out, op);
  if (index.numel() == 0) return;
  const Tensor ov = view_with_dim_zeroed(out, index.sizes(), dim);
  const Tensor sv(make_intrusive<TensorImpl>(src.storage(), index.sizes(), src.strides(),
                                             src.offset(), src.dtype()));
  const Tensor* ops[3] = {&index, &ov, &sv};
  const int64_t os = out.strides()[size_t(dim)];
  cudaStream_t s = current_stream().handle();
  const int mb = max_blocks(out.device().index);
  for_each_32bit_piece<3>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<3> calc = make_offset_calc<3>(pc, op);
    launch_scatter_add(code_of(out.dtype()), pc[1]->data_ptr(), code_of(index.dtype()),
                       pc[0]->data_ptr(), pc[2]->data_ptr(), pc[0]->numel(), calc, os, mb, s);
  });
}

void trilu_kernel(const Tensor& x, int64_t diagonal, bool upper, Tensor& out) {
  const char* op = upper ? "triu" : "tril";
  same_device(x, out, op);
  if (x.numel() == 0) return;
  ACCEL_INTERNAL_ASSERT(x.dim() >= 2 && x.is_contiguous() && out.is_contiguous() &&
                        out.sizes() == x.sizes());
  const int64_t nr = x.sizes()[size_t(x.dim() - 2)], nc = x.sizes()[size_t(x.dim() - 1)];
  DeviceGuard guard(x.device());
  launch_trilu(int(x.element_size()), x.data_ptr(), out.data_ptr(), x.numel() / (nr * nc), nr, nc,
               diagonal, upper, max_blocks(x.device().index), current_stream().handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(index_select_stub, CUDA, &cuda::index_select_kernel);
ACCEL_REGISTER_KERNEL(index_add_stub, CUDA, &cuda::index_add_kernel);
ACCEL_REGISTER_KERNEL(gather_stub, CUDA, &cuda::gather_kernel);
ACCEL_REGISTER_KERNEL(scatter_add_stub, CUDA, &cuda::scatter_add_kernel);
ACCEL_REGISTER_KERNEL(trilu_stub, CUDA, &cuda::trilu_kernel);
}  // namespace accel
