// The single-op workloads of build/bench/workloads (the registry and the runner are in
// workloads.cc; the output contract is docs/bench.md): op (per-op overhead), matmul (and matmul
// under autocast with --precision), sdpa and sdpa-gpt (fused attention).
#include "bench/op_workloads.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "accel.h"
#include "bench/line.h"
#include "bench/median.h"
#include "bench/model_workloads.h"
#include "bench/timing.h"
#include "kernels/cpu/cpu_isa.h"

using namespace accel;
using bench::Line;
using bench::median;
using bench::seconds_since;
using bench::time_reps;

namespace {

// Median GFLOP/s of three contenders timed in turns: three warm-up rounds (primitive creation,
// page faults, the thread team), then `rounds` rounds of `reps` calls each, rotating which goes
// first so that drift does not favour any.
std::array<double, 3> interleaved_gflops(const std::array<std::function<void()>, 3>& fns, int reps,
                                         int rounds, double flop) {
  for (int w = 0; w < 3; ++w)
    for (const auto& f : fns) time_reps(reps, f);
  std::vector<double> gflops[3];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 3; ++k) {
      const int i = (r + k) % 3;
      gflops[i].push_back(flop * reps / time_reps(reps, fns[size_t(i)]) / 1e9);
    }
  return {median(gflops[0]), median(gflops[1]), median(gflops[2])};
}

}  // namespace

// ---------------- op: per-op overhead ----------------

// c = a + b on two 16-element f32 tensors; with grad, `a` requires grad so every add records a
// graph node (which is freed with c at the end of the iteration).
void run_op() {
  constexpr int kElems = 16;
  constexpr int kOpsPerBatch = 20000;
  constexpr int kBatches = 41;
  Generator gen(1);
  Tensor a = randn({kElems}, {}, &gen).requires_grad_(true);
  Tensor b = randn({kElems}, {}, &gen);
  auto measure = [&](bool grad) {
    std::vector<double> us;
    auto batch = [&] {
      return time_reps(kOpsPerBatch, [&] {
        Tensor c = a + b;
        asm volatile("" : : "r"(c.impl()) : "memory");  // keep the op
      });
    };
    batch();  // warm-up: allocator caches, first-call paths
    for (int i = 0; i < kBatches; ++i) us.push_back(batch() * 1e6 / kOpsPerBatch);
    return median(us);
  };
  const double with_grad = measure(true);
  double no_grad;
  {
    NoGradGuard ng;
    no_grad = measure(false);
  }
  Line().kv("workload", "op").kv("mode", "grad").kv("us_per_op", with_grad, 3);
  Line().kv("workload", "op").kv("mode", "nograd").kv("us_per_op", no_grad, 3);
}

// ---------------- matmul: framework vs direct dnnl_sgemm ----------------

// Fine-grained alternation (framework block, direct block, ...) with about 2 ms per block, so
// that load from other processes hits every side alike; medians over many rounds.
void run_matmul_autocast(DType low);  // below

void run_matmul() {
  if (const DType low = bench::bench_precision(); low != kFloat32) run_matmul_autocast(low);
  NoGradGuard ng;
  for (int64_t n : {int64_t(256), int64_t(1024)}) {
    Generator gen(2);
    Tensor a = randn({n, n}, {}, &gen), b = randn({n, n}, {}, &gen);
    Tensor c = empty({n, n});
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* pc = c.data<float>();
    const double flop = 2.0 * double(n) * double(n) * double(n);
    const int reps = std::max(1, int(4e8 / flop));  // calls per timed block
    const int pairs = n <= 256 ? 151 : 41;
    auto framework = [&] {
      Tensor out = matmul(a, b);
      asm volatile("" : : "r"(out.impl()) : "memory");
    };
    // a @ b^T with b^T a strided view: the cached oneDNN matmul primitive (the plain case above
    // goes through oneDNN's sgemm, see Note [sgemm for plain f32] in kernels/cpu/linalg.cc).
    const Tensor bt = b.t();
    auto framework_nt = [&] {
      Tensor out = matmul(a, bt);
      asm volatile("" : : "r"(out.impl()) : "memory");
    };
    auto direct = [&] {
      const dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
      if (st != dnnl_success) std::abort();
    };
    const auto g = interleaved_gflops({framework, direct, framework_nt}, reps, pairs, flop);
    const double f = g[0], d = g[1], nt = g[2];
    Line()
        .kv("workload", "matmul")
        .kv("n", n)
        .kv("threads", int64_t(omp_get_max_threads()))
        .kv("accel_gflops", f, 1)
        .kv("dnnl_sgemm_gflops", d, 1)
        .kv("ratio", f / d, 3)
        .kv("accel_nt_gflops", nt, 1)
        .kv("nt_ratio", nt / d, 3);
  }
}

// ---------------- matmul under autocast vs native 16-bit matmul ----------------

