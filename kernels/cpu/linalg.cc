// CPU matmul: oneDNN matmul primitive for f32/bf16 (f16, any dtype oneDNN cannot run on this
// CPU, and bf16 where float32 is faster go through f32), Eigen for f64 (oneDNN has no f64 matmul;
// gradcheck runs in f64).
//
// Note [matmul geometry]: the kernel first canonicalises the problem so that equivalent calls
// hit the same cached primitive and oneDNN sees layouts it has fast paths for:
//   - batch dims where out has size 1 are dropped; a batch dim of an operand with stride 0 (an
//     expanded view) becomes a broadcast dim of size 1;
//   - adjacent batch dims that are laid out contiguously in a, b and out are merged;
//   - each matrix must be row-major (unit column stride, leading dim >= cols) or column-major
//     (a transposed view); anything else is copied once. Strides of size-1 dims are normalised.
// oneDNN takes at most DNNL_MAX_NDIMS dims; leading batch dims beyond that become an outer loop
// over the same primitive with shifted pointers.
// Eigen's headers are not warning-clean under -Wextra (unused variables in its AVX packet code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include "kernels/stubs/linalg.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/threading.h"

#include <algorithm>
#include <cstring>
#include <exception>

namespace accel::cpu {
namespace {

constexpr int kMaxBatchDims = DNNL_MAX_NDIMS - 2;
using common::canonical_matrix;
using common::matrix_extent;
using common::MatrixLayout;
using Geometry = common::MatmulGeometry;
constexpr int kMaxDims = Geometry::kMaxBatch;

// The shared batch geometry (kernels/common/geometry.h, Note [matmul geometry]), then oneDNN's
// view of it: the strides of broadcast dims become what a dense layout would have (oneDNN
// matches plain formats).
Geometry make_geometry(const Tensor& a, const Tensor& b, const Tensor& out) {
  Geometry g = matmul_batch_geometry(a, b, out);
  int64_t ae = matrix_extent(g.a), be = matrix_extent(g.b);
  for (int d = g.nb - 1; d >= 0; --d) {
    if (g.a_size[d] == 1) g.a_stride[d] = ae;
    if (g.b_size[d] == 1) g.b_stride[d] = be;
    ae = g.a_stride[d] * g.a_size[d];
    be = g.b_stride[d] * g.b_size[d];
  }
  return g;
}

// Multiply-adds of the whole product, batch entries included (Note [GEMM grain]).
int64_t gemm_macs(const Geometry& g) {
  int64_t macs = g.m * g.n * g.k;
  for (int d = 0; d < g.nb; ++d) macs *= g.out_size[d];
  return macs;
}

bool one_thread(const Geometry& g, DType dt) {
  return gemm_single_thread(gemm_macs(g), gemm_grain_for(dt), omp_get_max_threads());
}

// ---------------- oneDNN path ----------------

struct MatmulEntry {
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst;
  onednn::ExecArgs<4> args;
  bool supported = false;  // false: oneDNN has no implementation for this dtype here
};

onednn::PrimCache<MatmulEntry>& matmul_cache() {
  thread_local onednn::PrimCache<MatmulEntry> cache;
  return cache;
}

// Builds the primitive for batch dims [first, nb) of g.
MatmulEntry make_entry(const Geometry& g, int first, DType dt, DType out_dt, bool has_bias) {
  using dims = dnnl::memory::dims;
  const int nd = g.nb - first + 2;
  const size_t nds = size_t(nd);
  dims as(nds), ast(nds), bs(nds), bst(nds), os(nds), ost(nds);
  for (int d = first; d < g.nb; ++d) {
    const size_t i = size_t(d - first);
    as[i] = g.a_size[d];
    ast[i] = g.a_stride[d];
    bs[i] = g.b_size[d];
    bst[i] = g.b_stride[d];
    os[i] = g.out_size[d];
    ost[i] = g.out_stride[d];
  }
  const size_t r = size_t(nd - 2);
  as[r] = g.m, as[r + 1] = g.k, ast[r] = g.a.row_stride, ast[r + 1] = g.a.col_stride;
  bs[r] = g.k, bs[r + 1] = g.n, bst[r] = g.b.row_stride, bst[r + 1] = g.b.col_stride;
  os[r] = g.m, os[r + 1] = g.n, ost[r] = g.n, ost[r + 1] = 1;
  const auto t = onednn::to_dnnl(dt), to = onednn::to_dnnl(out_dt);
  MatmulEntry e;
  if (t == dnnl::memory::data_type::undef || to == dnnl::memory::data_type::undef) return e;
  dnnl::memory::desc src_md(as, t, ast), wei_md(bs, t, bst), dst_md(os, to, ost);
  dnnl::memory::desc bias_md;
  if (has_bias) {
    dims bd(size_t(nd), 1), bstr(size_t(nd), g.n);
    bd[size_t(nd - 1)] = g.n;
    bstr[size_t(nd - 1)] = 1;
    bias_md = dnnl::memory::desc(bd, t, bstr);
  }
  try {
    dnnl::matmul::primitive_desc pd =
        has_bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, bias_md, dst_md),
                                                onednn::engine())
                 : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, dst_md),
                                                onednn::engine());
    e.prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    if (err.status == dnnl_unimplemented) return e;  // caller converts to f32
    ACCEL_THROW(Error, "matmul", "oneDNN primitive creation failed: ", err.what());
  }
  e.src = onednn::unbound_memory(src_md);
  e.wei = onednn::unbound_memory(wei_md);
  e.dst = onednn::unbound_memory(dst_md);
  e.args.add(DNNL_ARG_SRC, e.src);
  e.args.add(DNNL_ARG_WEIGHTS, e.wei);
  e.args.add(DNNL_ARG_DST, e.dst);
  if (has_bias) {
    e.bias = onednn::unbound_memory(bias_md);
    e.args.add(DNNL_ARG_BIAS, e.bias);
  }
  e.supported = true;
  return e;
}

