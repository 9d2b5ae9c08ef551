// CUDA matmul: cuBLASLt for f32/f16/bf16 (tensor cores, f32 accumulate, bias fused as an
// epilogue), cuBLAS for f64 and as the fallback. Contract: kernels/stubs/linalg.h.
//
// Note [row-major GEMM on cuBLAS]: cuBLAS is column-major. Our out (M, N) row-major is the
// column-major (N, M) matrix out^T = b^T a^T, so every call passes b as cuBLAS's "A" and a as its
// "B", with m = N, n = M. A row-major operand read as column-major is already its transpose
// (op N); a column-major one (a transposed view such as w.t()) takes op T. The bias (N) then
// runs along the rows of cuBLAS's D, which is what CUBLASLT_EPILOGUE_BIAS adds.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/env_contract.h"
#include "kernels/stubs/linalg.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.h"

namespace accel::cuda {

// ---------------- errors, modes, handles ----------------

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  ACCEL_THROW(Error, "cublas", call, " failed: ", cublasGetStatusName(st), ": ",
              cublasGetStatusString(st), " (", file, ":", line, ")");
}

namespace {
constexpr int kMaxDevices = 64;
// cuBLAS on Hopper wants up to 32 MiB of workspace for its fastest kernels.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv(env::kAllowTf32);
    return e && std::strcmp(e, "1") == 0;
  }()};
  return f;
}
}  // namespace

void set_allow_tf32(bool allow) { tf32_flag().store(allow); }
bool allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }

cublasHandle_t cublas_handle() {
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  const int dev = current_device();
  cublasHandle_t& h = handles[dev];
  if (!h) ACCEL_CUBLAS_CHECK(cublasCreate(&h));
  ACCEL_CUBLAS_CHECK(cublasSetStream(h, current_stream(dev).handle()));
  size_t ws_bytes = 0;
  void* ws = blas_workspace(&ws_bytes);
  ACCEL_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
  return h;
}

cublasLtHandle_t cublaslt_handle() {
  thread_local cublasLtHandle_t handles[kMaxDevices] = {};
  const int dev = current_device();
  cublasLtHandle_t& h = handles[dev];
  if (!h) ACCEL_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

void* blas_workspace(size_t* nbytes) {
  static std::mutex mu;
  static auto* spaces = new std::unordered_map<cudaStream_t, Tensor>[kMaxDevices];  // never freed
  const int dev = current_device();
  const cudaStream_t s = current_stream(dev).handle();
  std::lock_guard<std::mutex> lk(mu);
  Tensor& t = spaces[dev][s];
  if (!t.defined()) t = empty({int64_t(kWorkspaceBytes)}, TensorOptions(kUInt8, Device::cuda(dev)));
  *nbytes = kWorkspaceBytes;
  return t.data_ptr();
}

namespace {

// ---------------- geometry (kernels/common/geometry.h, Note [matmul geometry]) ----------------

using common::canonical_matrix;
using common::MatrixLayout;
using Geometry = common::MatmulGeometry;  // a_stride/b_stride 0 on broadcast dims
constexpr int kMaxBatch = Geometry::kMaxBatch;

// cuBLAS operands for the geometry (Note [row-major GEMM on cuBLAS]).
struct BlasOperands {
  cublasOperation_t op_a, op_b;  // cuBLAS's A = our b, B = our a
  int64_t rows_a, cols_a, ld_a;  // stored matrices, column-major
  int64_t rows_b, cols_b, ld_b;
};

BlasOperands blas_operands(const Geometry& g) {
  BlasOperands o;
  if (g.b.col_stride == 1) {  // b row-major: (N, K) column-major = b^T
    o.op_a = CUBLAS_OP_N, o.rows_a = g.n, o.cols_a = g.k, o.ld_a = g.b.row_stride;
  } else {
    o.op_a = CUBLAS_OP_T, o.rows_a = g.k, o.cols_a = g.n, o.ld_a = g.b.col_stride;
  }
  if (g.a.col_stride == 1) {
    o.op_b = CUBLAS_OP_N, o.rows_b = g.k, o.cols_b = g.m, o.ld_b = g.a.row_stride;
  } else {
    o.op_b = CUBLAS_OP_T, o.rows_b = g.m, o.cols_b = g.k, o.ld_b = g.a.col_stride;
  }
  return o;
}

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float64: return CUDA_R_64F;
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: break;
  }
  ACCEL_THROW(DTypeError, "matmul",
              "CUDA matmul supports float32, float64, float16, bfloat16; got ", t);
}

