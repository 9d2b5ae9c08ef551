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
#include "bench/kernel_bench.h"

namespace kernel_bench {

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
// bf16 GEMM: ours on bf16 tensors, ours on float32 tensors under autocast (the right
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

}  // namespace kernel_bench

int main(int argc, char** argv) {
  using namespace kernel_bench;
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
  register_maxpool_train();
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
