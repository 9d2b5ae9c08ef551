// CUDA scaled dot-product attention (contract: kernels/stubs/nn.h, Note [fused attention] in
// kernels/cpu/nn_attention.cc). Materialised, unlike the CPU kernel: the probabilities p are
// computed whole; the backward reuses the caller's p when it kept them and recomputes them
// otherwise (no flash-style CUDA kernel yet).
//   forward:  p = q k^T (cuBLASLt, batched over heads), then one kernel scales, adds the mask,
//             masks the future, normalises p in place and writes lse; out = p v
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

SdpaMaskArgs mask_args(const Tensor& mask, int64_t H) {
  SdpaMaskArgs a;
  if (!mask.defined()) return a;
  a.mask = mask.data_ptr();
  a.H = H;
  a.sb = mask.stride(0);
  a.sh = mask.stride(1);
  a.si = mask.stride(2);
  a.sj = mask.stride(3);
  return a;
}

// p (contiguous (B, H, T, S)) = softmax(scale * q k^T + mask, future masked); lse when given.
void probabilities(const Tensor& q, const Tensor& k, const Tensor& mask, double scale, bool causal,
                   Tensor& p, void* lse) {
  const int64_t T = q.size(2), S = k.size(2);
  matmul_stub(q.device(), q, transposed(k), Tensor(), p);  // raw scores (B, H, T, S)
  launch_sdpa_softmax(code_of(q.dtype()), p.data_ptr(), p.numel() / S, T, S, scale, causal,
                      mask_args(mask, q.size(1)), lse, current_stream().handle());
}

void sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double scale, bool causal, Tensor& out, Tensor& lse, Tensor& p) {
  check({&k, &v, &out}, q);
  if (out.numel() == 0) return;
  DeviceGuard g(q.device());
  const int64_t S = k.size(2);
  ACCEL_INTERNAL_ASSERT(S > 0 && lse.is_contiguous() && lse.dtype() == q.dtype() &&
                        lse.numel() == q.numel() / q.size(3));
  if (mask.defined()) ACCEL_INTERNAL_ASSERT(mask.dim() == 4 && mask.dtype() == q.dtype());
  // The probabilities are materialised here either way; without p they are a temporary and the
  // backward recomputes them (same GEMM and softmax kernel, so the same values).
  Tensor probs = p.defined() ? p
                             : empty({q.size(0), q.size(1), q.size(2), S},
                                     TensorOptions(q.dtype(), q.device()));
  ACCEL_INTERNAL_ASSERT(probs.is_contiguous());
  probabilities(q, k, mask, scale, causal, probs, lse.data_ptr());
  gemm_into(probs, v, out);
}

void sdpa_backward_kernel(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const Tensor& out, const Tensor& lse, const Tensor& p,
                          double scale, bool causal, Tensor& dq, Tensor& dk, Tensor& dv) {
  check({&dout, &k, &v, &dq, &dk, &dv}, q);
  (void)out;  // the backward's row sums come from ds * p, like the forward's softmax
  (void)lse;
  DeviceGuard g(q.device());
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) {
    for (Tensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) fill_stub(t->device(), *t, Scalar(0));
    }
    return;
  }
  const int64_t S = k.size(2);
  Tensor probs = p;
  if (!probs.defined()) {
    probs = empty({q.size(0), q.size(1), q.size(2), S}, TensorOptions(q.dtype(), q.device()));
    probabilities(q, k, mask, scale, causal, probs, nullptr);
  }
  // p holds exact zeros above the diagonal (and where the mask is -inf), so ds does too.
  gemm_into(transposed(probs), dout, dv);  // (B, H, S, T) @ (B, H, T, Dv)
  Tensor ds = empty(probs.sizes(), TensorOptions(probs.dtype(), probs.device()));
  matmul_stub(q.device(), dout, transposed(v), Tensor(), ds);  // dP = dout v^T
  launch_sdpa_softmax_backward(code_of(q.dtype()), ds.data_ptr(), probs.data_ptr(),
                               probs.numel() / S, S, scale, current_stream().handle());
  gemm_into(ds, k, dq);              // (B, H, T, S) @ (B, H, S, D)
  gemm_into(transposed(ds), q, dk);  // (B, H, S, T) @ (B, H, T, D)
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(sdpa_stub, CUDA, &cuda::sdpa_kernel);
ACCEL_REGISTER_KERNEL(sdpa_backward_stub, CUDA, &cuda::sdpa_backward_kernel);
}  // namespace accel