// 1024^3 with float32 inputs under AutocastGuard (what a linear layer sees: `a` an activation
// converted on every call, `w` a parameter whose copy the weight cache keeps for the region),
// the same with both inputs converted on every call, and the native 16-bit matmul on 16-bit
// tensors, alternating as run_matmul does.
void run_matmul_autocast(DType low) {
  NoGradGuard ng;
  const int64_t n = 1024;
  Generator gen(3);
  Tensor a = randn({n, n}, {}, &gen), b = randn({n, n}, {}, &gen);
  Tensor w = b.clone().requires_grad_();
  const Tensor a16 = a.to(low), b16 = b.to(low);
  const double flop = 2.0 * double(n) * double(n) * double(n);
  const int reps = std::max(1, int(4e8 / flop));
  const int pairs = 31;
  AutocastGuard region(true, low);  // one region for the whole run: w converts once
  auto keep = [](const Tensor& t) { asm volatile("" : : "r"(t.impl()) : "memory"); };
  auto cached = [&] { keep(matmul(a, w)); };
  auto uncached = [&] { keep(matmul(a, b)); };
  auto native = [&] { keep(matmul(a16, b16)); };
  const auto g = interleaved_gflops({cached, uncached, native}, reps, pairs, flop);
  const double c = g[0], u = g[1], nat = g[2];
  const std::string p = bench::precision_name(low);
  Line()
      .kv("workload", "matmul")
      .kv("precision", p)
      .kv("n", n)
      .kv("threads", int64_t(omp_get_max_threads()))
      .kv("autocast_gflops", c, 1)
      .kv("autocast_uncached_gflops", u, 1)
      .kv(("native_" + p + "_gflops").c_str(), nat, 1)
      .kv("ratio", c / nat, 3)
      .kv("uncached_ratio", u / nat, 3);
}

// ---------------- sdpa: fused attention vs the materialised (T, S) scores ----------------

// scaled_dot_product_attention at B = 1, H = 8, T = S = 2048, D = 64 (f32; not causal, then
// causal): the fused kernel (Note [fused attention] in kernels/cpu/nn_attention.cc) against the
// composed ops that materialise the (B, H, T, S) scores and probabilities (matmul, softmax,
// matmul: what the op itself runs for dropout or a mask that needs a gradient). Per path:
//   fwd_ms / step_ms   forward (no grad) and forward + backward, medians of interleaved rounds
//   fwd_gflops / step_gflops   forward 4 B H T S D FLOPs, forward + backward 12 B H T S D (the
//                      fused backward's recompute of P not counted); causal halves both
//   peak_mb            the CPU allocator's peak bytes in use during one forward + backward,
//                      above what was in use before (inputs and gradient seed excluded)
// and a check line: memory_ratio = fused / materialised peak, step_speedup = materialised /
// fused step time, max_abs_diff between the two outputs.
void run_sdpa() {
  constexpr int64_t B = 1, H = 8, T = 2048, D = 64;
  constexpr int kRounds = 3;
  Generator gen(3);
  const Tensor q = randn({B, H, T, D}, {}, &gen).requires_grad_(true);
  const Tensor k = randn({B, H, T, D}, {}, &gen).requires_grad_(true);
  const Tensor v = randn({B, H, T, D}, {}, &gen).requires_grad_(true);
  const Tensor up = randn({B, H, T, D}, {}, &gen);
  const Tensor future = gt(arange(T).reshape({1, T}), arange(T).reshape({T, 1}));  // j > i
  Allocator* alloc = get_allocator(kCPU);
  for (bool causal : {false, true}) {
    const std::function<Tensor()> paths[2] = {
        [&] { return scaled_dot_product_attention(q, k, v, Tensor(), 0.0, causal); },
        [&] {
          Tensor att = matmul(mul(q, 1.0 / std::sqrt(double(D))), k.transpose(-2, -1));
          if (causal) att = masked_fill(att, future, -INFINITY);
          return matmul(softmax(att, -1), v);
        }};
    const char* names[2] = {"fused", "materialised"};
    auto forward = [&](int i) {
      NoGradGuard ng;
      Tensor y = paths[i]();
      asm volatile("" : : "r"(y.impl()) : "memory");
    };
    auto step = [&](int i) {
      Tensor y = paths[i]();
      std::vector<Tensor> g = autograd::grad({y}, {q, k, v}, {up});
      asm volatile("" : : "r"(g[0].impl()) : "memory");
    };
    double peak_mb[2], fwd_ms[2], step_ms[2];
    for (int i = 0; i < 2; ++i) {
      step(i);  // warm-up (primitives, page faults, caches)
      const size_t base = alloc->stats().bytes_in_use;
      alloc->reset_peak_stats();
      step(i);
      peak_mb[i] = double(alloc->stats().peak_bytes_in_use - base) / (1 << 20);
    }
    std::vector<double> fwd[2], stp[2];
    for (int r = 0; r < kRounds; ++r) {
      for (int j = 0; j < 2; ++j) {
        const int i = (r + j) % 2;
        fwd[i].push_back(time_reps(1, [&] { forward(i); }) * 1e3);
        stp[i].push_back(time_reps(1, [&] { step(i); }) * 1e3);
      }
    }
    const double flop = 4.0 * B * H * T * T * D * (causal ? 0.5 : 1.0);
    for (int i = 0; i < 2; ++i) {
      fwd_ms[i] = median(fwd[i]);
      step_ms[i] = median(stp[i]);
      Line()
          .kv("workload", "sdpa")
          .kv("shape", "B1_H8_T2048_S2048_D64")
          .kv("causal", int64_t(causal))
          .kv("path", names[i])
          .kv("fwd_ms", fwd_ms[i], 1)
          .kv("fwd_gflops", flop / fwd_ms[i] / 1e6, 1)
          .kv("step_ms", step_ms[i], 1)
          .kv("step_gflops", 3 * flop / step_ms[i] / 1e6, 1)
          .kv("peak_mb", peak_mb[i], 1)
          .kv("threads", int64_t(omp_get_max_threads()));
    }
    double diff;
    {
      NoGradGuard ng;
      diff = max(abs(sub(paths[0](), paths[1]()))).item<double>();
    }
    Line()
        .kv("workload", "sdpa")
        .kv("causal", int64_t(causal))
        .kv("check", "fused_vs_materialised")
        .kv("memory_ratio", peak_mb[0] / peak_mb[1], 4)
        .kv("step_speedup", step_ms[1] / step_ms[0], 2)
        .kv("fwd_speedup", fwd_ms[1] / fwd_ms[0], 2)
        .kv("max_abs_diff", diff, 8);
  }
}

