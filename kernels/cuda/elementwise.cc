// CUDA unary/binary/where/copy/fill: operand checks and layout choice; kernels in
// elementwise_unary.cu, elementwise_binary.cu and elementwise_copy.cu. Registered into the same
// stubs as kernels/cpu/.
#include <cstring>

#include "core/half.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

// Every operand on the output's CUDA device: the op layer checked it (kernels/stubs/*.h); the
// assert stays because a kernel called directly with a mix would read foreign memory.
void assert_one_device(const Tensor* const* ops, int n) {
  for (int k = 1; k < n; ++k) ACCEL_INTERNAL_ASSERT(ops[k]->device() == ops[0]->device());
}

bool same_shape_contiguous(const Tensor& a, const Tensor& out) {
  return a.is_contiguous() && out.is_contiguous() && a.sizes() == out.sizes();
}

// Elements per 16-byte access when every pointer allows it, else 1.
int vec_width(std::initializer_list<const Tensor*> ts) {
  size_t widest = 1;
  for (const Tensor* t : ts) widest = std::max(widest, t->element_size());
  const size_t vec = 16 / widest;
  for (const Tensor* t : ts)
    if (!aligned(t->data_ptr(), vec * t->element_size())) return 1;
  return int(vec);
}

bool int_unary_supported(UnaryOp op, const UnaryParams& p) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Abs:
    case UnaryOp::Sign:
    case UnaryOp::Square:
    case UnaryOp::Relu:
    case UnaryOp::LogicalNot:
    case UnaryOp::Clamp:
    case UnaryOp::AddScalar:
    case UnaryOp::MulScalar:
    case UnaryOp::RSubScalar: return true;
    case UnaryOp::PowScalar: return p.p0 >= 0 && p.p0 == double(int64_t(p.p0));
    default: return false;
  }
}

void unary_kernel(UnaryOp op, const Tensor& in, Tensor& out, const UnaryParams& p) {
  if (out.numel() == 0) return;
  const Tensor* ops[2] = {&out, &in};
  assert_one_device(ops, 2);
  ACCEL_INTERNAL_ASSERT(int(op) < int(UnaryOp::Count));
  if (!is_floating(in.dtype()) && !int_unary_supported(op, p)) {
    ACCEL_THROW(DTypeError, "unary", "op ", int(op), " is not defined for dtype ", in.dtype());
  }
  const bool bool_out = op == UnaryOp::LogicalNot;
  ACCEL_INTERNAL_ASSERT(bool_out ? out.dtype() == kBool : out.dtype() == in.dtype());
  const int dev = out.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const int mb = max_blocks(dev);
  if (same_shape_contiguous(in, out)) {
    launch_unary(UOp(op), p.p0, p.p1, code_of(in.dtype()), code_of(out.dtype()), Layout::Contiguous,
                 vec_width({&in, &out}), in.data_ptr(), out.data_ptr(), out.numel(),
                 OffsetCalc<2>(), mb, s);
    return;
  }
  for_each_32bit_piece<2>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<2> calc = make_offset_calc<2>(pc, "unary");
    launch_unary(UOp(op), p.p0, p.p1, code_of(in.dtype()), code_of(out.dtype()), Layout::Strided, 1,
                 pc[1]->data_ptr(), pc[0]->data_ptr(), pc[0]->numel(), calc, mb, s);
  });
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha) {
  if (out.numel() == 0) return;
  const Tensor* ops[3] = {&out, &a, &b};
  assert_one_device(ops, 3);
  ACCEL_INTERNAL_ASSERT(int(op) < int(BinaryOp::Count) && a.dtype() == b.dtype());
  const bool floating = is_floating(a.dtype());
  const bool float_only = op == BinaryOp::Div || op == BinaryOp::Pow || op >= BinaryOp::ReluGrad;
  if (!floating && float_only) {
    ACCEL_THROW(DTypeError, "binary", "op ", int(op), " is not defined for dtype ", a.dtype());
  }
  const bool bool_out = is_comparison(op);
  ACCEL_INTERNAL_ASSERT(bool_out ? out.dtype() == kBool : out.dtype() == a.dtype());
  const int dev = out.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const int mb = max_blocks(dev);
  const Code ct = code_of(a.dtype()), co = code_of(out.dtype());
  if (same_shape_contiguous(a, out)) {
    if (same_shape_contiguous(b, out)) {
      launch_binary(BOp(op), alpha, ct, co, Layout::Contiguous, vec_width({&a, &b, &out}),
                    a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel(), OffsetCalc<3>(), mb,
                    s);
      return;
    }
    if (b.numel() == 1) {
      launch_binary(BOp(op), alpha, ct, co, Layout::ScalarB, vec_width({&a, &out}), a.data_ptr(),
                    b.data_ptr(), out.data_ptr(), out.numel(), OffsetCalc<3>(), mb, s);
      return;
    }
  }
  for_each_32bit_piece<3>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<3> calc = make_offset_calc<3>(pc, "binary");
    launch_binary(BOp(op), alpha, ct, co, Layout::Strided, 1, pc[1]->data_ptr(), pc[2]->data_ptr(),
                  pc[0]->data_ptr(), pc[0]->numel(), calc, mb, s);
  });
}

