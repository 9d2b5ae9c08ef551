// bench/kernels: for each kernel family, accel's public API next to oneDNN and Eigen called
// directly on the same data, in the same process, on the same OpenMP thread pool.
//
//   build/bench/kernels                                  # everything (about 1-2 minutes)
//   build/bench/kernels --benchmark_filter='^gemm/'      # one family
//   build/bench/kernels --benchmark_format=json          # machine-readable (scripts/bench-report)
//   OMP_NUM_THREADS=1 build/bench/kernels                # single-thread figures
//
// Rows are named `family/impl/shape`; impl is `ours` (the accel API), `dnnl`, `eigen`, or `raw`
// (a plain OpenMP loop). Each row has a rate counter, `GFLOP/s` or `GB/s`, and `peak_frac`, that
// rate over the machine peak measured at start-up in the same run (Note [peaks]). The peaks are
// in the JSON context (`peak_sgemm_gflops`, `peak_memcpy_gbs`) and as rows `peak/...`.
// The float32 `ours` rows come from the op table (tests/ops/, register_ours below). Every `ours`
// row first checks its result (a table row: against the case's function on float64 copies of its
// inputs): a wrong answer or an accel::Error turns the row into an error (`error_message` in the
// JSON), never a timing.
//
// Note [peaks]
// Compute: the best dnnl_sgemm 1024^3 call in 0.3 s (the figure WORKLOADS.md quotes). Bandwidth:
// the best copy of 256 MiB in 0.3 s, split over the OpenMP threads, counted as read + write bytes,
// the convention of every GB/s counter here (an add of n floats moves 3 x 4n bytes; write-
// allocate traffic is not counted, as in STREAM). The 1M-element families fit in L2/L3, so their
// peak_frac can exceed 1; `copy/memcpy/4MiB` is the cache-resident reference at that size.
//
// Note [rates]
// Counters are computed from the wall time of the row's own timed loop (timed_loop below) rather
// than with benchmark's kIsRate flag, which would print every counter, peak_frac included, with a
// "/s" suffix. The loop is the one the library times, so the figures agree with real_time.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unsupported/Eigen/SpecialFunctions>
#include <vector>

#include "accel.h"
#include "kernels/cpu/cpu_isa.h"
#include "optim/adam.h"
#include "op_table.h"

namespace {

using benchmark::State;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMat = Eigen::Map<RowMat>;
using CMapMat = Eigen::Map<const RowMat>;
using MapArr = Eigen::Map<Eigen::ArrayXf>;
using CMapArr = Eigen::Map<const Eigen::ArrayXf>;
using accel::Tensor;

// ---- machine peaks (Note [peaks]) ----
double g_peak_gflops = 0;
double g_peak_gbs = 0;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// f(begin, end) on each OpenMP thread's share of [0, n). Eigen's coefficient-wise expressions and
// memcpy run on one thread; splitting them lets the peer use the same cores as ours.
template <typename F>
void omp_split(int64_t n, F&& f) {
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = std::min(n, tid * chunk), e = std::min(n, b + chunk);
    if (e > b) f(b, e);
  }
}

void parallel_memcpy(float* dst, const float* src, int64_t n) {
  omp_split(n, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, size_t(e - b) * sizeof(float));
  });
}

constexpr int64_t kPeakGemmN = 1024;
constexpr int64_t kPeakCopyFloats = (int64_t(256) << 20) / 4;  // 256 MiB
// Each peak is the best single call seen in this much time (and at least kPeakMinCalls calls),
// so one descheduled call on a busy machine does not lower it.
constexpr double kPeakSeconds = 0.3;
constexpr int kPeakMinCalls = 10;

template <typename F>
double best_call_seconds(F&& f) {
  f();  // warm-up: page faults, oneDNN's kernel generation
  double best = 1e30;
  const auto t_end = Clock::now() + std::chrono::duration<double>(kPeakSeconds);
  for (int calls = 0; calls < kPeakMinCalls || Clock::now() < t_end; ++calls) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

void measure_peaks() {
  {
    const int64_t n = kPeakGemmN;
    std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
    const double secs = best_call_seconds(
        [&] { dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
    g_peak_gflops = 2.0 * double(n) * double(n) * double(n) / secs / 1e9;
  }
  {
    const int64_t n = kPeakCopyFloats;
    std::unique_ptr<float[]> src(new float[size_t(n)]), dst(new float[size_t(n)]);
    // First touch by the threads that will copy, so the pages sit where the copy runs.
    omp_split(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) src[i] = dst[i] = float(i & 255);
    });
    const double secs = best_call_seconds([&] {
      parallel_memcpy(dst.get(), src.get(), n);
      benchmark::ClobberMemory();
    });
    g_peak_gbs = 2.0 * double(n) * sizeof(float) / secs / 1e9;
  }
}

// ---- the timed loop and its counters (Note [rates]) ----
enum class Unit { kFlop, kByte };

template <typename Body>
void timed_loop(State& s, Unit unit, double work_per_iter, Body&& body) {
  const auto t0 = Clock::now();
  for (auto _ : s) body();
  const double secs = seconds_since(t0);
  if (s.error_occurred() || s.iterations() == 0 || secs <= 0) return;
  const double rate = work_per_iter * double(s.iterations()) / secs / 1e9;
  if (unit == Unit::kFlop) {
    s.counters["GFLOP/s"] = rate;
    s.counters["peak_frac"] = rate / g_peak_gflops;
  } else {
    s.counters["GB/s"] = rate;
    s.counters["peak_frac"] = rate / g_peak_gbs;
  }
}

// ---- result checks for `ours` rows ----
// Runs `ours` once and compares it with `ref` (n floats): |ours - ref| <= atol + rtol |ref|.
template <typename F>
bool check_close(State& s, F&& ours, const float* ref, int64_t n, double rtol, double atol) {
  Tensor out;
  try {
    out = ours();
  } catch (const accel::Error& e) {
    s.SkipWithError((std::string("accel::Error: ") + e.what()).c_str());
    return false;
  }
  if (out.numel() != n || out.dtype() != accel::kFloat32) {
    s.SkipWithError(("result has shape " + out.shape_str() + ", expected " + std::to_string(n) +
                     " f32 elements")
                        .c_str());
    return false;
  }
  const Tensor c = out.contiguous();
  const float* o = c.data<float>();
  double worst = 0;
  int64_t worst_at = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double tol = atol + rtol * std::fabs(double(ref[i]));
    const double err = std::isnan(o[i]) != std::isnan(ref[i])
                           ? INFINITY
                           : (std::isnan(o[i]) ? 0.0 : std::fabs(double(o[i]) - double(ref[i])));
    if (err / tol > worst) worst = err / tol, worst_at = i;
  }
  if (worst > 1.0) {
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "result differs from the reference: element %lld is %g, expected %g (%.3g x "
                  "tolerance)",
                  static_cast<long long>(worst_at), double(o[worst_at]), double(ref[worst_at]),
                  worst);
    s.SkipWithError(msg);
    return false;
  }
  return true;
}