onednn::PrimKey make_key(const Geometry& g, int first, DType dt, DType out_dt, bool has_bias) {
  onednn::PrimKey key;
  key.push(int64_t(dt));
  key.push(int64_t(out_dt));
  key.push(has_bias);
  // oneDNN fixes a primitive's thread decomposition when it is created: a product run under
  // OneThreadScope (Note [GEMM grain]) needs its own.
  key.push(omp_get_max_threads());
  key.push(g.m), key.push(g.n), key.push(g.k);
  key.push(g.a.row_stride), key.push(g.a.col_stride);
  key.push(g.b.row_stride), key.push(g.b.col_stride);
  for (int d = first; d < g.nb; ++d) {
    key.push(g.out_size[d]);
    key.push(g.a_size[d]), key.push(g.a_stride[d]);
    key.push(g.b_size[d]), key.push(g.b_stride[d]);
  }
  return key;
}

// Runs fn(a_offset, b_offset, out_offset) (elements) for each index of batch dims [0, count).
template <typename F>
void for_each_outer(const Geometry& g, int count, F&& fn) {
  int64_t total = 1;
  for (int d = 0; d < count; ++d) total *= g.out_size[d];
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0; i < total; ++i) {
    int64_t ao = 0, bo = 0, oo = 0;
    for (int d = 0; d < count; ++d) {
      ao += idx[d] * g.a_stride[d] * (g.a_size[d] != 1);
      bo += idx[d] * g.b_stride[d] * (g.b_size[d] != 1);
      oo += idx[d] * g.out_stride[d];
    }
    fn(ao, bo, oo);
    for (int d = count - 1; d >= 0; --d) {
      if (++idx[d] < g.out_size[d]) break;
      idx[d] = 0;
    }
  }
}

// False when oneDNN cannot run this dtype here (the caller converts to f32). `bias` may be null.
// out_dt: out's dtype, dt's or float32 (Note [16-bit GEMM into float32]).
bool matmul_onednn(const Geometry& g, DType dt, const void* a, const void* b, const void* bias,
                   void* out, DType out_dt) {
  const int first = std::max(0, g.nb - kMaxBatchDims);  // leading dims peeled into a loop
  const bool has_bias = bias != nullptr;
  const onednn::PrimKey key = make_key(g, first, dt, out_dt, has_bias);
  MatmulEntry& e =
      matmul_cache().get(key, [&] { return make_entry(g, first, dt, out_dt, has_bias); });
  if (!e.supported) return false;
  const size_t es = dtype_size(dt), eo = dtype_size(out_dt);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  char* po = static_cast<char*>(out);
  if (has_bias) onednn::bind(e.bias, bias, "matmul");
  for_each_outer(g, first, [&](int64_t ao, int64_t bo, int64_t oo) {
    onednn::bind(e.src, pa + ao * int64_t(es), "matmul");
    onednn::bind(e.wei, pb + bo * int64_t(es), "matmul");
    onednn::bind(e.dst, po + oo * int64_t(eo), "matmul");
    onednn::execute(e.prim, e.args, "matmul");
  });
  return true;
}

