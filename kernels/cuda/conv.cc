// CUDA conv2d forward/backward through cuDNN (legacy convolution API, heuristic algorithm choice
// cached per shape), and 2-D pooling through own kernels (nn.cu). Contract: kernels/stubs/conv.h.
//
// Note [CUDA pooling workspace]: cuDNN's max-pool backward needs x and y, but the contract hands
// the backward only `workspace`. The own max-pool kernel records the argmax (int32, flat index
// in the H x W plane, -1 for an empty window) like the CPU reference, and that index tensor is
// the workspace.
#include <cudnn.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/raw.h"
#include "kernels/stubs/conv.h"
#include "kernels/stubs/reduce.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/launch.h"

namespace accel::cuda {
namespace {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file,
                                    int line) {
  ACCEL_THROW(Error, "cudnn", call, " failed: ", cudnnGetErrorString(st), " (", file, ":", line,
              ")");
}
#define ACCEL_CUDNN_CHECK(expr)                                      \
  do {                                                               \
    const cudnnStatus_t accel_cudnn_st_ = (expr);                    \
    if (ACCEL_UNLIKELY(accel_cudnn_st_ != CUDNN_STATUS_SUCCESS))     \
      throw_cudnn_error(accel_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

constexpr int kMaxDevices = 64;
// Algorithms needing more scratch than this are skipped (cuDNN's heuristics list them first
// sometimes; 256 MiB keeps small-memory GPUs safe).
constexpr size_t kMaxWorkspace = size_t(256) << 20;

cudnnHandle_t cudnn_handle() {
  thread_local cudnnHandle_t handles[kMaxDevices] = {};
  const int dev = current_device();
  cudnnHandle_t& h = handles[dev];
  if (!h) ACCEL_CUDNN_CHECK(cudnnCreate(&h));
  ACCEL_CUDNN_CHECK(cudnnSetStream(h, current_stream(dev).handle()));
  return h;
}

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  ACCEL_THROW(DTypeError, "conv2d", "CUDA conv2d supports floating dtypes, got ", t);
}

// Descriptors and algorithms of one (shapes, dtype, params) problem; lives for the process.
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

struct ConvKey {
  int64_t v[20];
  bool operator==(const ConvKey& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ size_t(x)) * 1099511628211ull;
    return h;
  }
};

ConvPlan make_plan(const Shape& xs, const Shape& ws, const Shape& ys, DType dt,
                   const Conv2dParams& p) {
  ConvPlan c;
  const cudnnDataType_t t = cudnn_type(dt);
  const cudnnDataType_t compute = dt == kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  ACCEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c.x));
  ACCEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c.y));
  ACCEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c.bias));
  ACCEL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&c.w));
  ACCEL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c.conv));
  ACCEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.x, CUDNN_TENSOR_NCHW, t, int(xs[0]), int(xs[1]),
                                               int(xs[2]), int(xs[3])));
  ACCEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.y, CUDNN_TENSOR_NCHW, t, int(ys[0]), int(ys[1]),
                                               int(ys[2]), int(ys[3])));
  ACCEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.bias, CUDNN_TENSOR_NCHW, t, 1, int(ys[1]), 1, 1));
  ACCEL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c.w, t, CUDNN_TENSOR_NCHW, int(ws[0]), int(ws[1]),
                                               int(ws[2]), int(ws[3])));
  ACCEL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      c.conv, int(p.padding[0]), int(p.padding[1]), int(p.stride[0]), int(p.stride[1]),
      int(p.dilation[0]), int(p.dilation[1]), CUDNN_CROSS_CORRELATION, compute));
  ACCEL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(c.conv, int(p.groups)));
  // f32 stays full precision unless TF32 was allowed (CUDNN_DEFAULT_MATH would use TF32).
  const cudnnMathType_t math =
      (dt == kFloat16 || dt == kBFloat16 || (dt == kFloat32 && allow_tf32())) ? CUDNN_TENSOR_OP_MATH
                                                                              : CUDNN_FMA_MATH;
  ACCEL_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv, math));

  cudnnHandle_t h = cudnn_handle();
  constexpr int kAlgos = 8;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kAlgos];
  if (cudnnGetConvolutionForwardAlgorithm_v7(h, c.x, c.w, c.conv, c.y, kAlgos, &n, fwd) ==
      CUDNN_STATUS_SUCCESS) {
    for (int i = 0; i < n && !c.have_fwd; ++i) {
      if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].memory <= kMaxWorkspace) {
        c.fwd = fwd[i].algo, c.fwd_ws = fwd[i].memory, c.have_fwd = true;
      }
    }
  }
  cudnnConvolutionBwdDataAlgoPerf_t bd[kAlgos];
  if (cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w, c.y, c.conv, c.x, kAlgos, &n, bd) ==
      CUDNN_STATUS_SUCCESS) {
    for (int i = 0; i < n && !c.have_bwd_data; ++i) {
      if (bd[i].status == CUDNN_STATUS_SUCCESS && bd[i].memory <= kMaxWorkspace) {
        c.bwd_data = bd[i].algo, c.bwd_data_ws = bd[i].memory, c.have_bwd_data = true;
      }
    }
  }
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kAlgos];
  if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x, c.y, c.conv, c.w, kAlgos, &n, bf) ==
      CUDNN_STATUS_SUCCESS) {
    for (int i = 0; i < n && !c.have_bwd_filter; ++i) {
      if (bf[i].status == CUDNN_STATUS_SUCCESS && bf[i].memory <= kMaxWorkspace) {
        c.bwd_filter = bf[i].algo, c.bwd_filter_ws = bf[i].memory, c.have_bwd_filter = true;
      }
    }
  }
  return c;
}