Tensor rand_tensor(const accel::Shape& shape, double lo = -1, double hi = 1) {
  return accel::uniform(shape, lo, hi);
}

// ---- oneDNN helpers ----
dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}
dnnl::stream& dnnl_stream() {
  static dnnl::stream strm(dnnl_engine());
  return strm;
}
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
dnnl::memory dnnl_mem(const dnnl::memory::dims& dims, tag t, void* data) {
  return dnnl::memory({dims, dt::f32, t}, dnnl_engine(), data);
}

template <typename F>
void register_bench(const std::string& name, F&& fn) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<F>(fn))->UseRealTime();
}

std::string dims_str(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

// =====================================================================================
// `ours` rows come from the op table (tests/ops/, docs/testing.md): every bench entry of a case
// registers `family/ours/shape`, timing the case's function on float32 CPU inputs from its bench
// maker. The check runs the same function on float64 copies of the inputs (the op's own float64
// kernels) and compares within the entry's tolerance. Rows whose peer is hand-written keep that
// peer below; the bf16/autocast rows and the optimizer rows (state across calls) stay
// hand-written here.
// =====================================================================================
void register_ours(const std::string& family) {
  for (const accel::optable::OpCase& c : accel::optable::op_cases()) {
    for (const accel::optable::OpCase::Bench& b : c.benches) {
      if (b.family != family) continue;
      register_bench(b.family + "/ours/" + b.shape, [&c, &b](State& s) {
        accel::NoGradGuard ng;
        accel::optable::Maker m(accel::kFloat32, accel::kCPU, accel::optable::case_seed(c));
        const accel::optable::In in = b.make(m);
        accel::optable::In in64;
        for (const Tensor& t : in)
          in64.push_back(accel::is_floating(t.dtype()) ? t.detach().to(accel::kFloat64) : t);
        std::vector<float> ref;
        try {
          ref = c.fn(in64).to(accel::kFloat32).contiguous().to_vector<float>();
        } catch (const accel::Error& e) {
          s.SkipWithError((std::string("float64 reference: accel::Error: ") + e.what()).c_str());
          return;
        }
        if (!check_close(
                s, [&] { return c.fn(in); }, ref.data(), int64_t(ref.size()), b.check.rtol,
                b.check.atol))
          return;
        timed_loop(s, b.flops ? Unit::kFlop : Unit::kByte, b.work, [&] {
          Tensor y = c.fn(in);
          benchmark::DoNotOptimize(y.data_ptr());
        });
      });
    }
  }
}

// =====================================================================================
// Peaks as rows of their own, so the report can show them next to everything else.
// =====================================================================================
void register_peaks() {
  register_bench("peak/dnnl_sgemm/1024x1024x1024", [](State& s) {
    const int64_t n = kPeakGemmN;
    std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
    timed_loop(s, Unit::kFlop, 2.0 * double(n) * double(n) * double(n), [&] {
      dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
      benchmark::DoNotOptimize(c.data());
    });
  });
  for (int64_t mib : {int64_t(256), int64_t(4)}) {
    register_bench((mib == 256 ? "peak/memcpy/" : "copy/memcpy/") + std::to_string(mib) + "MiB",
                   [mib](State& s) {
                     const int64_t n = (mib << 20) / 4;
                     std::vector<float> a(size_t(n), 1.f), b(size_t(n), 0.f);
                     timed_loop(s, Unit::kByte, 2.0 * double(n) * 4, [&] {
                       parallel_memcpy(b.data(), a.data(), n);
                       benchmark::ClobberMemory();
                     });
                   });
  }
}

// =====================================================================================
// GEMM: C (M, N) = A (M, K) @ B (K, N), row-major; shapes are named MxKxN.
// gemm_nt is the nn.Linear form the models run: y (M, N) = x (M, K) @ W^T, W (N, K).
// =====================================================================================
struct GemmShape {
  int64_t m, k, n;
};

void register_gemm() {
  const GemmShape shapes[] = {
      {1024, 1024, 1024},  // the reference square
      {256, 256, 256},     // small square: per-call overhead starts to show
      {4096, 1024, 64},    // skinny N (a projection to a narrow output)
      {256, 784, 1024},    // mlp layer 1 (batch 256)
      {1, 1024, 1024},     // one row: a GEMV, bandwidth-bound
  };
  register_ours("gemm");  // the same shapes, from the matmul case's bench entries
  for (const GemmShape g : shapes) {
    const std::string sh = dims_str({g.m, g.k, g.n});
    const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
    register_bench("gemm/dnnl/" + sh, [g, flops](State& s) {
      const Tensor a = rand_tensor({g.m, g.k}), b = rand_tensor({g.k, g.n});
      std::vector<float> c(size_t(g.m * g.n));
      timed_loop(s, Unit::kFlop, flops, [&] {
        dnnl_sgemm('N', 'N', g.m, g.n, g.k, 1.f, a.data<float>(), g.k, b.data<float>(), g.n, 0.f,
                   c.data(), g.n);
        benchmark::DoNotOptimize(c.data());
      });
    });
    register_bench("gemm/eigen/" + sh, [g, flops](State& s) {
      const Tensor a = rand_tensor({g.m, g.k}), b = rand_tensor({g.k, g.n});
      CMapMat A(a.data<float>(), g.m, g.k), B(b.data<float>(), g.k, g.n);
      RowMat C(g.m, g.n);
      timed_loop(s, Unit::kFlop, flops, [&] {
        C.noalias() = A * B;
        benchmark::DoNotOptimize(C.data());
      });
    });
  }

  // The mlp's three layers.
  const GemmShape nt_shapes[] = {{256, 784, 1024}, {256, 1024, 1024}, {256, 1024, 10}};
  register_ours("gemm_nt");
  for (const GemmShape g : nt_shapes) {
    const std::string sh = dims_str({g.m, g.k, g.n});
    const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
    register_bench("gemm_nt/dnnl/" + sh, [g, flops](State& s) {
      const Tensor x = rand_tensor({g.m, g.k}), w = rand_tensor({g.n, g.k});
      std::vector<float> y(size_t(g.m * g.n));
      timed_loop(s, Unit::kFlop, flops, [&] {
        dnnl_sgemm('N', 'T', g.m, g.n, g.k, 1.f, x.data<float>(), g.k, w.data<float>(), g.k, 0.f,
                   y.data(), g.n);
        benchmark::DoNotOptimize(y.data());
      });
    });
    register_bench("gemm_nt/eigen/" + sh, [g, flops](State& s) {
      const Tensor x = rand_tensor({g.m, g.k}), w = rand_tensor({g.n, g.k});
      CMapMat X(x.data<float>(), g.m, g.k), W(w.data<float>(), g.n, g.k);
      RowMat Y(g.m, g.n);
      timed_loop(s, Unit::kFlop, flops, [&] {
        Y.noalias() = X * W.transpose();
        benchmark::DoNotOptimize(Y.data());
      });
    });
  }
}

// =====================================================================================
// bf16 GEMM (issue 14): ours on bf16 tensors, ours on float32 tensors under autocast (the right
// operand a parameter, so its bf16 copy comes from the weight cache as in a Linear layer; the
// left one converted on every call), and oneDNN's matmul primitive called directly on bf16
// memory. Checked against the float32 dnnl_sgemm result within bf16 tolerance.
// =====================================================================================
void register_gemm_bf16() {
  const GemmShape shapes[] = {{1024, 1024, 1024}, {256, 784, 1024}, {256, 1024, 1024}};
  for (const GemmShape g : shapes) {
    const std::string sh = dims_str({g.m, g.k, g.n});
    const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
    // bf16 inputs, fp32 accumulation, bf16 output: errors grow like sqrt(K) of the input
    // rounding (2^-9) on top of the output rounding.
    const double atol = 1e-2 * std::sqrt(double(g.k)), rtol = 1e-2;
    for (const bool autocast : {false, true}) {
      register_bench(std::string("gemm_bf16/") + (autocast ? "autocast/" : "ours/") + sh,
                     [g, flops, atol, rtol, autocast](State& s) {
                       accel::NoGradGuard ng;
                       const Tensor a = rand_tensor({g.m, g.k}), b = rand_tensor({g.k, g.n});
                       std::vector<float> ref(size_t(g.m * g.n));
                       dnnl_sgemm('N', 'N', g.m, g.n, g.k, 1.f, a.data<float>(), g.k,
                                  b.data<float>(), g.n, 0.f, ref.data(), g.n);
                       const Tensor a16 = a.to(accel::kBFloat16), b16 = b.to(accel::kBFloat16);
                       const Tensor w = b.clone().requires_grad_();
                       accel::AutocastGuard region(autocast, accel::kBFloat16);
                       auto run = [&] {
                         return autocast ? accel::matmul(a, w) : accel::matmul(a16, b16);
                       };
                       if (!check_close(
                               s, [&] { return run().to(accel::kFloat32); }, ref.data(), g.m * g.n,
                               rtol, atol))
                         return;
                       timed_loop(s, Unit::kFlop, flops, [&] {
                         Tensor c = run();
                         benchmark::DoNotOptimize(c.data_ptr());
                       });
                     });
    }
    register_bench("gemm_bf16/dnnl/" + sh, [g, flops](State& s) {
      const Tensor a = rand_tensor({g.m, g.k}).to(accel::kBFloat16);
      const Tensor b = rand_tensor({g.k, g.n}).to(accel::kBFloat16);
      const Tensor c = accel::empty({g.m, g.n}, accel::kBFloat16);
      const dnnl::memory::desc a_md({g.m, g.k}, dt::bf16, tag::ab),
          b_md({g.k, g.n}, dt::bf16, tag::ab), c_md({g.m, g.n}, dt::bf16, tag::ab);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), dnnl_engine());
      const dnnl::matmul prim(pd);
      dnnl::memory am(a_md, dnnl_engine(), a.data_ptr()), bm(b_md, dnnl_engine(), b.data_ptr()),
          cm(c_md, dnnl_engine(), c.data_ptr());
      timed_loop(s, Unit::kFlop, flops, [&] {
        prim.execute(dnnl_stream(),
                     {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        dnnl_stream().wait();
        benchmark::DoNotOptimize(c.data_ptr());
      });
    });
  }
}

// =====================================================================================
// conv2d, the cnn workload's two convolutions (batch 128, 3x3, pad 1, stride 1, with bias):
//   conv1 x (128, 1, 28, 28)  w (32, 1, 3, 3)  -> (128, 32, 28, 28)
//   conv2 x (128, 32, 14, 14) w (64, 32, 3, 3) -> (128, 64, 14, 14)
// dnnl_nchw: the primitive on plain NCHW/OIHW memory, as a framework that keeps NCHW tensors
// would call it. dnnl_blocked: the primitive on the layouts it prefers, reorders excluded (the
// convolution alone; an upper bound). eigen: im2col per image + Eigen GEMM, images over threads.
// =====================================================================================
struct ConvShape {
  const char* name;
  int64_t n, cin, h, w, cout;
};
constexpr int64_t kConvK = 3, kConvPad = 1;

double conv_flops(const ConvShape& c) {
  return 2.0 * double(c.n) * double(c.cout) * double(c.h) * double(c.w) * double(c.cin) *
         double(kConvK * kConvK);
}

// oneDNN forward convolution; `any` lets the primitive pick blocked layouts.
struct DnnlConv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  DnnlConv(const ConvShape& c, bool any, dt type = dt::f32) {
    const tag t_src = any ? tag::any : tag::nchw, t_w = any ? tag::any : tag::oihw;
    const dnnl::memory::desc src({c.n, c.cin, c.h, c.w}, type, t_src);
    const dnnl::memory::desc wei({c.cout, c.cin, kConvK, kConvK}, type, t_w);
    const dnnl::memory::desc bias({c.cout}, type, tag::a);
    const dnnl::memory::desc dst({c.n, c.cout, c.h, c.w}, type, t_src);
    pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_direct, src, wei, bias, dst,
                                        {1, 1}, {kConvPad, kConvPad}, {kConvPad, kConvPad}),
        dnnl_engine());
    prim = dnnl::convolution_forward(pd);
  }
};

