// CUDA scaled dot-product attention (contract: kernels/stubs/nn.h, Note [fused attention] in
// kernels/cpu/nn_attention.cc). Materialised, like the CPU kernel: the probabilities p are an
// output that the backward reuses.
//   forward:  p = q k^T (cuBLASLt, batched over heads), then one kernel scales, masks and
//             normalises p in place; out = p v
//   backward: dv = p^T dout;  ds = dout v^T, then one kernel turns it into
//             scale * p * (ds - rowsum(ds * p)) in place;  dq = ds k;  dk = ds^T q
// The GEMMs take q/k/v/out as strided views (transposes are op T in cuBLAS, no copies); only an
// output that is not contiguous is computed into a temporary and copied.
#include "kernels/stubs/linalg.h"
#include "kernels/stubs/nn.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// t with its last two dims swapped (a view, no autograd).
Tensor transposed(const Tensor& t) {
  Shape s = t.sizes(), st = t.strides();
  std::swap(s[2], s[3]);
  std::swap(st[2], st[3]);
  return Tensor(make_intrusive<TensorImpl>(t.storage(), s, st, t.offset(), t.dtype()));
}

// dst = a @ b, through a contiguous temporary when dst is a strided view.
void gemm_into(const Tensor& a, const Tensor& b, Tensor& dst) {
  if (dst.is_contiguous()) {
    matmul_stub(dst.device(), a, b, Tensor(), dst);
    return;
  }
  Tensor tmp = empty(dst.sizes(), TensorOptions(dst.dtype(), dst.device()));
  matmul_stub(dst.device(), a, b, Tensor(), tmp);
  copy_stub(dst.device(), dst, tmp);
}

// The op layer (autograd/ops/nn.cc check_sdpa) validated shapes, dtypes and devices
// (kernels/stubs/nn.h); the asserts are cheap and keep a direct call from reading foreign memory.
void check(std::initializer_list<const Tensor*> ts, const Tensor& q) {
  ACCEL_INTERNAL_ASSERT(is_floating(q.dtype()));
  for (const Tensor* t : ts) {
    ACCEL_INTERNAL_ASSERT(t->dim() == 4 && t->device() == q.device() && t->dtype() == q.dtype());
  }
}

void sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 Tensor& out, Tensor& p) {
  check({&k, &v, &out, &p}, q);
  ACCEL_INTERNAL_ASSERT(p.is_contiguous());
  if (out.numel() == 0) return;
  DeviceGuard g(q.device());
  const int64_t T = q.size(2), S = k.size(2);
  ACCEL_INTERNAL_ASSERT(!causal || T == S);
  if (S == 0) {
    fill_stub(out.device(), out, Scalar(0));
    return;
  }
  matmul_stub(q.device(), q, transposed(k), Tensor(), p);  // raw scores (B, H, T, S)
  launch_sdpa_softmax(code_of(q.dtype()), p.data_ptr(), p.numel() / S, T, S, scale, causal,
                      current_stream().handle());
  gemm_into(p, v, out);
}

void sdpa_backward_kernel(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& p, double scale, bool causal, Tensor& dq, Tensor& dk,
                          Tensor& dv) {
  check({&dout, &k, &v, &p, &dq, &dk, &dv}, q);
  DeviceGuard g(q.device());
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    for (Tensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) fill_stub(t->device(), *t, Scalar(0));
    }
    return;
  }
  (void)causal;  // p holds exact zeros above the diagonal, so ds does too
  const int64_t S = k.size(2);
  gemm_into(transposed(p), dout, dv);  // (B, H, S, T) @ (B, H, T, Dv)
  Tensor ds = empty(p.sizes(), TensorOptions(p.dtype(), p.device()));
  matmul_stub(q.device(), dout, transposed(v), Tensor(), ds);  // dP = dout v^T
  launch_sdpa_softmax_backward(code_of(q.dtype()), ds.data_ptr(), p.data_ptr(), p.numel() / S, S,
                               scale, current_stream().handle());
  gemm_into(ds, k, dq);              // (B, H, T, S) @ (B, H, S, D)
  gemm_into(transposed(ds), q, dk);  // (B, H, S, T) @ (B, H, T, D)
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(sdpa_stub, CUDA, &cuda::sdpa_kernel);
ACCEL_REGISTER_KERNEL(sdpa_backward_stub, CUDA, &cuda::sdpa_backward_kernel);
}  // namespace accel