// Largest power of two (<= 256) dividing the address and every batch step in bytes.
int64_t alignment(const void* p, int64_t step_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | uint64_t(step_bytes) | 256;
  return int64_t(v & (~v + 1));
}

// ---------------- cuBLASLt plans ----------------

struct LtKey {
  int64_t v[20];
  bool operator==(const LtKey& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};
struct LtKeyHash {
  size_t operator()(const LtKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ size_t(x)) * 1099511628211ull;
    return h;
  }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool ok = false;  // false: no algorithm, use cuBLAS
};

void set_batch(cublasLtMatrixLayout_t l, int32_t count, int64_t stride) {
  if (count <= 1) return;
  ACCEL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                      sizeof(count)));
  ACCEL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

LtPlan make_plan(DType dt, const BlasOperands& o, int64_t m, int64_t n, int64_t k, int32_t batch,
                 int64_t sa, int64_t sb, int64_t sd, bool bias, bool tf32, const int64_t* align) {
  LtPlan p;
  const cudaDataType_t t = blas_type(dt);
  const cublasComputeType_t ct =
      (dt == kFloat32 && tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ACCEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, ct, CUDA_R_32F));
  ACCEL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &o.op_a, sizeof(o.op_a)));
  ACCEL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &o.op_b, sizeof(o.op_b)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    ACCEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    ACCEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  }
  ACCEL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.la, t, uint64_t(o.rows_a), uint64_t(o.cols_a), o.ld_a));
  ACCEL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.lb, t, uint64_t(o.rows_b), uint64_t(o.cols_b), o.ld_b));
  ACCEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, t, uint64_t(m), uint64_t(n), m));
  set_batch(p.la, batch, sa);
  set_batch(p.lb, batch, sb);
  set_batch(p.ld, batch, sd);
  (void)k;

  cublasLtMatmulPreference_t pref = nullptr;
  ACCEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  ACCEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    const uint32_t a32 = uint32_t(align[i]);
    ACCEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &a32, sizeof(a32)));
  }
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), p.desc, p.la, p.lb,
                                                           p.ld, p.ld, pref, 1, &res, &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = res.algo;
    p.ok = true;
  }
  return p;
}

LtPlan& lt_plan(DType dt, const BlasOperands& o, int64_t m, int64_t n, int64_t k, int32_t batch,
                int64_t sa, int64_t sb, int64_t sd, bool bias, const int64_t* align) {
  const bool tf32 = allow_tf32();
  LtKey key{{int64_t(dt),
             int64_t(o.op_a),
             int64_t(o.op_b),
             o.rows_a,
             o.cols_a,
             o.ld_a,
             o.rows_b,
             o.cols_b,
             o.ld_b,
             m,
             n,
             k,
             batch,
             sa,
             sb,
             sd,
             int64_t(bias) | (int64_t(tf32) << 1) | (current_device() << 2),
             align[0] | (align[1] << 16),
             align[2] | (align[3] << 16),
             0}};
  // Plans hold host-side descriptors only; one cache per thread avoids a lock per call.
  thread_local std::unordered_map<LtKey, LtPlan, LtKeyHash> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, make_plan(dt, o, m, n, k, batch, sa, sb, sd, bias, tf32, align)).first;
  }
  return it->second;
}

// One (optionally strided-batched) GEMM: out = a @ b (+ bias when `bias`), pointers at batch 0.
// False when a fused bias was asked for but cuBLASLt has no algorithm (nothing was queued).
bool gemm(DType dt, const Geometry& g, const BlasOperands& o, const void* pa, const void* pb,
          const void* bias, void* po, int32_t batch, int64_t sa, int64_t sb, int64_t so,
          bool accumulate) {
  const int64_t es = int64_t(dtype_size(dt));
  if (dt != kFloat64) {
    const int64_t align[4] = {alignment(pb, sb * es), alignment(pa, sa * es),
                              alignment(po, so * es), alignment(po, so * es)};
    LtPlan& plan = lt_plan(dt, o, g.n, g.m, g.k, batch, sb, sa, so, bias != nullptr, align);
    if (plan.ok) {
      if (bias) {
        ACCEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      }
      const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
      size_t ws_bytes = 0;
      void* ws = blas_workspace(&ws_bytes);
      ACCEL_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), plan.desc, &alpha, pb, plan.la, pa,
                                        plan.lb, &beta, po, plan.ld, po, plan.ld, &plan.algo, ws,
                                        ws_bytes, current_stream().handle()));
      return true;
    }
  }
  // cuBLAS: f64, or no cuBLASLt algorithm for this layout. The caller puts the bias in `out`.
  if (bias) return false;
  ACCEL_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && o.ld_a <= INT32_MAX &&
                  o.ld_b <= INT32_MAX,
              ShapeError, "matmul", "matrix too large for cuBLAS: (", g.m, ", ", g.k, ") @ (", g.k,
              ", ", g.n, ")");
  const cudaDataType_t t = blas_type(dt);
  const double alpha64 = 1.0, beta64 = accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = accumulate ? 1.0f : 0.0f;
  const bool f64 = dt == kFloat64;
  const cublasComputeType_t ct =
      f64 ? CUBLAS_COMPUTE_64F
          : ((dt == kFloat32 && allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  ACCEL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_handle(), o.op_a, o.op_b, int(g.n), int(g.m), int(g.k),
      f64 ? static_cast<const void*>(&alpha64) : &alpha32, pb, t, int(o.ld_a), sb, pa, t,
      int(o.ld_b), sa, f64 ? static_cast<const void*>(&beta64) : &beta32, po, t, int(g.n), so,
      batch, ct, CUBLAS_GEMM_DEFAULT));
  return true;
}