// x (cin, h, w) -> col (cin*9, h*w), zero padding.
void im2col(const float* x, int64_t cin, int64_t h, int64_t w, float* col) {
  for (int64_t c = 0; c < cin; ++c)
    for (int64_t kh = 0; kh < kConvK; ++kh)
      for (int64_t kw = 0; kw < kConvK; ++kw) {
        float* row = col + ((c * kConvK + kh) * kConvK + kw) * h * w;
        for (int64_t oh = 0; oh < h; ++oh) {
          const int64_t ih = oh + kh - kConvPad;
          for (int64_t ow = 0; ow < w; ++ow) {
            const int64_t iw = ow + kw - kConvPad;
            row[oh * w + ow] =
                (ih >= 0 && ih < h && iw >= 0 && iw < w) ? x[(c * h + ih) * w + iw] : 0.f;
          }
        }
      }
}

// The float32 oneDNN primitive on plain NCHW memory: the reference our conv rows are checked
// against.
std::vector<float> conv_reference(const ConvShape& c, const Tensor& x, const Tensor& w,
                                  const Tensor& b, int64_t out_n) {
  std::vector<float> ref(static_cast<size_t>(out_n));
  DnnlConv conv(c, false);
  conv.prim.execute(
      dnnl_stream(),
      {{DNNL_ARG_SRC, dnnl::memory(conv.pd.src_desc(), dnnl_engine(), x.data_ptr())},
       {DNNL_ARG_WEIGHTS, dnnl::memory(conv.pd.weights_desc(), dnnl_engine(), w.data_ptr())},
       {DNNL_ARG_BIAS, dnnl::memory(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr())},
       {DNNL_ARG_DST, dnnl::memory(conv.pd.dst_desc(), dnnl_engine(), ref.data())}});
  dnnl_stream().wait();
  return ref;
}