const ConvPlan& conv_plan(const Tensor& x, const Tensor& w, const Shape& ys,
                          const Conv2dParams& p) {
  for (const Shape* s : {&x.sizes(), &w.sizes(), &ys}) {
    for (int64_t v : *s) {
      ACCEL_CHECK(v <= INT32_MAX, ShapeError, "conv2d", "dimension too large for cuDNN: input ",
                  x.sizes(), ", weight ", w.sizes());
    }
  }
  const ConvKey key{{int64_t(x.dtype()),
                     x.size(0),
                     x.size(1),
                     x.size(2),
                     x.size(3),
                     w.size(0),
                     w.size(1),
                     w.size(2),
                     w.size(3),
                     p.stride[0],
                     p.stride[1],
                     p.padding[0],
                     p.padding[1],
                     p.dilation[0],
                     p.dilation[1],
                     p.groups,
                     int64_t(allow_tf32()),
                     current_device(),
                     0,
                     0}};
  thread_local std::unordered_map<ConvKey, ConvPlan, ConvKeyHash> cache;
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, make_plan(x.sizes(), w.sizes(), ys, x.dtype(), p)).first;
  return it->second;
}

// Scaling factors are double for f64 convolutions, float otherwise.
struct Scale {
  float f;
  double d;
  const void* ptr(DType t) const { return t == kFloat64 ? static_cast<const void*>(&d) : &f; }
};
const Scale kOne{1.0f, 1.0}, kZero{0.0f, 0.0};

Tensor workspace(size_t bytes, Device d) {
  return bytes ? empty({int64_t(bytes)}, TensorOptions(kUInt8, d)) : Tensor();
}
void* ws_ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The op layer (autograd/ops/conv.cc) validated shapes, dtypes and devices and made the operands
// contiguous (kernels/stubs/conv.h); cheap asserts keep a direct call from reading foreign memory.
void check_conv(const Tensor& x, const Tensor& w, const Tensor* others, int n_others) {
  ACCEL_INTERNAL_ASSERT(x.dim() == 4 && w.dim() == 4 && x.is_contiguous() && w.is_contiguous() &&
                        x.device() == w.device());
  for (int i = 0; i < n_others; ++i) {
    ACCEL_INTERNAL_ASSERT(!others[i].defined() ||
                          (others[i].device() == x.device() && others[i].is_contiguous()));
  }
}

void conv2d_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                   const Conv2dParams& p) {
  const Tensor others[2] = {bias, out};
  check_conv(x, w, others, 2);
  if (out.numel() == 0) return;
  DeviceGuard g(x.device());
  const ConvPlan& c = conv_plan(x, w, out.sizes(), p);
  ACCEL_CHECK(c.have_fwd, Error, "conv2d", "cuDNN has no forward algorithm for input ", x.sizes(),
              ", weight ", w.sizes(), " in ", x.dtype());
  const Tensor ws = workspace(c.fwd_ws, x.device());
  const DType dt = x.dtype();
  cudnnHandle_t h = cudnn_handle();
  ACCEL_CUDNN_CHECK(cudnnConvolutionForward(h, kOne.ptr(dt), c.x, x.data_ptr(), c.w, w.data_ptr(),
                                            c.conv, c.fwd, ws_ptr(ws), c.fwd_ws, kZero.ptr(dt), c.y,
                                            out.data_ptr()));
  if (bias.defined()) {
    ACCEL_CUDNN_CHECK(cudnnAddTensor(h, kOne.ptr(dt), c.bias, bias.data_ptr(), kOne.ptr(dt), c.y,
                                     out.data_ptr()));
  }
}

