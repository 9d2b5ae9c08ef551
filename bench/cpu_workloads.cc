// CPU-threading workloads of build/bench/workloads (issue 40): time-seq (pytorch/examples'
// time_sequence_prediction, a program of tiny GEMMs) and gemm-grain (1 vs 2 threads by product
// size, the measurement behind Note [GEMM grain] in kernels/cpu/threading.h).
#include "bench/cpu_workloads.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "accel.h"
#include "bench/line.h"
#include "bench/median.h"
#include "bench/timing.h"
#include "kernels/cpu/threading.h"

namespace accel::bench {
namespace {

using indexing::None;
using indexing::Slice;

// omp_set_num_threads for the scope (this thread's team size), restored after.
struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved); }
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  const int n = v == nullptr ? 0 : std::atoi(v);
  return n > 0 ? n : fallback;
}

// pytorch/examples time_sequence_prediction: 100 sine waves of 1000 samples (period 2 pi 20,
// random phase), trained on rows 3.. (97 x 999 inputs, the next sample as target) by
// LSTMCell(1, 51) -> LSTMCell(51, 51) -> Linear(51, 1), unrolled over the 999 steps. One
// evaluation (what LBFGS's closure runs, 20 per optimizer step) = forward, MSE, backward.
struct TimeSeq {
  nn::LSTMCell lstm1, lstm2;
  nn::Linear linear;
  Tensor input, target;  // (97, 999)
  DType dt;

  explicit TimeSeq(DType d) : lstm1(1, 51), lstm2(51, 51), linear(51, 1), dt(d) {
    constexpr int64_t kT = 20, kL = 1000, kN = 100;
    Generator gen(2);
    const Tensor shift = randint(-4 * kT, 4 * kT, {kN, 1}, {}, &gen).to(kFloat64);
    const Tensor x = arange(kL).to(kFloat64).unsqueeze(0) + shift;
    const Tensor data = sin(x / double(kT)).to(dt);
    input = data.index({Slice(3), Slice(None, -1)}).contiguous();
    target = data.index({Slice(3), Slice(1)}).contiguous();
    lstm1.to(dt);
    lstm2.to(dt);
    linear.to(dt);
  }

  double evaluate() {
    // ACCEL_BENCH_TIME_SEQ_LEN shortens the sequence (paired runs of a slow configuration).
    const int64_t n = input.size(0), steps = std::min<int64_t>(
                                         input.size(1), env_int("ACCEL_BENCH_TIME_SEQ_LEN", 999));
    const TensorOptions o(dt);
    Tensor h1 = zeros({n, 51}, o), c1 = zeros({n, 51}, o), h2 = zeros({n, 51}, o),
           c2 = zeros({n, 51}, o);
    std::vector<Tensor> outs;
    outs.reserve(size_t(steps));
    for (int64_t t = 0; t < steps; ++t) {
      const Tensor x = input.index({Slice(), Slice(t, t + 1)});
      std::tie(h1, c1) = lstm1.forward(x, h1, c1);
      std::tie(h2, c2) = lstm2.forward(h1, h2, c2);
      outs.push_back(linear.forward(h2));
    }
    const Tensor loss = mse_loss(cat(outs, 1), target.index({Slice(), Slice(0, steps)}));
    loss.backward();
    for (nn::Module* m : {static_cast<nn::Module*>(&lstm1), static_cast<nn::Module*>(&lstm2),
                          static_cast<nn::Module*>(&linear)})
      m->zero_grad();
    return loss.item();
  }
};

}  // namespace

void run_time_seq() {
  const int threads = omp_get_max_threads();
  const int rounds = env_int("ACCEL_BENCH_STEPS", 5);
  for (const DType dt : {kFloat64, kFloat32}) {
    manual_seed(0);
    TimeSeq model(dt);
    double loss = 0;
    {
      Threads one(1);
      loss = model.evaluate();  // warm-up on both team sizes
    }
    model.evaluate();
    // Alternating 1 thread and `threads`, the order swapped each round.
    std::vector<double> ms[2];
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        const int which = (r + k) % 2;
        Threads t(which == 0 ? 1 : threads);
        const auto t0 = Clock::now();
        loss = model.evaluate();
        ms[which].push_back(seconds_since(t0) * 1e3);
      }
    }
    const double m1 = median(ms[0]), mn = median(ms[1]);
    Line l;
    l.kv("workload", "time-seq")
        .kv("dtype", std::string(dt == kFloat64 ? "f64" : "f32"))
        .kv("threads", int64_t(threads))
        .kv("rounds", int64_t(rounds))
        .kv("seq_len", int64_t(std::min(999, env_int("ACCEL_BENCH_TIME_SEQ_LEN", 999))))
        .kv("ms_per_eval", mn, 3)
        .kv("ms_1_thread", m1, 3)
        .kv("ratio_n_over_1", mn / m1, 3)
        .kv("gemm_grain", cpu::gemm_grain())
        .kv("loss", loss, 5);
  }
}

void run_gemm_grain() {
  const int threads = omp_get_max_threads();
  // Products without the grain (its cap off), 1 thread against the full team, alternating.
  const int64_t saved = cpu::gemm_grain();
  cpu::set_gemm_grain(0);
  struct Shape {
    int64_t m, k, n;
  };
  const std::vector<Shape> shapes = {{97, 1, 204},    {97, 51, 204},   {204, 97, 51},
                                     {32, 32, 32},    {64, 64, 64},    {97, 128, 128},
                                     {96, 96, 96},    {128, 128, 128}, {160, 160, 160},
                                     {192, 192, 192}, {256, 256, 256}, {384, 384, 384}};
  for (const DType dt : {kFloat32, kFloat64}) {
    for (const Shape& s : shapes) {
      Generator gen(3);
      const Tensor a = randn({s.m, s.k}, TensorOptions(dt), &gen);
      const Tensor b = randn({s.k, s.n}, TensorOptions(dt), &gen);
      const int64_t macs = s.m * s.k * s.n;
      const int reps =
          int(std::clamp<int64_t>((int64_t(1) << 25) / std::max<int64_t>(macs, 1), 4, 20000));
      auto run = [&](int nt) {
        Threads t(nt);
        const auto t0 = Clock::now();
        for (int i = 0; i < reps; ++i) (void)matmul(a, b);
        return seconds_since(t0) * 1e6 / reps;
      };
      run(1);
      run(threads);
      std::vector<double> us[2];
      for (int r = 0; r < 7; ++r)
        for (int k = 0; k < 2; ++k) {
          const int which = (r + k) % 2;
          us[which].push_back(run(which == 0 ? 1 : threads));
        }
      const double u1 = median(us[0]), un = median(us[1]);
      Line l;
      l.kv("workload", "gemm-grain")
          .kv("dtype", std::string(dt == kFloat64 ? "f64" : "f32"))
          .kv("m", s.m)
          .kv("k", s.k)
          .kv("n", s.n)
          .kv("macs", macs)
          .kv("us_1_thread", u1, 2)
          .kv("us_n_threads", un, 2)
          .kv("threads", int64_t(threads))
          .kv("speedup_n_over_1", u1 / un, 3);
    }
  }
  cpu::set_gemm_grain(saved);
}

}  // namespace accel::bench