void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  const Tensor* ops[4] = {&out, &cond, &a, &b};
  assert_one_device(ops, 4);
  ACCEL_INTERNAL_ASSERT(cond.dtype() == kBool && a.dtype() == out.dtype() &&
                        b.dtype() == out.dtype());
  const int dev = out.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const int mb = max_blocks(dev);
  for_each_32bit_piece<4>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<4> calc = make_offset_calc<4>(pc, "where");
    launch_where(int(out.element_size()), pc[1]->data_ptr(), pc[2]->data_ptr(), pc[3]->data_ptr(),
                 pc[0]->data_ptr(), pc[0]->numel(), calc, mb, s);
  });
}

void copy_kernel(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  const Tensor* ops[2] = {&dst, &src};
  assert_one_device(ops, 2);
  const int dev = dst.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const int mb = max_blocks(dev);
  const bool contiguous = same_shape_contiguous(src, dst);
  if (dst.dtype() == src.dtype()) {
    if (contiguous) {
      if (dst.data_ptr() != src.data_ptr()) {
        ACCEL_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                         cudaMemcpyDeviceToDevice, s));
      }
      return;
    }
    for_each_32bit_piece<2>(ops, [&](const Tensor* const* pc) {
      const OffsetCalc<2> calc = make_offset_calc<2>(pc, "copy_");
      launch_copy_strided(int(dst.element_size()), pc[0]->data_ptr(), pc[1]->data_ptr(),
                          pc[0]->numel(), calc, mb, s);
    });
    return;
  }
  if (contiguous) {
    launch_convert(code_of(dst.dtype()), code_of(src.dtype()), dst.data_ptr(), src.data_ptr(),
                   dst.numel(), nullptr, mb, s);
    return;
  }
  for_each_32bit_piece<2>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<2> calc = make_offset_calc<2>(pc, "copy_");
    launch_convert(code_of(dst.dtype()), code_of(src.dtype()), pc[0]->data_ptr(), pc[1]->data_ptr(),
                   pc[0]->numel(), &calc, mb, s);
  });
}

// The fill value's bytes in dst's dtype, converted on the host like the CPU kernel does.
uint64_t fill_bits(DType t, Scalar v) {
  uint64_t bits = 0;
  auto put = [&](auto x) { std::memcpy(&bits, &x, sizeof(x)); };
  const double d = v.to_double();
  switch (t) {
    case DType::Float32: put(float(d)); break;
    case DType::Float64: put(d); break;
    case DType::Float16: put(Half(float(d)).bits); break;
    case DType::BFloat16: put(BFloat16(float(d)).bits); break;
    case DType::Int32: put(int32_t(v.is_int ? v.i : int64_t(v.d))); break;
    case DType::Int64: put(int64_t(v.is_int ? v.i : int64_t(v.d))); break;
    case DType::UInt8: put(uint8_t(v.is_int ? v.i : int64_t(v.d))); break;
    case DType::Bool: put(uint8_t(float(d) != 0.0f)); break;
  }
  return bits;
}

void fill_kernel(Tensor& dst, Scalar v) {
  if (dst.numel() == 0) return;
  const int dev = dst.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev).handle();
  const int mb = max_blocks(dev);
  const uint64_t bits = fill_bits(dst.dtype(), v);
  if (dst.is_contiguous()) {
    if (bits == 0) {
      ACCEL_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), s));
      return;
    }
    launch_fill(int(dst.element_size()), bits, dst.data_ptr(), dst.numel(), nullptr, mb, s);
    return;
  }
  const Tensor* ops[1] = {&dst};
  for_each_32bit_piece<1>(ops, [&](const Tensor* const* pc) {
    const OffsetCalc<1> calc = make_offset_calc<1>(pc, "fill_");
    launch_fill(int(dst.element_size()), bits, pc[0]->data_ptr(), pc[0]->numel(), &calc, mb, s);
  });
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(unary_stub, CUDA, &cuda::unary_kernel);
ACCEL_REGISTER_KERNEL(binary_stub, CUDA, &cuda::binary_kernel);
ACCEL_REGISTER_KERNEL(where_stub, CUDA, &cuda::where_kernel);
ACCEL_REGISTER_KERNEL(copy_stub, CUDA, &cuda::copy_kernel);
ACCEL_REGISTER_KERNEL(fill_stub, CUDA, &cuda::fill_kernel);
}  // namespace accel