void register_conv() {
  const ConvShape shapes[] = {{"conv1", 128, 1, 28, 28, 32}, {"conv2", 128, 32, 14, 14, 64}};
  register_ours("conv2d");  // the same shapes, from the conv2d case's bench entries
  for (const ConvShape c : shapes) {
    const std::string sh =
        std::string(c.name) + "_" + dims_str({c.n, c.cin, c.h, c.w}) + "_" + std::to_string(c.cout);
    const double flops = conv_flops(c);
    const int64_t out_n = c.n * c.cout * c.h * c.w;
    for (bool any : {false, true}) {
      register_bench(
          std::string("conv2d/") + (any ? "dnnl_blocked/" : "dnnl_nchw/") + sh,
          [c, flops, out_n, any](State& s) {
            const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}),
                         w = rand_tensor({c.cout, c.cin, 3, 3}), b = rand_tensor({c.cout});
            DnnlConv conv(c, any);
            // Reorder the plain inputs into the primitive's layouts once, outside the timing.
            auto prepare = [&](const dnnl::memory::desc& want, const dnnl::memory::desc& plain,
                               void* data) {
              dnnl::memory user(plain, dnnl_engine(), data);
              if (want == plain) return user;
              dnnl::memory m(want, dnnl_engine());
              dnnl::reorder(user, m).execute(dnnl_stream(), user, m);
              dnnl_stream().wait();
              return m;
            };
            auto msrc = prepare(conv.pd.src_desc(), {{c.n, c.cin, c.h, c.w}, dt::f32, tag::nchw},
                                x.data_ptr());
            auto mwei = prepare(conv.pd.weights_desc(), {{c.cout, c.cin, 3, 3}, dt::f32, tag::oihw},
                                w.data_ptr());
            dnnl::memory mbias(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr());
            dnnl::memory mdst(conv.pd.dst_desc(), dnnl_engine());
            timed_loop(s, Unit::kFlop, flops, [&] {
              conv.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                                {DNNL_ARG_WEIGHTS, mwei},
                                                {DNNL_ARG_BIAS, mbias},
                                                {DNNL_ARG_DST, mdst}});
              dnnl_stream().wait();
            });
            s.SetLabel(conv.pd.impl_info_str());
            (void)out_n;
          });
    }
    // bf16 (issue 14): ours on bf16 tensors against the primitive on bf16 NCHW memory, checked
    // against the float32 primitive within bf16 tolerance (K = cin * 9 products per output).
    register_bench("conv2d_bf16/ours/" + sh, [c, flops, out_n](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}), w = rand_tensor({c.cout, c.cin, 3, 3}),
                   b = rand_tensor({c.cout});
      const std::vector<float> ref = conv_reference(c, x, w, b, out_n);
      const Tensor x16 = x.to(accel::kBFloat16), w16 = w.to(accel::kBFloat16),
                   b16 = b.to(accel::kBFloat16);
      auto run = [&] {
        return accel::conv2d(x16, w16, b16, {1, 1}, {kConvPad, kConvPad}, {1, 1}, 1);
      };
      const double atol = 1e-2 * std::sqrt(double(c.cin * kConvK * kConvK));
      if (!check_close(
              s, [&] { return run().to(accel::kFloat32); }, ref.data(), out_n, 1e-2, atol))
        return;
      timed_loop(s, Unit::kFlop, flops, [&] {
        Tensor y = run();
        benchmark::DoNotOptimize(y.data_ptr());
      });
    });
    register_bench("conv2d_bf16/dnnl_nchw/" + sh, [c, flops](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}).to(accel::kBFloat16),
                   w = rand_tensor({c.cout, c.cin, 3, 3}).to(accel::kBFloat16),
                   b = rand_tensor({c.cout}).to(accel::kBFloat16);
      const Tensor y = accel::empty({c.n, c.cout, c.h, c.w}, accel::kBFloat16);
      DnnlConv conv(c, false, dt::bf16);
      dnnl::memory msrc(conv.pd.src_desc(), dnnl_engine(), x.data_ptr()),
          mwei(conv.pd.weights_desc(), dnnl_engine(), w.data_ptr()),
          mbias(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr()),
          mdst(conv.pd.dst_desc(), dnnl_engine(), y.data_ptr());
      timed_loop(s, Unit::kFlop, flops, [&] {
        conv.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                          {DNNL_ARG_WEIGHTS, mwei},
                                          {DNNL_ARG_BIAS, mbias},
                                          {DNNL_ARG_DST, mdst}});
        dnnl_stream().wait();
      });
      s.SetLabel(conv.pd.impl_info_str());
    });
    register_bench("conv2d/eigen/" + sh, [c, flops, out_n](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}), w = rand_tensor({c.cout, c.cin, 3, 3}),
                   b = rand_tensor({c.cout});
      std::vector<float> y(static_cast<size_t>(out_n));
      const int64_t kk = c.cin * kConvK * kConvK, hw = c.h * c.w;
      const CMapMat W(w.data<float>(), c.cout, kk);
      const Eigen::Map<const Eigen::VectorXf> bias(b.data<float>(), c.cout);
      const float* px = x.data<float>();
      timed_loop(s, Unit::kFlop, flops, [&] {
#pragma omp parallel
        {
          RowMat col(kk, hw);  // per thread
#pragma omp for schedule(static)
          for (int64_t img = 0; img < c.n; ++img) {
            im2col(px + img * c.cin * hw, c.cin, c.h, c.w, col.data());
            MapMat Y(y.data() + img * c.cout * hw, c.cout, hw);
            Y.noalias() = W * col;  // single-threaded inside the parallel region
            Y.colwise() += bias;
          }
        }
        benchmark::DoNotOptimize(y.data());
      });
    });
  }
}