// ---------------- Eigen path (f64) ----------------

template <typename T, int Order>
using MatMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0,
                          Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

template <typename T, int Order>
MatMap<T, Order> map_matrix(const T* p, const MatrixLayout& m) {
  return MatMap<T, Order>(
      p, m.rows, m.cols,
      Eigen::OuterStride<>(Order == Eigen::RowMajor ? m.row_stride : m.col_stride));
}

template <typename T>
void gemm_eigen(const T* a, const T* b, const T* bias, T* out, const Geometry& g) {
  OutMap<T> o(out, g.m, g.n);
  auto run = [&](const auto& am) {
    if (g.b.col_stride == 1) {
      o.noalias() = am * map_matrix<T, Eigen::RowMajor>(b, g.b);
    } else {
      o.noalias() = am * map_matrix<T, Eigen::ColMajor>(b, g.b);
    }
  };
  if (g.a.col_stride == 1) {
    run(map_matrix<T, Eigen::RowMajor>(a, g.a));
  } else {
    run(map_matrix<T, Eigen::ColMajor>(a, g.a));
  }
  if (bias) {
    Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> bv(bias, g.n);
    o.rowwise() += bv;
  }
}

void matmul_eigen(const Geometry& g, const Tensor& a, const Tensor& b, const Tensor& bias,
                  Tensor& out) {
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  const double* pbias = bias.defined() ? bias.data<double>() : nullptr;
  double* po = out.data<double>();
  for_each_outer(g, g.nb, [&](int64_t ao, int64_t bo, int64_t oo) {
    gemm_eigen(pa + ao, pb + bo, pbias, po + oo, g);
  });
}

// ---------------- entry ----------------

// A contiguous copy of `t` in dtype `dt` (no autograd: kernels see detached data).
Tensor copy_as(const Tensor& t, DType dt) {
  Tensor c = empty(t.sizes(), TensorOptions(dt, t.device()));
  copy_stub(t.device(), c, t);
  return c;
}

// `t` as float32 in the same matrix layout (a transposed view stays transposed, so oneDNN sees
// the same geometry and the conversion is one contiguous pass); other layouts come out packed.
Tensor to_f32_same_layout(const Tensor& t) {
  const int64_t d = t.dim();
  if (d >= 2 && !t.is_contiguous() && t.stride(-2) == 1 && t.stride(-1) == t.size(-2)) {
    int64_t inner = t.size(-1) * t.size(-2);
    bool packed = true;
    for (int64_t i = d - 3; i >= 0 && packed; --i) {
      packed = t.size(i) == 1 || t.stride(i) == inner;
      inner *= t.size(i);
    }
    if (packed) {
      Tensor c = empty_strided(t.sizes(), t.strides(), TensorOptions(kFloat32, t.device()));
      copy_stub(t.device(), c, t);  // one flat pass over the same layout
      return c;
    }
  }
  return copy_as(t, kFloat32);
}

bool is_canonical(const Tensor& t) {
  MatrixLayout m{t.size(-2), t.size(-1), t.stride(-2), t.stride(-1)};
  return canonical_matrix(m);
}

// One float32 GEMM on raw pointers: sgemm for the plain row-major product without bias (Note
// [sgemm for plain f32]), else the matmul primitive.
void gemm_f32(const Geometry& g, const float* a, const float* b, const float* bias, float* out) {
  if (g.nb == 0 && bias == nullptr && g.a.col_stride == 1 && g.b.col_stride == 1) {
    // Note [sgemm for plain f32]: for a single row-major @ row-major f32 product, oneDNN's GEMM
    // API is as fast as the brgemm matmul primitive or faster (1024^3: 218 vs 209 GFLOP/s on one
    // core; equal at 256^3) and needs no primitive. Transposed operands and bias stay on the
    // primitive, which beats sgemm by 7-10 % on the MLP's backward shapes.
    const dnnl_status_t st = dnnl_sgemm('N', 'N', g.m, g.n, g.k, 1.0f, a, g.a.row_stride, b,
                                        g.b.row_stride, 0.0f, out, g.n);
    onednn::check_status(st, "matmul", "sgemm");
    return;
  }
  ACCEL_CHECK(matmul_onednn(g, kFloat32, a, b, bias, out, kFloat32), Error, "matmul",
              "oneDNN has no f32 matmul for ", g.m, "x", g.k, " @ ", g.k, "x", g.n);
}