Tensor copy_contiguous(const Tensor& t) {
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype(), t.device()));
  copy_stub(t.device(), c, t);
  return c;
}

bool is_canonical(const Tensor& t) {
  MatrixLayout m{t.size(-2), t.size(-1), t.stride(-2), t.stride(-1)};
  return canonical_matrix(m);
}

void matmul_kernel(const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in, Tensor& out) {
  const Tensor* ops[4] = {&out, &a_in, &b_in, bias_in.defined() ? &bias_in : &out};
  // The op layer (autograd/ops/linalg.cc) checked devices; a mix would read foreign memory.
  for (const Tensor* t : ops) ACCEL_INTERNAL_ASSERT(t->device() == out.device());
  if (out.numel() == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  if (a_in.size(-1) == 0) {  // empty inner dim: out = bias or 0
    if (bias_in.defined()) {
      copy_stub(out.device(), out, bias_in);
    } else {
      fill_stub(out.device(), out, Scalar(0));
    }
    return;
  }
  (void)blas_type(out.dtype());
  const Tensor a = is_canonical(a_in) ? a_in : copy_contiguous(a_in);
  const Tensor b = is_canonical(b_in) ? b_in : copy_contiguous(b_in);
  const Tensor bias =
      !bias_in.defined() || bias_in.is_contiguous() ? bias_in : copy_contiguous(bias_in);
  const Geometry g = matmul_batch_geometry(a, b, out);
  const BlasOperands o = blas_operands(g);
  const DType dt = out.dtype();
  const int64_t es = int64_t(out.element_size());
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());

  // The innermost batch dim becomes cuBLAS's batch when neither operand broadcasts along it.
  int outer = g.nb;
  int32_t batch = 1;
  int64_t sa = 0, sb = 0, so = 0;
  if (g.nb > 0) {
    const int d = g.nb - 1;
    if (g.a_stride[d] != 0 && g.b_stride[d] != 0 && g.out_size[d] <= INT32_MAX) {
      outer = d;
      batch = int32_t(g.out_size[d]);
      sa = g.a_stride[d], sb = g.b_stride[d], so = g.out_stride[d];
    }
  }
  // A fused bias needs the plain 2-D case; otherwise out starts as the broadcast bias.
  if (bias.defined() && g.nb == 0 && dt != kFloat64 &&
      gemm(dt, g, o, pa, pb, bias.data_ptr(), po, 1, 0, 0, 0, false)) {
    return;
  }
  const bool accumulate = bias.defined();
  if (accumulate) copy_stub(out.device(), out, bias);
  int64_t total = 1;
  for (int d = 0; d < outer; ++d) total *= g.out_size[d];
  int64_t idx[kMaxBatch] = {};
  for (int64_t i = 0; i < total; ++i) {
    int64_t ao = 0, bo = 0, oo = 0;
    for (int d = 0; d < outer; ++d) {
      ao += idx[d] * g.a_stride[d];
      bo += idx[d] * g.b_stride[d];
      oo += idx[d] * g.out_stride[d];
    }
    gemm(dt, g, o, pa + ao * es, pb + bo * es, nullptr, po + oo * es, batch, sa, sb, so,
         accumulate);
    for (int d = outer - 1; d >= 0; --d) {
      if (++idx[d] < g.out_size[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace
}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(matmul_stub, CUDA, &cuda::matmul_kernel);
}
