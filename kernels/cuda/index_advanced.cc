// CUDA advanced indexing: index, index_put, nonzero. Layouts on the host, kernels in
// index_advanced.cu. Contract: kernels/stubs/index.h. The offsets arrive checked (the op checks
// the index values with framework ops, Note [advanced indexing as offsets]), so these kernels
// read and write only in bounds.
#include <vector>

#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"
#include "kernels/stubs/index.h"

namespace accel::cuda {
namespace {

void same_device(const Tensor& a, const Tensor& b, const char* op) {
  ACCEL_CHECK(a.device() == b.device(), DeviceError, op,
              "tensors on different devices: ", a.device(), " ", a.sizes(), " and ", b.device(),
              " ", b.sizes());
}

void index_kernel(const Tensor& src, const Tensor& offsets, Tensor& out) {
  same_device(out, src, "index");
  same_device(out, offsets, "index");
  ACCEL_INTERNAL_ASSERT(out.is_contiguous() && src.sizes() == out.sizes() &&
                        offsets.sizes() == out.sizes() && offsets.dtype() == kInt64);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  const Tensor* ops[3] = {&out, &src, &offsets};
  cudaStream_t s = current_stream().handle();
  const int mb = max_blocks(out.device().index);
  for_each_32bit_piece<3>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<3> calc = make_offset_calc<3>(pc, "index");
    launch_index(int(out.element_size()), pc[1]->data_ptr(),
                 static_cast<const int64_t*>(pc[2]->data_ptr()), pc[0]->data_ptr(), pc[0]->numel(),
                 calc, mb, s);
  });
}

void index_put_kernel(Tensor& dst, const Tensor& offsets, const Tensor& values, bool accumulate) {
  same_device(dst, offsets, "index_put_");
  same_device(dst, values, "index_put_");
  ACCEL_INTERNAL_ASSERT(values.dtype() == dst.dtype() && offsets.sizes() == dst.sizes() &&
                        values.sizes() == dst.sizes() && offsets.dtype() == kInt64);
  if (dst.numel() == 0) return;
  DeviceGuard guard(dst.device());
  const Tensor* ops[3] = {&dst, &values, &offsets};
  cudaStream_t s = current_stream().handle();
  const int mb = max_blocks(dst.device().index);
  for_each_32bit_piece<3>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<3> calc = make_offset_calc<3>(pc, "index_put_");
    launch_index_put(code_of(dst.dtype()), int(dst.element_size()), accumulate, pc[0]->data_ptr(),
                     pc[1]->data_ptr(), static_cast<const int64_t*>(pc[2]->data_ptr()),
                     pc[0]->numel(), calc, mb, s);
  });
}

// Two passes: per-chunk counts (read back: the output size must be known on the host, as in
// torch), then every chunk writes from its prefix offset.
Tensor nonzero_kernel(const Tensor& x) {
  ACCEL_INTERNAL_ASSERT(x.is_contiguous());
  const int64_t n = x.numel();
  const int nd = int(std::max<int64_t>(x.dim(), 1));
  ACCEL_CHECK(nd <= kMaxNonzeroDims, ShapeError, "nonzero", "tensors of rank ", nd,
              " exceed the CUDA kernel's ", kMaxNonzeroDims, " dims (shape ", x.sizes(), ")");
  const TensorOptions i64(kInt64, x.device());
  if (n == 0) return empty({0, nd}, i64);
  DeviceGuard guard(x.device());
  cudaStream_t s = current_stream().handle();
  // Chunks of at least 64 tiles, at most a few blocks per multiprocessor.
  const int64_t want =
      std::min<int64_t>(max_blocks(x.device().index), std::max<int64_t>(1, n / (64 * 256)));
  const int64_t chunk = (n + want - 1) / want;
  const int blocks = int((n + chunk - 1) / chunk);
  Tensor counts = empty({blocks}, i64);
  launch_nonzero_count(code_of(x.dtype()), x.data_ptr(), n, chunk, blocks,
                       static_cast<int64_t*>(counts.data_ptr()), s);
  std::vector<int64_t> host(size_t(blocks) + 1, 0);
  ACCEL_CUDA_CHECK(cudaMemcpyAsync(host.data() + 1, counts.data_ptr(),
                                   size_t(blocks) * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  for (int b = 0; b < blocks; ++b) host[size_t(b) + 1] += host[size_t(b)];
  const int64_t total = host[size_t(blocks)];
  Tensor out = empty({total, nd}, i64);
  if (total == 0) return out;
  ACCEL_CUDA_CHECK(cudaMemcpyAsync(counts.data_ptr(), host.data(), size_t(blocks) * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, s));
  std::vector<int64_t> sizes(size_t(nd), 1);
  for (int d = 0; d < int(x.dim()); ++d) sizes[size_t(d)] = x.sizes()[size_t(d)];
  if (x.dim() == 0) sizes[0] = 1;
  launch_nonzero_write(code_of(x.dtype()), x.data_ptr(), n, chunk, blocks,
                       static_cast<const int64_t*>(counts.data_ptr()), sizes.data(), nd,
                       static_cast<int64_t*>(out.data_ptr()), s);
  // `host` is read by the async upload above: wait before it goes out of scope.
  ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(index_stub, CUDA, &cuda::index_kernel);
ACCEL_REGISTER_KERNEL(index_put_stub, CUDA, &cuda::index_put_kernel);
ACCEL_REGISTER_KERNEL(nonzero_stub, CUDA, &cuda::nonzero_kernel);
}  // namespace accel