// =====================================================================================
// Elementwise over 1M f32: add and mul move 3 arrays, gelu (erf form) moves 2.
// =====================================================================================
constexpr int64_t kEltN = int64_t(1) << 20;

void register_elementwise() {
  const std::string sh = "1M";
  const double bytes3 = 3.0 * double(kEltN) * 4, bytes2 = 2.0 * double(kEltN) * 4;
  for (const char* family : {"add", "mul", "gelu", "gelu_tanh"}) register_ours(family);

  // ---- oneDNN binary / eltwise primitives ----
  for (const bool is_add : {true, false}) {
    register_bench(std::string(is_add ? "add" : "mul") + "/dnnl/" + sh, [is_add, bytes3](State& s) {
      const Tensor a = rand_tensor({kEltN}), b = rand_tensor({kEltN});
      std::vector<float> c(static_cast<size_t>(kEltN));
      auto ma = dnnl_mem({kEltN}, tag::a, a.data_ptr()),
           mb = dnnl_mem({kEltN}, tag::a, b.data_ptr()), mc = dnnl_mem({kEltN}, tag::a, c.data());
      dnnl::binary::primitive_desc pd(
          dnnl::binary::desc(is_add ? dnnl::algorithm::binary_add : dnnl::algorithm::binary_mul,
                             ma.get_desc(), mb.get_desc(), mc.get_desc()),
          dnnl_engine());
      dnnl::binary prim(pd);
      timed_loop(s, Unit::kByte, bytes3, [&] {
        prim.execute(dnnl_stream(),
                     {{DNNL_ARG_SRC_0, ma}, {DNNL_ARG_SRC_1, mb}, {DNNL_ARG_DST, mc}});
        dnnl_stream().wait();
      });
      s.SetLabel(pd.impl_info_str());
    });
  }
  for (const bool erf : {true, false}) {
    register_bench(std::string(erf ? "gelu" : "gelu_tanh") + "/dnnl/" + sh, [erf,
                                                                             bytes2](State& s) {
      const Tensor x = rand_tensor({kEltN}, -4, 4);
      std::vector<float> y(static_cast<size_t>(kEltN));
      auto mx = dnnl_mem({kEltN}, tag::a, x.data_ptr()), my = dnnl_mem({kEltN}, tag::a, y.data());
      dnnl::eltwise_forward::primitive_desc pd(
          dnnl::eltwise_forward::desc(
              dnnl::prop_kind::forward_inference,
              erf ? dnnl::algorithm::eltwise_gelu_erf : dnnl::algorithm::eltwise_gelu_tanh,
              mx.get_desc(), 0.f, 0.f),
          dnnl_engine());
      dnnl::eltwise_forward prim(pd);
      timed_loop(s, Unit::kByte, bytes2, [&] {
        prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}});
        dnnl_stream().wait();
      });
      s.SetLabel(pd.impl_info_str());
    });
  }

  // ---- Eigen array expressions over the OpenMP team ----
  for (const bool is_add : {true, false}) {
    register_bench(std::string(is_add ? "add" : "mul") + "/eigen/" + sh,
                   [is_add, bytes3](State& s) {
                     const Tensor a = rand_tensor({kEltN}), b = rand_tensor({kEltN});
                     std::vector<float> c(static_cast<size_t>(kEltN));
                     const float *pa = a.data<float>(), *pb = b.data<float>();
                     timed_loop(s, Unit::kByte, bytes3, [&] {
                       omp_split(kEltN, [&](int64_t lo, int64_t hi) {
                         const CMapArr xa(pa + lo, hi - lo), xb(pb + lo, hi - lo);
                         MapArr out(c.data() + lo, hi - lo);
                         if (is_add)
                           out = xa + xb;
                         else
                           out = xa * xb;
                       });
                       benchmark::DoNotOptimize(c.data());
                     });
                   });
  }
  register_bench("gelu/eigen/" + sh, [bytes2](State& s) {
    const Tensor x = rand_tensor({kEltN}, -4, 4);
    std::vector<float> y(static_cast<size_t>(kEltN));
    const float* px = x.data<float>();
    timed_loop(s, Unit::kByte, bytes2, [&] {
      omp_split(kEltN, [&](int64_t lo, int64_t hi) {
        const CMapArr xa(px + lo, hi - lo);
        MapArr(y.data() + lo, hi - lo) = 0.5f * xa * (1.f + (xa * float(M_SQRT1_2)).erf());
      });
      benchmark::DoNotOptimize(y.data());
    });
  });
}

