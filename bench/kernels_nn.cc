// bench/kernels, the elementwise, normalisation, loss, reduction, optimizer and indexing families
// (Note [peaks] and Note [rates] in kernels.cc).
#include "bench/kernel_bench.h"

namespace kernel_bench {

// Elementwise over 1M f32: add and mul move 3 arrays, gelu (erf form) moves 2.
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

}  // namespace kernel_bench