void conv2d_backward_kernel(const Tensor& x, const Tensor& w, const Tensor& gout, Tensor* gx,
                            Tensor* gw, Tensor* gb, const Conv2dParams& p) {
  const Tensor others[4] = {gout, gx ? *gx : Tensor(), gw ? *gw : Tensor(), gb ? *gb : Tensor()};
  check_conv(x, w, others, 4);
  DeviceGuard g(x.device());
  const DType dt = x.dtype();
  if (gout.numel() == 0 || x.numel() == 0) {
    for (Tensor* t : {gx, gw, gb})
      if (t) raw::fill_(*t, 0);
    return;
  }
  const ConvPlan& c = conv_plan(x, w, gout.sizes(), p);
  cudnnHandle_t h = cudnn_handle();
  if (gx) {
    ACCEL_CHECK(c.have_bwd_data, Error, "conv2d_backward",
                "cuDNN has no backward-data algorithm for input ", x.sizes(), ", weight ",
                w.sizes(), " in ", dt);
    const Tensor ws = workspace(c.bwd_data_ws, x.device());
    ACCEL_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, kOne.ptr(dt), c.w, w.data_ptr(), c.y, gout.data_ptr(), c.conv, c.bwd_data, ws_ptr(ws),
        c.bwd_data_ws, kZero.ptr(dt), c.x, gx->data_ptr()));
  }
  if (gw) {
    ACCEL_CHECK(c.have_bwd_filter, Error, "conv2d_backward",
                "cuDNN has no backward-filter algorithm for input ", x.sizes(), ", weight ",
                w.sizes(), " in ", dt);
    const Tensor ws = workspace(c.bwd_filter_ws, x.device());
    ACCEL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, kOne.ptr(dt), c.x, x.data_ptr(), c.y, gout.data_ptr(), c.conv, c.bwd_filter, ws_ptr(ws),
        c.bwd_filter_ws, kZero.ptr(dt), c.w, gw->data_ptr()));
  }
  if (gb) {
    // The bias gradient is gout summed over (N, H, W). cuDNN's cudnnConvolutionBackwardBias
    // refuses bfloat16 (CUDNN_STATUS_NOT_SUPPORTED on an H200, cuDNN 9), so our reduction does
    // it for every dtype, accumulating 16-bit values in float32.
    const int64_t ch = gb->numel();
    Tensor out = raw::as_strided(*gb, Shape{1, ch, 1, 1}, Shape{ch, 1, 1, 1}, gb->offset());
    reduce_stub(gout.device(), ReduceOp::Sum, gout, Shape{0, 2, 3}, out);
  }
}

// ---------------- pooling (kernels in nn.cu) ----------------

PoolArgs pool_args(const Shape& in, const Shape& out, const Pool2dParams& p) {
  return PoolArgs{in[0] * in[1], in[2],        in[3],        out[2],
                  out[3],        p.kernel[0],  p.kernel[1],  p.stride[0],
                  p.stride[1],   p.padding[0], p.padding[1], p.count_include_pad};
}

void pool2d_kernel(PoolKind kind, const Tensor& x, Tensor& out, Tensor* workspace_out,
                   const Pool2dParams& p) {
  ACCEL_INTERNAL_ASSERT(x.dim() == 4 && x.is_contiguous() && out.is_contiguous() &&
                        x.device() == out.device() && is_floating(x.dtype()));
  DeviceGuard g(x.device());
  const bool max = kind == PoolKind::Max;
  Tensor idx;
  if (max && workspace_out) {
    idx = empty(out.sizes(), TensorOptions(kInt32, x.device()));
    *workspace_out = idx;
  }
  if (out.numel() == 0) return;
  launch_pool_forward(code_of(x.dtype()), max, pool_args(x.sizes(), out.sizes(), p), x.data_ptr(),
                      out.data_ptr(),
                      idx.defined() ? static_cast<int32_t*>(idx.data_ptr()) : nullptr,
                      max_blocks(x.device().index), current_stream().handle());
}

void pool2d_backward_kernel(PoolKind kind, const Tensor& gout, const Tensor& workspace_in,
                            Tensor& gx, const Pool2dParams& p) {
  ACCEL_INTERNAL_ASSERT(gout.is_contiguous() && gx.is_contiguous() && gout.device() == gx.device());
  const bool max = kind == PoolKind::Max;
  ACCEL_CHECK(!max || (workspace_in.defined() && workspace_in.dtype() == kInt32 &&
                       workspace_in.numel() == gout.numel()),
              ValueError, "pool2d_backward",
              "max pooling needs the workspace of its CUDA forward, got ",
              workspace_in.defined() ? workspace_in.sizes() : Shape{});
  DeviceGuard g(gx.device());
  raw::fill_(gx, 0);
  if (gout.numel() == 0) return;
  launch_pool_backward(code_of(gx.dtype()), max, pool_args(gx.sizes(), gout.sizes(), p),
                       gout.data_ptr(),
                       max ? static_cast<const int32_t*>(workspace_in.data_ptr()) : nullptr,
                       gx.data_ptr(), max_blocks(gx.device().index), current_stream().handle());
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(conv2d_stub, CUDA, &cuda::conv2d_kernel);
ACCEL_REGISTER_KERNEL(conv2d_backward_stub, CUDA, &cuda::conv2d_backward_kernel);
ACCEL_REGISTER_KERNEL(pool2d_stub, CUDA, &cuda::pool2d_kernel);
ACCEL_REGISTER_KERNEL(pool2d_backward_stub, CUDA, &cuda::pool2d_backward_kernel);
}  // namespace accel
