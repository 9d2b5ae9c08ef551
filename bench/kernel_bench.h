// What the files of bench/kernels share (kernels.cc has the notes: Note [peaks], Note [rates]):
// the machine peaks, the timed loop and its counters, the result check, oneDNN helpers, row
// registration, and the families each file registers.
#pragma once

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
#include "kernels/cpu/cpu_pool.h"
#include "optim/adam.h"
#include "bench/timing.h"
#include "op_table.h"

namespace kernel_bench {

using benchmark::State;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMat = Eigen::Map<RowMat>;
using CMapMat = Eigen::Map<const RowMat>;
using MapArr = Eigen::Map<Eigen::ArrayXf>;
using CMapArr = Eigen::Map<const Eigen::ArrayXf>;
using accel::Tensor;

// ---- machine peaks (Note [peaks]) ----
inline double g_peak_gflops = 0;
inline double g_peak_gbs = 0;

using accel::bench::Clock;
using accel::bench::seconds_since;

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

inline void parallel_memcpy(float* dst, const float* src, int64_t n) {
  omp_split(n, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, size_t(e - b) * sizeof(float));
  });
}

inline constexpr int64_t kPeakGemmN = 1024;
inline constexpr int64_t kPeakCopyFloats = (int64_t(256) << 20) / 4;  // 256 MiB
// Each peak is the best single call seen in this much time (and at least kPeakMinCalls calls),
// so one descheduled call on a busy machine does not lower it.
inline constexpr double kPeakSeconds = 0.3;
inline constexpr int kPeakMinCalls = 10;

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

inline void measure_peaks() {
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

inline Tensor rand_tensor(const accel::Shape& shape, double lo = -1, double hi = 1) {
  return accel::uniform(shape, lo, hi);
}

// ---- oneDNN helpers ----
inline dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}
inline dnnl::stream& dnnl_stream() {
  static dnnl::stream strm(dnnl_engine());
  return strm;
}
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
inline dnnl::memory dnnl_mem(const dnnl::memory::dims& dims, tag t, void* data) {
  return dnnl::memory({dims, dt::f32, t}, dnnl_engine(), data);
}

template <typename F>
void register_bench(const std::string& name, F&& fn) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<F>(fn))->UseRealTime();
}

inline std::string dims_str(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

// The families, one function each (kernels.cc: ours, peaks, gemm, gemm_bf16; kernels_conv.cc:
// conv, conv_transpose; kernels_nn.cc: the elementwise, normalisation, loss, reduction, optimizer
// and indexing families).
void register_ours(const std::string& family);
void register_peaks();
void register_gemm();
void register_gemm_bf16();
void register_conv();
void register_maxpool_train();
void register_conv_transpose();
void register_elementwise();
void register_group_norm();
void register_norms();
void register_cross_entropy();
void register_reduce();
void register_adamw();
void register_indexing();

}  // namespace kernel_bench
