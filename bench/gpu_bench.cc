// GPU figures for bench/gpu_check.sh (built only with the CUDA backend):
//   gpu_bench matmul   bf16 matmul 8192^3 and 1024^3 through accel::mm next to cublasGemmEx
//   gpu_bench copy     device-to-device copy_ next to cudaMemcpyAsync, and a bf16 add: GB/s
//   gpu_bench mlp      the `mlp` workload on the GPU (f32, batch 256, AdamW): ms/step
//   gpu_bench gpt      the reference byte GPT on the GPU (f32, 32 x 128, AdamW): ms/step
//   gpu_bench gpt2     GPT-2 124M shape (12 x 768, 12 heads, context 1024, vocab 50257), bf16
//                      autocast, AdamW: tokens/s and MFU
// Each prints table rows "| name | ours | reference | ratio |". Data is synthetic and already on
// the device: these time the GPU step, not the loader. Times from CUDA events; steps end with
// loss.item(), so each step is synchronised.
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "accel.h"
#include "autograd/autocast.h"
#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "examples/models.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/device.h"

using namespace accel;

namespace {

const Device kGPU = Device::cuda(0);
// H200 (SXM) dense bf16 tensor-core peak from the data sheet; MFU is quoted against it.
constexpr double kPeakBf16Flops = 989.4e12;

double time_ms(const std::function<void()>& f, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) f();
  cuda::Event start(true), stop(true);
  start.record();
  for (int i = 0; i < iters; ++i) f();
  stop.record();
  stop.synchronize();
  return double(start.elapsed_ms(stop)) / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median wall ms of `step` (which synchronises) over `iters` after `warmup`.
double step_ms(const std::function<void()>& step, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

void row(const std::string& name, const std::string& ours, const std::string& ref,
         const std::string& ratio) {
  std::printf("| %-34s | %-18s | %-22s | %-8s |\n", name.c_str(), ours.c_str(), ref.c_str(),
              ratio.c_str());
  std::fflush(stdout);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

void run_matmul() {
  cublasHandle_t h = nullptr;
  ACCEL_CUBLAS_CHECK(cublasCreate(&h));
  ACCEL_CUBLAS_CHECK(cublasSetStream(h, cuda::current_stream().handle()));
  // The same 32 MiB workspace size accel gives cuBLAS, so the comparison is like for like.
  Tensor ws = empty({32 << 20}, TensorOptions(kUInt8, kGPU));
  ACCEL_CUBLAS_CHECK(cublasSetWorkspace(h, ws.data_ptr(), size_t(32) << 20));
  NoGradGuard ng;
  for (int64_t n : {8192, 1024}) {
    const Tensor a = randn({n, n}, TensorOptions(kBFloat16)).to(kGPU),
                 b = randn({n, n}, TensorOptions(kBFloat16)).to(kGPU);
    Tensor c = empty({n, n}, TensorOptions(kBFloat16, kGPU));
    const int iters = n >= 8192 ? 20 : 200;
    const double ours = time_ms([&] { c = mm(a, b); }, 3, iters);
    const float alpha = 1.0f, beta = 0.0f;
    // Row-major c = a b is column-major c^T = b^T a^T.
    const double ref = time_ms(
        [&] {
          ACCEL_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n),
                                          &alpha, b.data_ptr(), CUDA_R_16BF, int(n), a.data_ptr(),
                                          CUDA_R_16BF, int(n), &beta, c.data_ptr(), CUDA_R_16BF,
                                          int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        3, iters);
    const double flop = 2.0 * double(n) * double(n) * double(n);
    row("matmul bf16 " + std::to_string(n) + "^3 (TFLOP/s)", fmt("%.1f", flop / ours / 1e9),
        fmt("%.1f (cublasGemmEx)", flop / ref / 1e9), fmt("%.1f%%", 100.0 * ref / ours));
  }
  cublasDestroy(h);
}

void run_copy() {
  NoGradGuard ng;
  const int64_t bytes = int64_t(1) << 30;
  const Tensor src = zeros({bytes / 2}, TensorOptions(kBFloat16, kGPU));
  Tensor dst = empty({bytes / 2}, TensorOptions(kBFloat16, kGPU));
  const double ours = time_ms([&] { dst.copy_(src); }, 3, 20);
  const double ref = time_ms(
      [&] {
        ACCEL_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), size_t(bytes),
                                         cudaMemcpyDeviceToDevice,
                                         cuda::current_stream().handle()));
      },
      3, 20);
  // Read + write.
  row("device copy 1 GiB (GB/s, r+w)", fmt("%.0f", 2.0 * bytes / ours / 1e6),
      fmt("%.0f (cudaMemcpyAsync)", 2.0 * bytes / ref / 1e6), fmt("%.1f%%", 100.0 * ref / ours));
  Tensor out = empty({bytes / 2}, TensorOptions(kBFloat16, kGPU));
  const double add = time_ms([&] { binary_stub(kGPU, BinaryOp::Add, src, dst, out, 1.0); }, 3, 20);
  row("bf16 add 3 x 1 GiB (GB/s, r+w)", fmt("%.0f", 3.0 * bytes / add / 1e6), "-", "-");
}

