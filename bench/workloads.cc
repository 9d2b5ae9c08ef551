// The reference workloads of shared/WORKLOADS.md:  build/bench/workloads NAME
//
// Each workload prints one line per figure as key=value pairs, for example
//   workload=op mode=grad us_per_op=0.21
//   workload=matmul n=1024 accel_gflops=160.2 dnnl_sgemm_gflops=165.0 ratio=0.971
// Where a direct-library peer exists, it is measured in the same run (alternating with the
// framework, medians over rounds), because absolute figures drift on shared machines: the ratio
// is what counts.
//
// Adding a workload: write `void run_<name>()` below and add it to registry(). `all` runs every
// registered workload in registry order.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accel.h"
#include "bench/model_workloads.h"

using namespace accel;

namespace {

// ---------------- measurement helpers ----------------

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds for `reps` calls of f.
template <typename F>
double time_reps(int reps, F&& f) {
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  return seconds_since(t0);
}

// One output line: key=value pairs separated by spaces.
class Line {
 public:
  Line& kv(const char* key, const std::string& v) {
    if (!text_.empty()) text_.push_back(' ');
    text_.append(key).append("=").append(v);
    return *this;
  }
  Line& kv(const char* key, int64_t v) { return kv(key, std::to_string(v)); }
  Line& kv(const char* key, double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return kv(key, std::string(buf));
  }
  ~Line() {
    std::printf("%s\n", text_.c_str());
    std::fflush(stdout);
  }

 private:
  std::string text_;
};

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
void run_matmul() {
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
    // goes through oneDNN's sgemm, see Note [sgemm for plain f32] in kernels/cpu/matmul.cc).
    const Tensor bt = b.t();
    auto framework_nt = [&] {
      Tensor out = matmul(a, bt);
      asm volatile("" : : "r"(out.impl()) : "memory");
    };
    auto direct = [&] {
      const dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
      if (st != dnnl_success) std::abort();
    };
    const std::function<void()> fns[3] = {framework, direct, framework_nt};
    for (int w = 0; w < 3; ++w)  // warm-up: primitive creation, page faults, thread team
      for (const auto& f : fns) time_reps(reps, f);
    std::vector<double> gflops[3];
    for (int r = 0; r < pairs; ++r) {
      // Rotate which goes first so that drift does not favour any.
      for (int k = 0; k < 3; ++k) {
        const int i = (r + k) % 3;
        gflops[i].push_back(flop * reps / time_reps(reps, fns[i]) / 1e9);
      }
    }
    const double f = median(gflops[0]), d = median(gflops[1]), nt = median(gflops[2]);
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

// ---------------- registry ----------------

struct Workload {
  const char* name;
  const char* what;
  std::function<void()> run;
};

const std::vector<Workload>& registry() {
  static const std::vector<Workload> r = {
      {"op", "c = a + b on 16 f32 elements, with grad and no-grad: us per op", run_op},
      {"matmul", "f32 matmul 256^3 and 1024^3 vs direct dnnl_sgemm: GFLOP/s", run_matmul},
      {"mlp", "784-1024-1024-10 on Fashion-MNIST, batch 256, AdamW: ms per step", bench::run_mlp},
      {"cnn", "2-conv CNN on Fashion-MNIST, batch 128, AdamW: ms per step", bench::run_cnn},
      {"gpt", "byte GPT (875,264 params) on fortunes, 32 x 128, AdamW: ms per step",
       bench::run_gpt},
      {"ddp-mlp", "mlp, 2 processes x 1 thread (Gloo), 128 per rank: ms per step",
       bench::run_ddp_mlp},
  };
  return r;
}

void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s NAME\n  all       every workload below, in order\n", argv0);
  for (const Workload& w : registry()) std::fprintf(stderr, "  %-9s %s\n", w.name, w.what);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    usage(argv[0]);
    return 2;
  }
  const std::string name = argv[1];
  try {
    if (name == "all") {
      for (const Workload& w : registry()) w.run();
      return 0;
    }
    for (const Workload& w : registry()) {
      if (name == w.name) {
        w.run();
        return 0;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "workload %s failed: %s\n", name.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown workload '%s'\n", name.c_str());
  usage(argv[0]);
  return 2;
}