// =====================================================================================
// conv_transpose2d, DCGAN generator layers (batch 64, 4x4 kernel, stride 2, padding 1, with
// bias; each layer doubles H and W):
//   dcgan2 x (64, 256, 8, 8)  w (256, 128, 4, 4) -> (64, 128, 16, 16)
//   dcgan4 x (64, 64, 32, 32) w (64, 3, 4, 4)    -> (64, 3, 64, 64)
// FLOPs: 2 x every input pixel times C_out k^2. ours runs oneDNN's convolution backward-data
// (Note [transposed convolution through the conv kernels]); the peers call oneDNN's deconvolution
// primitive, dnnl_nchw on plain NCHW / IOHW memory (torch's weight layout), dnnl_blocked on the
// layouts it prefers with reorders excluded (an upper bound).
// =====================================================================================
void register_conv_transpose() {
  struct DeconvShape {
    const char* name;
    int64_t n, cin, h, w, cout;
  };
  constexpr int64_t k = 4, stride = 2, padv = 1;
  const DeconvShape shapes[] = {{"dcgan2", 64, 256, 8, 8, 128}, {"dcgan4", 64, 64, 32, 32, 3}};
  register_ours("conv_transpose2d");  // the same shapes, from the conv_transpose2d case
  for (const DeconvShape c : shapes) {
    const std::string sh =
        std::string(c.name) + "_" + dims_str({c.n, c.cin, c.h, c.w}) + "_" + std::to_string(c.cout);
    const double flops = 2.0 * double(c.n * c.cin * c.h * c.w) * double(c.cout * k * k);
    const int64_t ho = (c.h - 1) * stride - 2 * padv + k, wo = (c.w - 1) * stride - 2 * padv + k;
    for (bool any : {false, true}) {
      register_bench(
          std::string("conv_transpose2d/") + (any ? "dnnl_blocked/" : "dnnl_nchw/") + sh,
          [c, flops, any, ho, wo](State& s) {
            const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}),
                         w = rand_tensor({c.cin, c.cout, k, k}), b = rand_tensor({c.cout});
            const dnnl::memory::desc src_p({c.n, c.cin, c.h, c.w}, dt::f32, tag::nchw),
                wei_p({c.cout, c.cin, k, k}, dt::f32, tag::iohw),
                dst_p({c.n, c.cout, ho, wo}, dt::f32, tag::nchw), bias({c.cout}, dt::f32, tag::a);
            const dnnl::memory::desc src_a({c.n, c.cin, c.h, c.w}, dt::f32, tag::any),
                wei_a({c.cout, c.cin, k, k}, dt::f32, tag::any),
                dst_a({c.n, c.cout, ho, wo}, dt::f32, tag::any);
            dnnl::deconvolution_forward::primitive_desc pd(
                dnnl::deconvolution_forward::desc(
                    dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                    any ? src_a : src_p, any ? wei_a : wei_p, bias, any ? dst_a : dst_p,
                    {stride, stride}, {0, 0}, {padv, padv}, {padv, padv}),
                dnnl_engine());
            dnnl::deconvolution_forward prim(pd);
            auto prepare = [&](const dnnl::memory::desc& want, const dnnl::memory::desc& plain,
                               void* data) {
              dnnl::memory user(plain, dnnl_engine(), data);
              if (want == plain) return user;
              dnnl::memory m(want, dnnl_engine());
              dnnl::reorder(user, m).execute(dnnl_stream(), user, m);
              dnnl_stream().wait();
              return m;
            };
            auto msrc = prepare(pd.src_desc(), src_p, x.data_ptr());
            auto mwei = prepare(pd.weights_desc(), wei_p, w.data_ptr());
            dnnl::memory mbias(bias, dnnl_engine(), b.data_ptr());
            dnnl::memory mdst(pd.dst_desc(), dnnl_engine());
            timed_loop(s, Unit::kFlop, flops, [&] {
              prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                           {DNNL_ARG_WEIGHTS, mwei},
                                           {DNNL_ARG_BIAS, mbias},
                                           {DNNL_ARG_DST, mdst}});
              dnnl_stream().wait();
            });
            s.SetLabel(pd.impl_info_str());
          });
    }
  }
}

// =====================================================================================
// group_norm, 32 groups with per-channel weight and bias, eps 1e-5: (32, 128, 32, 32) and
// (8, 256, 64, 64). Reads x, writes y: 2 x 4n bytes. oneDNN 2.6 has no group normalization
// primitive (it came in 3.3); the nearest, dnnl_lnorm, is its layer normalization over the
// (N G, C / G H W) rows, which computes the same statistics and normalisation but cannot apply a
// per-channel affine (its scale / shift run along the normalised dim): it does slightly less work.
// =====================================================================================
void register_group_norm() {
  register_ours("group_norm");  // from the group_norm case's bench entries
  constexpr int64_t groups = 32;
  constexpr double kGnEps = 1e-5;
  for (const accel::Shape& sh : {accel::Shape{32, 128, 32, 32}, accel::Shape{8, 256, 64, 64}}) {
    const int64_t n = sh[0] * sh[1] * sh[2] * sh[3];
    const int64_t rows = sh[0] * groups, cols = n / rows;
    const double bytes = 2.0 * double(n) * 4;
    register_bench("group_norm/dnnl_lnorm/" + accel::optable::dims_str(sh) + "_32",
                   [rows, cols, n, bytes](State& s) {
                     const Tensor x = rand_tensor({rows, cols}, -3, 3);
                     std::vector<float> y(static_cast<size_t>(n));
                     auto mx = dnnl_mem({rows, cols}, tag::ab, x.data_ptr()),
                          my = dnnl_mem({rows, cols}, tag::ab, y.data());
                     dnnl::layer_normalization_forward::primitive_desc pd(
                         dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_inference,
                                                                 mx.get_desc(), float(kGnEps),
                                                                 dnnl::normalization_flags::none),
                         dnnl_engine());
                     dnnl::layer_normalization_forward prim(pd);
                     timed_loop(s, Unit::kByte, bytes, [&] {
                       prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}});
                       dnnl_stream().wait();
                     });
                     s.SetLabel(pd.impl_info_str());
                   });
  }
}

// =====================================================================================
// Row softmax (last dim): (4096, 256) and the gpt attention scores (32*4*128, 128).
// layer_norm over the last 128 of (4096, 128), with weight and bias, eps 1e-5.
// Both read one array and write one: 2 x 4n bytes.
// =====================================================================================
void softmax_rows_eigen(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const CMapArr xr(x + r * cols, cols);
    MapArr yr(y + r * cols, cols);
    yr = (xr - xr.maxCoeff()).exp();
    yr *= 1.f / yr.sum();
  }
}

constexpr double kLnEps = 1e-5;

void layer_norm_rows_eigen(const float* x, const float* w, const float* b, float* y, int64_t rows,
                           int64_t cols) {
  const CMapArr wa(w, cols), ba(b, cols);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const CMapArr xr(x + r * cols, cols);
    const float mean = xr.mean();
    const float var = (xr - mean).square().mean();
    const float rstd = 1.f / std::sqrt(var + float(kLnEps));
    MapArr(y + r * cols, cols) = (xr - mean) * rstd * wa + ba;
  }
}