// One operand of the float32 route (Note [bf16 through float32, blocked]): 16-bit data converted
// exactly, or float32 data rounded to the 16-bit dtype as it is read (Note [autocast linear in
// float32] in kernels/stubs/linalg.h) unless `exact` says it holds 16-bit values already.
struct LowpOperand {
  const void* p = nullptr;
  bool f32 = false;
  bool exact = false;
};

LowpOperand lowp_operand(const Tensor& t, bool exact = false) {
  if (!t.defined()) return {};
  return {t.data_ptr(), t.dtype() == kFloat32, exact};
}

// The conversions of one 16-bit dtype.
struct LowpConvert {
  void (*up)(const uint16_t*, float*, int64_t);
  void (*down)(const float*, uint16_t*, int64_t);
  // d[i] = s[i] rounded to the 16-bit dtype, kept in float32 (s == d allowed).
  void (*round)(const float*, float*, int64_t);

  explicit LowpConvert(DType low)
      : up(low == kBFloat16 ? &bf16_to_f32 : &f16_to_f32),
        down(low == kBFloat16 ? &f32_to_bf16 : &f32_to_f16),
        round(low == kBFloat16 ? &round_to_bf16 : &round_to_f16) {}

  // d[0..n) = the float32 values of o's elements [off, off + n).
  void load(const LowpOperand& o, int64_t off, float* d, int64_t n) const {
    if (!o.f32) return up(static_cast<const uint16_t*>(o.p) + off, d, n);
    const float* s = static_cast<const float*>(o.p) + off;
    if (o.exact) {
      std::memcpy(d, s, size_t(n) * sizeof(float));
    } else {
      round(s, d, n);
    }
  }
};

// Note [bf16 through float32, blocked]: where the float32 kernel beats the bf16 one (Note [bf16
// GEMM where it does not pay] in cpu_isa.h), and for float16 wherever oneDNN has no f16 kernel
// (oneDNN 2.6 has none on CPUs), a 2-D product converts b to float32 once, then splits the rows of
// a and out into blocks of about 1 MiB: each thread converts its rows of a, runs a one-thread
// float32 GEMM into a scratch block that is still in its L2 when it is rounded into out. Converting
// whole operands instead moves every byte through memory twice more: on the mlp the conversions of
// the unblocked route were 4.8 of 29 ms per step at 0.4 ns per element, against 0.08 ns for data in
// L2. The same loop serves matmul_lowp_stub (Note [autocast linear in float32]): a float32 operand
// is rounded where a 16-bit one is converted, a float32 b that holds 16-bit values already is used
// in place, and a float32 out receives the rounded value.
void matmul_lowp_blocked(const Geometry& g, const LowpOperand& a, const LowpOperand& b,
                         const LowpOperand& bias, void* out, bool out_f32, DType low, Device dev) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const LowpConvert cv(low);
  const TensorOptions f32(kFloat32, dev);
  // b in float32: in place when it is exact float32 already, else packed in its own layout (K
  // rows of N, or N columns of K for a transposed view).
  const bool b_rows = g.b.col_stride == 1;
  Geometry gb = g;
  Tensor b32;
  const float* pb32 = static_cast<const float*>(b.p);
  if (!(b.f32 && b.exact)) {
    b32 = empty({k * n}, f32);
    float* pb = b32.data<float>();
    const int64_t lines = b_rows ? k : n, len = b_rows ? n : k;
    const int64_t lstride = b_rows ? g.b.row_stride : g.b.col_stride;
    parallel_for(lines, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(len, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) cv.load(b, i * lstride, pb + i * len, len);
                 });
    pb32 = pb;
    gb.b = b_rows ? MatrixLayout{k, n, n, 1} : MatrixLayout{k, n, 1, k};
  }
  Tensor bias32;
  if (bias.p != nullptr) {
    bias32 = empty({n}, f32);
    cv.load(bias, 0, bias32.data<float>(), n);
  }
  const float* pbias = bias.p != nullptr ? bias32.data<float>() : nullptr;

  const bool a_rows = g.a.col_stride == 1;
  // Rows per block: a's rows and out's rows in about 1 MiB of float32 (half an L2 of the Xeons
  // measured; 512 KiB blocks made the bias-fused GEMMs 16 % slower), but at least k n / (k + n)
  // rows: every block's GEMM packs all of b again, and that costs as much as the block's own rows
  // of a and out below this size (the mlp's 1024 x 1024 layers: 512 rows, not 128). Then a whole
  // number of blocks per thread (5 blocks on 2 threads would leave one idle for a fifth of the
  // time), each a multiple of 16 rows.
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t flop = m * n * k;
  const int64_t team = flop < (int64_t(1) << 21) ? 1 : threads;  // tiny products: one thread
  const int64_t want = std::max({int64_t(16), (int64_t(1) << 18) / (k + n), k * n / (k + n)});
  int64_t blocks = std::max<int64_t>(1, m / want);
  blocks = std::max(team, (blocks + team - 1) / team * team);
  int64_t mb = (m + blocks - 1) / blocks;
  if (mb > 16) mb = (mb + 15) / 16 * 16;
  blocks = (m + mb - 1) / mb;
  const int64_t nt = std::min(team, blocks);
  const int64_t per_thread = mb * (out_f32 ? k : k + n);  // a float32 out needs no scratch
  Tensor scratch = empty({nt * per_thread}, f32);
  float* ps = scratch.data<float>();
  std::exception_ptr failure;
  if (nt > 1) before_team();  // Note [OpenMP wait default]