void run_mlp() {
  manual_seed(1);
  auto model = std::make_shared<models::Mlp>();
  model->to(kGPU);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{});
  const Tensor x = rand({256, 784}).to(kGPU), y = randint(0, 10, {256}).to(kGPU);
  const double ms = step_ms(
      [&] {
        Tensor loss = cross_entropy(model->forward(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        (void)loss.item();
      },
      5, 50);
  row("mlp f32 batch 256 (ms/step)", fmt("%.3f", ms), "-", "-");
}

void run_gpt() {
  manual_seed(1);
  auto model = std::make_shared<models::Gpt>();
  model->to(kGPU);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{3e-4});
  const Tensor x = randint(0, 256, {32, 128}).to(kGPU), y = randint(0, 256, {32, 128}).to(kGPU);
  const double ms = step_ms(
      [&] {
        Tensor loss = models::lm_loss(model->forward(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        (void)loss.item();
      },
      5, 50);
  row("gpt (byte, 875k) f32 32x128 (ms/step)", fmt("%.3f", ms), "-", "-");
}

void run_gpt2() {
  manual_seed(1);
  models::GptConfig c;
  c.vocab = 50257;
  c.context = 1024;
  c.layers = 12;
  c.heads = 12;
  c.d_model = 768;
  const int64_t batch =
      std::getenv("ACCEL_GPT2_BATCH") ? std::atoll(std::getenv("ACCEL_GPT2_BATCH")) : 8;
  auto model = std::make_shared<models::Gpt>(c);
  model->to(kGPU);
  const double n_params = double(model->num_parameters());
  optim::AdamW opt(model->parameters(),
                   optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1));
  const Tensor x = randint(0, c.vocab, {batch, c.context}).to(kGPU);
  const Tensor y = randint(0, c.vocab, {batch, c.context}).to(kGPU);
  const double ms = step_ms(
      [&] {
        Tensor loss;
        {
          AutocastGuard ac(true, kBFloat16);
          loss = models::lm_loss(autocast_upcast(model->forward(x)), y);
        }
        opt.zero_grad();
        loss.backward();
        opt.step();
        (void)loss.item();
      },
      2, 6);
  const double tokens = double(batch * c.context);
  // Training FLOPs per token: 6 N for the weights plus 12 L T d for attention scores (PaLM).
  const double flops_per_token = 6.0 * n_params + 12.0 * double(c.layers * c.context * c.d_model);
  const double tok_s = tokens / (ms / 1e3);
  const double mfu = tok_s * flops_per_token / kPeakBf16Flops;
  row("gpt2-124M shape bf16 B=" + std::to_string(batch) + " T=1024", fmt("%.0f tok/s", tok_s),
      fmt("%.1f ms/step", ms), fmt("%.1f%% MFU", 100.0 * mfu));
  std::printf(
      "  (%.1fM parameters: untied head as in models::Gpt; MFU against %.0f TFLOP/s bf16 peak)\n",
      n_params / 1e6, kPeakBf16Flops / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "gpu_bench: no CUDA device (%s)\n", cuda::unavailable_reason().c_str());
    return 3;
  }
  const std::string what = argc > 1 ? argv[1] : "all";
  const struct {
    const char* name;
    void (*fn)();
  } sections[] = {{"matmul", run_matmul},
                  {"copy", run_copy},
                  {"mlp", run_mlp},
                  {"gpt", run_gpt},
                  {"gpt2", run_gpt2}};
  int rc = 0;
  bool found = false;
  for (const auto& s : sections) {
    if (what != "all" && what != s.name) continue;
    found = true;
    try {
      s.fn();
    } catch (const std::exception& e) {
      row(s.name, "n/a", e.what(), "-");
      rc = 1;
    }
  }
  if (!found) {
    std::fprintf(stderr, "usage: %s [all|matmul|copy|mlp|gpt|gpt2]\n", argv[0]);
    return 2;
  }
  return rc;
}