void register_norms() {
  register_ours("softmax");
  const std::pair<int64_t, int64_t> softmax_shapes[] = {{4096, 256}, {32 * 4 * 128, 128}};
  for (const auto& [rows, cols] : softmax_shapes) {
    const std::string sh = dims_str({rows, cols});
    const int64_t n = rows * cols;
    const double bytes = 2.0 * double(n) * 4;
    register_bench("softmax/dnnl/" + sh, [rows, cols, n, bytes](State& s) {
      const Tensor x = rand_tensor({rows, cols}, -5, 5);
      std::vector<float> y(static_cast<size_t>(n));
      auto mx = dnnl_mem({rows, cols}, tag::ab, x.data_ptr()),
           my = dnnl_mem({rows, cols}, tag::ab, y.data());
      dnnl::softmax_forward::primitive_desc pd(
          dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, mx.get_desc(), 1),
          dnnl_engine());
      dnnl::softmax_forward prim(pd);
      timed_loop(s, Unit::kByte, bytes, [&] {
        prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}});
        dnnl_stream().wait();
      });
      s.SetLabel(pd.impl_info_str());
    });
    register_bench("softmax/eigen/" + sh, [rows, cols, n, bytes](State& s) {
      const Tensor x = rand_tensor({rows, cols}, -5, 5);
      std::vector<float> y(static_cast<size_t>(n));
      timed_loop(s, Unit::kByte, bytes, [&] {
        softmax_rows_eigen(x.data<float>(), y.data(), rows, cols);
        benchmark::DoNotOptimize(y.data());
      });
    });
  }

  constexpr int64_t rows = 4096, cols = 128, n = rows * cols;
  const std::string sh = dims_str({rows, cols});
  const double bytes = 2.0 * double(n) * 4;
  register_ours("layer_norm");
  register_bench("layer_norm/dnnl/" + sh, [bytes](State& s) {
    const Tensor x = rand_tensor({rows, cols}, -3, 3), w = rand_tensor({cols}),
                 b = rand_tensor({cols});
    std::vector<float> y(static_cast<size_t>(n));
    auto mx = dnnl_mem({rows, cols}, tag::ab, x.data_ptr()),
         my = dnnl_mem({rows, cols}, tag::ab, y.data());
    auto mw = dnnl_mem({cols}, tag::a, w.data_ptr()), mb = dnnl_mem({cols}, tag::a, b.data_ptr());
    dnnl::layer_normalization_forward::primitive_desc pd(
        dnnl::layer_normalization_forward::desc(
            dnnl::prop_kind::forward_inference, mx.get_desc(), float(kLnEps),
            dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift),
        dnnl_engine());
    dnnl::layer_normalization_forward prim(pd);
    timed_loop(s, Unit::kByte, bytes, [&] {
      prim.execute(
          dnnl_stream(),
          {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}, {DNNL_ARG_SCALE, mw}, {DNNL_ARG_SHIFT, mb}});
      dnnl_stream().wait();
    });
    s.SetLabel(pd.impl_info_str());
  });
  register_bench("layer_norm/eigen/" + sh, [bytes](State& s) {
    const Tensor x = rand_tensor({rows, cols}, -3, 3), w = rand_tensor({cols}),
                 b = rand_tensor({cols});
    std::vector<float> y(static_cast<size_t>(n));
    timed_loop(s, Unit::kByte, bytes, [&] {
      layer_norm_rows_eigen(x.data<float>(), w.data<float>(), b.data<float>(), y.data(), rows,
                            cols);
      benchmark::DoNotOptimize(y.data());
    });
  });
}

// =====================================================================================
// cross_entropy, mean over rows: the gpt head's logits (32*128, 256) and int64 targets.
// Reads the logits once: 4n bytes. Peer: a fused log-sum-exp loop.
// =====================================================================================
float cross_entropy_raw(const float* logits, const int64_t* target, int64_t rows, int64_t cols) {
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t r = 0; r < rows; ++r) {
    const CMapArr xr(logits + r * cols, cols);
    const float m = xr.maxCoeff();
    const float lse = m + std::log((xr - m).exp().sum());
    total += double(lse - xr[target[r]]);
  }
  return float(total / double(rows));
}

void register_cross_entropy() {
  constexpr int64_t rows = 32 * 128, cols = 256;
  const std::string sh = dims_str({rows, cols});
  const double bytes = double(rows) * double(cols) * 4;
  register_ours("cross_entropy");
  register_bench("cross_entropy/raw/" + sh, [bytes](State& s) {
    const Tensor x = rand_tensor({rows, cols}, -5, 5), t = accel::randint(0, cols, {rows});
    timed_loop(s, Unit::kByte, bytes, [&] {
      benchmark::DoNotOptimize(cross_entropy_raw(x.data<float>(), t.data<int64_t>(), rows, cols));
    });
  });
}

// =====================================================================================
// Reductions of a (4096, 1024) matrix: sum over dim 0 (-> 1024) and over dim 1 (-> 4096).
// Reads 4n bytes.
// =====================================================================================
constexpr int64_t kRedRows = 4096, kRedCols = 1024;

void register_reduce() {
  const std::string sh = dims_str({kRedRows, kRedCols});
  const double bytes = double(kRedRows) * double(kRedCols) * 4;
  for (const int64_t dim : {int64_t(0), int64_t(1)}) {
    const std::string fam = "sum_dim" + std::to_string(dim);
    const int64_t out_n = dim == 0 ? kRedCols : kRedRows;
    register_ours(fam);
    register_bench(fam + "/dnnl/" + sh, [dim, out_n, bytes](State& s) {
      const Tensor x = rand_tensor({kRedRows, kRedCols});
      std::vector<float> y(static_cast<size_t>(out_n));
      auto mx = dnnl_mem({kRedRows, kRedCols}, tag::ab, x.data_ptr());
      auto my =
          dnnl_mem(dim == 0 ? dnnl::memory::dims{1, kRedCols} : dnnl::memory::dims{kRedRows, 1},
                   tag::ab, y.data());
      dnnl::reduction::primitive_desc pd(
          dnnl::reduction::desc(dnnl::algorithm::reduction_sum, mx.get_desc(), my.get_desc(), 0.f,
                                0.f),
          dnnl_engine());
      dnnl::reduction prim(pd);
      timed_loop(s, Unit::kByte, bytes, [&] {
        prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}});
        dnnl_stream().wait();
      });
      s.SetLabel(pd.impl_info_str());
    });
    register_bench(fam + "/eigen/" + sh, [dim, out_n, bytes](State& s) {
      const Tensor x = rand_tensor({kRedRows, kRedCols});
      const float* px = x.data<float>();
      Eigen::VectorXf y(out_n);
      timed_loop(s, Unit::kByte, bytes, [&] {
        if (dim == 0) {
          // A block of columns per thread, each summed down all rows.
          omp_split(kRedCols, [&](int64_t lo, int64_t hi) {
            const Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> blk(
                px + lo, kRedRows, hi - lo, Eigen::OuterStride<>(kRedCols));
            y.segment(lo, hi - lo) = blk.colwise().sum().transpose();
          });
        } else {
          omp_split(kRedRows, [&](int64_t lo, int64_t hi) {
            y.segment(lo, hi - lo) = CMapMat(px + lo * kRedCols, hi - lo, kRedCols).rowwise().sum();
          });
        }
        benchmark::DoNotOptimize(y.data());
      });
    });
  }
}