#pragma omp parallel for schedule(static) num_threads(int(nt)) if (nt > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    try {
      const int64_t i0 = blk * mb, rows = std::min(mb, m - i0);
      float* a32 = ps + int64_t(omp_get_thread_num()) * per_thread;
      float* c32 = a32 + mb * k;
      Geometry gi = gb;
      gi.m = rows;
      if (a_rows) {
        for (int64_t r = 0; r < rows; ++r) cv.load(a, (i0 + r) * g.a.row_stride, a32 + r * k, k);
        gi.a = MatrixLayout{rows, k, k, 1};
      } else {  // a transposed view: each of its K columns holds `rows` consecutive elements
        for (int64_t c = 0; c < k; ++c) cv.load(a, i0 + c * g.a.col_stride, a32 + c * rows, rows);
        // (one row is the same memory as a row-major one, and sgemm wants lda >= k)
        gi.a = rows == 1 ? MatrixLayout{1, k, k, 1} : MatrixLayout{rows, k, 1, rows};
      }
      if (out_f32) {
        float* o = static_cast<float*>(out) + i0 * n;
        gemm_f32(gi, a32, pb32, pbias, o);
        cv.round(o, o, rows * n);
      } else {
        gemm_f32(gi, a32, pb32, pbias, c32);
        cv.down(c32, static_cast<uint16_t*>(out) + i0 * n, rows * n);
      }
    } catch (...) {
#pragma omp critical(accel_matmul_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void matmul_half_via_f32(const Geometry& g, const Tensor& a, const Tensor& b, const Tensor& bias,
                         Tensor& out) {
  matmul_lowp_blocked(g, lowp_operand(a), lowp_operand(b), lowp_operand(bias), out.data_ptr(),
                      false, out.dtype(), out.device());
}