// ---------------- sdpa-gpt: the fused kernel at the gpt workload's shape, f32 vs bf16
// ----------------

// scaled_dot_product_attention_packed on the gpt workload's per-layer qkv (B 32, T 128, C 128:
// (32, 128, 384), 4 heads of D 32, causal) in float32 and in bf16 (Note [bf16 fused attention]:
// vdpbf16ps microkernels where the CPU has AVX512-BF16, else blocks widened to float32).
// Per dtype: fwd_ms (no grad) and step_ms (forward + backward), medians of kRounds rounds
// alternating the dtypes; the check line gives bf16 / f32 of each (the issue 25 target: step
// ratio <= 0.55).
void run_sdpa_gpt() {
  constexpr int64_t B = 32, T = 128, C = 128, H = 4;
  constexpr int kRounds = 7, kReps = 5;
  Generator gen(4);
  const Tensor qkv32 = randn({B, T, 3 * C}, {}, &gen);
  const Tensor up32 = randn({B, T, C}, {}, &gen);
  const DType dts[2] = {kFloat32, kBFloat16};
  Tensor qkv[2], up[2];
  for (int i = 0; i < 2; ++i) {
    qkv[i] = qkv32.to(dts[i]).detach().requires_grad_(true);
    up[i] = up32.to(dts[i]);
  }
  auto forward = [&](int i) {
    NoGradGuard ng;
    Tensor y = scaled_dot_product_attention_packed(qkv[i], H, true);
    asm volatile("" : : "r"(y.impl()) : "memory");
  };
  auto step = [&](int i) {
    Tensor y = scaled_dot_product_attention_packed(qkv[i], H, true);
    std::vector<Tensor> g = autograd::grad({y}, {qkv[i]}, {up[i]});
    asm volatile("" : : "r"(g[0].impl()) : "memory");
  };
  std::vector<double> fwd[2], stp[2];
  for (int i = 0; i < 2; ++i) step(i);  // warm-up
  for (int r = 0; r < kRounds; ++r) {
    for (int j = 0; j < 2; ++j) {
      const int i = (r + j) % 2;
      fwd[i].push_back(time_reps(kReps, [&] { forward(i); }) * 1e3 / kReps);
      stp[i].push_back(time_reps(kReps, [&] { step(i); }) * 1e3 / kReps);
    }
  }
  double fwd_ms[2], step_ms[2];
  for (int i = 0; i < 2; ++i) {
    fwd_ms[i] = median(fwd[i]);
    step_ms[i] = median(stp[i]);
    Line()
        .kv("workload", "sdpa-gpt")
        .kv("shape", "B32_H4_T128_D32_causal_packed")
        .kv("dtype", dts[i] == kFloat32 ? "f32" : "bf16")
        .kv("fwd_ms", fwd_ms[i], 3)
        .kv("step_ms", step_ms[i], 3)
        .kv("threads", int64_t(omp_get_max_threads()));
  }
  double diff;
  {
    NoGradGuard ng;
    diff = max(abs(sub(scaled_dot_product_attention_packed(qkv[1], H, true).to(kFloat32),
                       scaled_dot_product_attention_packed(qkv[0], H, true))))
               .item<double>();
  }
  Line()
      .kv("workload", "sdpa-gpt")
      .kv("check", "bf16_over_f32")
      .kv("fwd_ratio", fwd_ms[1] / fwd_ms[0], 3)
      .kv("step_ratio", step_ms[1] / step_ms[0], 3)
      .kv("cpu_isa", cpu::cpu_isa_name())
      .kv("max_abs_diff", diff, 5);
}
