// Convolution and pooling kernels (kernels/<backend>/conv.*), NCHW.
//
// The op in autograd/ops/conv.cc checks shapes, dtypes, devices and parameters and makes the
// operands contiguous; kernels assume that (CUDA asserts the cheap parts) and throw only for
// their backend's limits (no oneDNN/cuDNN implementation, sizes beyond cuDNN's int32).
#pragma once

#include "core/dispatch.h"

namespace accel {

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};  // both sides
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

// x: (N, C, H, W)  w: (O, C / groups, kh, kw)  bias: undefined or (O)
// out: (N, O, Ho, Wo) contiguous, Ho = (H + 2 p - d (kh - 1) - 1) / s + 1.
// Inputs are contiguous and share out's floating dtype; the op layer has checked every shape.
ACCEL_DECLARE_STUB(conv2d_stub, void (*)(const Tensor& x, const Tensor& w, const Tensor& bias,
                                         Tensor& out, const Conv2dParams& p));
// Gradients of conv2d given gout (N, O, Ho, Wo), all contiguous. Each of gx (like x), gw (like w)
// and gb ((O)) is either null (not wanted) or a preallocated contiguous tensor that the kernel
// overwrites.
// x's data is read only for gw; with gw null only its sizes matter (conv_transpose2d's forward
// passes its own output there: Note [transposed convolution through the conv kernels]).
ACCEL_DECLARE_STUB(conv2d_backward_stub,
                   void (*)(const Tensor& x, const Tensor& w, const Tensor& gout, Tensor* gx,
                            Tensor* gw, Tensor* gb, const Conv2dParams& p));

enum class PoolKind : uint8_t { Max, Avg };

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};    // both sides; padded cells never win a max
  bool count_include_pad = true;  // avg: divide by kh * kw (true) or by the valid cells (false)
};

// x: (N, C, H, W) contiguous -> out: (N, C, Ho, Wo) contiguous, Ho = (H + 2 p - k) / s + 1.
// For Max with workspace != null (training), the kernel also sets *workspace to an opaque tensor
// (its dtype and size are the backend's business) that pool2d_backward_stub needs.
ACCEL_DECLARE_STUB(pool2d_stub, void (*)(PoolKind kind, const Tensor& x, Tensor& out,
                                         Tensor* workspace, const Pool2dParams& p));
// gout: (N, C, Ho, Wo) contiguous; gx: preallocated (N, C, H, W) contiguous, overwritten.
// workspace: what pool2d_stub returned (Max only; undefined for Avg).
ACCEL_DECLARE_STUB(pool2d_backward_stub,
                   void (*)(PoolKind kind, const Tensor& gout, const Tensor& workspace, Tensor& gx,
                            const Pool2dParams& p));

}  // namespace accel