void matmul_kernel(const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in, Tensor& out) {
  if (out.numel() == 0) return;
  if (a_in.size(-1) == 0) {  // empty inner dim: out = bias or 0
    if (bias_in.defined()) {
      copy_stub(out.device(), out, bias_in);
    } else {
      fill_stub(out.device(), out, Scalar(0));
    }
    return;
  }
  const Tensor a = is_canonical(a_in) ? a_in : copy_as(a_in, a_in.dtype());
  const Tensor b = is_canonical(b_in) ? b_in : copy_as(b_in, b_in.dtype());
  const Tensor bias =
      !bias_in.defined() || bias_in.is_contiguous() ? bias_in : copy_as(bias_in, bias_in.dtype());
  const Geometry g = make_geometry(a, b, out);
  const DType dt = out.dtype();
  // Notes [OpenMP wait default] and [team under load] (sgemm and Eigen open teams too).
  const TeamScope team;
  const OneThreadScope small(one_thread(g, dt));  // Note [GEMM grain]
  if (a.dtype() != dt) {
    // Note [16-bit GEMM into float32]: 16-bit a and b, float32 out, no bias: oneDNN's kernel
    // writes its float32 accumulator; where it has none (or float32 is faster), the float32
    // product of the exactly converted operands (the same exact products, summed in float32).
    ACCEL_INTERNAL_ASSERT(dt == kFloat32 && b.dtype() == a.dtype() && !bias.defined() &&
                          (a.dtype() == kBFloat16 || a.dtype() == kFloat16));
    if (!bf16_via_f32(a.dtype()) &&
        matmul_onednn(g, a.dtype(), a.data_ptr(), b.data_ptr(), nullptr, out.data_ptr(), dt))
      return;
    return matmul_kernel(to_f32_same_layout(a), to_f32_same_layout(b), Tensor(), out);
  }
  if (dt == kFloat64) return matmul_eigen(g, a, b, bias, out);
  if (dt == kFloat32) {
    return gemm_f32(g, a.data<float>(), b.data<float>(),
                    bias.defined() ? bias.data<float>() : nullptr, out.data<float>());
  }
  // bf16 takes the float32 kernel where oneDNN's bf16 one is slower (Note [bf16 GEMM where it
  // does not pay] in kernels/cpu/cpu_isa.h).
  if (!bf16_via_f32(dt) &&
      matmul_onednn(g, dt, a.data_ptr(), b.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                    out.data_ptr(), dt))
    return;
  if ((dt == kBFloat16 || dt == kFloat16) && g.nb == 0 && out.is_contiguous())
    return matmul_half_via_f32(g, a, b, bias, out);
  // No oneDNN implementation for this dtype on this CPU (f16; bf16 without AVX-512), or a
  // batched bf16 product on a CPU where float32 is faster: compute in f32, round once at the end.
  Tensor out32 = empty(out.sizes(), TensorOptions(kFloat32, out.device()));
  matmul_kernel(to_f32_same_layout(a), to_f32_same_layout(b),
                bias.defined() ? copy_as(bias, kFloat32) : Tensor(), out32);
  copy_stub(out.device(), out, out32);
}

// matmul_lowp_stub (Note [autocast linear in float32]).
void matmul_lowp_kernel(const Tensor& a_in, const Tensor& b_in, const Tensor& bias, Tensor& out,
                        DType low, bool b_exact) {
  ACCEL_INTERNAL_ASSERT(a_in.dim() == 2 && b_in.dim() == 2 && out.is_contiguous());
  if (out.numel() == 0) return;
  if (a_in.size(-1) == 0) {  // empty inner dim: out = R(bias) or 0
    if (bias.defined()) {
      copy_stub(out.device(), out, copy_as(bias, low));
    } else {
      fill_stub(out.device(), out, Scalar(0));
    }
    return;
  }
  const Tensor a = is_canonical(a_in) ? a_in : copy_as(a_in, a_in.dtype());
  const Tensor b = is_canonical(b_in) ? b_in : copy_as(b_in, b_in.dtype());
  const Tensor bc = !bias.defined() || bias.is_contiguous() ? bias : copy_as(bias, bias.dtype());
  const Geometry g = make_geometry(a, b, out);
  const TeamScope team;                                 // Note [team under load]
  const OneThreadScope small(one_thread(g, kFloat32));  // Note [GEMM grain]
  matmul_lowp_blocked(g, lowp_operand(a), lowp_operand(b, b_exact), lowp_operand(bc),
                      out.data_ptr(), out.dtype() == kFloat32, low, out.device());
}

void round_to_lowp_kernel(const Tensor& src, Tensor& dst, DType low) {
  ACCEL_INTERNAL_ASSERT(dst.is_contiguous() && src.numel() == dst.numel());
  if (!src.is_contiguous()) copy_stub(dst.device(), dst, src);
  const float* s = src.is_contiguous() ? src.data<float>() : dst.data<float>();
  float* d = dst.data<float>();
  const LowpConvert cv(low);
  parallel_for(dst.numel(), kParallelGrain,
               [&](int64_t lo, int64_t hi) { cv.round(s + lo, d + lo, hi - lo); });
}

bool matmul_lowp_preferred(DType low) { return low == kFloat16 || bf16_via_f32(low); }

}  // namespace

ACCEL_REGISTER_KERNEL(matmul_stub, CPU, &matmul_kernel);
ACCEL_REGISTER_KERNEL(matmul_lowp_stub, CPU, &matmul_lowp_kernel);
ACCEL_REGISTER_KERNEL(round_to_lowp_stub, CPU, &round_to_lowp_kernel);
ACCEL_REGISTER_KERNEL(matmul_lowp_preferred_stub, CPU, &matmul_lowp_preferred);

}  // namespace accel::cpu