// =====================================================================================
// AdamW step over 1M parameters (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01):
// reads param, grad, m, v and writes param, m, v: 7 x 4 bytes per parameter.
// =====================================================================================
constexpr int64_t kAdamN = int64_t(1) << 20;
constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.999f, kAdamEps = 1e-8f, kWd = 0.01f;

// The reference: PyTorch's AdamW update as one fused loop (built with -fno-math-errno so sqrt
// vectorises, see bench/meson.build).
void adamw_raw(float* p, const float* g, float* m, float* v, int64_t n, int64_t step) {
  const float bc1 = 1.f - std::pow(kBeta1, float(step));
  const float bc2 = 1.f - std::pow(kBeta2, float(step));
  const float step_size = kLr / bc1, inv_sqrt_bc2 = 1.f / std::sqrt(bc2);
  const float decay = 1.f - kLr * kWd;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = kBeta1 * m[i] + (1.f - kBeta1) * gi;
    const float vi = kBeta2 * v[i] + (1.f - kBeta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + kAdamEps);
  }
}

void register_adamw() {
  const std::string sh = "1M";
  const double bytes = 7.0 * double(kAdamN) * 4;
  register_bench("adamw/raw/" + sh, [bytes](State& s) {
    const Tensor p = rand_tensor({kAdamN}), g = rand_tensor({kAdamN});
    std::vector<float> m(static_cast<size_t>(kAdamN), 0.f), v(static_cast<size_t>(kAdamN), 0.f);
    int64_t step = 0;
    timed_loop(s, Unit::kByte, bytes, [&] {
      adamw_raw(p.data<float>(), g.data<float>(), m.data(), v.data(), kAdamN, ++step);
      benchmark::ClobberMemory();
    });
  });
  // accel::optim::AdamW on one 1M-element parameter; `ours_unfused` is the same update written
  // with framework ops (AdamWOptions::fused = false), the path devices without a kernel take.
  for (const bool fused : {true, false}) {
    register_bench(
        std::string(fused ? "adamw/ours/" : "adamw/ours_unfused/") + sh, [fused, bytes](State& s) {
          const Tensor p0 = rand_tensor({kAdamN}), g = rand_tensor({kAdamN});
          Tensor p = p0.clone().requires_grad_(true);
          p.set_grad(g);
          accel::optim::AdamWOptions o;
          o.lr(kLr).betas(std::make_tuple(kBeta1, kBeta2)).eps(kAdamEps).weight_decay(kWd);
          o.fused(fused);
          accel::optim::AdamW opt({p}, o);
          // One step from the same state through the raw loop is the reference.
          std::vector<float> ref(p0.data<float>(), p0.data<float>() + kAdamN);
          std::vector<float> m(static_cast<size_t>(kAdamN), 0.f),
              v(static_cast<size_t>(kAdamN), 0.f);
          adamw_raw(ref.data(), g.data<float>(), m.data(), v.data(), kAdamN, 1);
          auto first = [&] {
            opt.step();
            return p.detach();
          };
          if (!check_close(s, first, ref.data(), kAdamN, 1e-5, 1e-6)) return;
          timed_loop(s, Unit::kByte, bytes, [&] {
            opt.step();
            benchmark::ClobberMemory();
          });
        });
  }
}

}  // namespace

// =====================================================================================
// Advanced indexing, sort and topk (docs/indexing.md): x[idx] and x.index_put_({idx}, v, true)
// for 4096 random rows of a (4096, 1024) matrix, against index_select / index_add, the
// single-dim kernels doing the same work; sort of 512 rows of 4096, topk(2) of 64 rows of 32768.
// =====================================================================================
void register_indexing() {
  for (const char* fam : {"index", "index_put", "sort", "topk"}) register_ours(fam);
  const std::string sh = "4096x1024[4096 rows]";
  auto inputs = [] {
    accel::Generator g(7);
    return std::make_pair(rand_tensor({4096, 1024}),
                          accel::randint(0, 4096, {4096}, accel::TensorOptions(accel::kInt64), &g));
  };
  register_bench("index/index_select/" + sh, [inputs](State& s) {
    auto [x, idx] = inputs();
    timed_loop(s, Unit::kByte, 2.0 * 4096 * 1024 * 4, [&] {
      Tensor y = accel::index_select(x, 0, idx);
      benchmark::DoNotOptimize(y.data_ptr());
    });
  });
  register_bench("index_put/index_add/4096x1024[4096 rows, accumulate]", [inputs](State& s) {
    auto [x, idx] = inputs();
    const Tensor v = rand_tensor({4096, 1024});
    timed_loop(s, Unit::kByte, 5.0 * 4096 * 1024 * 4, [&] {
      Tensor y = accel::index_add(x, 0, idx, v);
      benchmark::DoNotOptimize(y.data_ptr());
    });
  });
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  accel::manual_seed(1234);
  measure_peaks();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", g_peak_gflops);
  benchmark::AddCustomContext("peak_sgemm_gflops", buf);
  std::snprintf(buf, sizeof buf, "%.2f", g_peak_gbs);
  benchmark::AddCustomContext("peak_memcpy_gbs", buf);
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
  // Which kernel `gemm_bf16/ours` and `autocast` run (Note [bf16 GEMM where it does not pay]).
  benchmark::AddCustomContext("bf16_gemm", std::string(accel::cpu::bf16_gemm_name()) + " (" +
                                               accel::cpu::bf16_gemm_reason() + ")");

  register_peaks();
  register_gemm();
  register_gemm_bf16();
  register_conv();
  register_conv_transpose();
  register_group_norm();
  register_elementwise();
  register_norms();
  register_cross_entropy();
  register_reduce();
  register_adamw();
  register_indexing();

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
