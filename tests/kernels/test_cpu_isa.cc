// Run-time ISA dispatch of the CPU kernels (Note [portable builds and ISA dispatch] in
// kernels/cpu/cpu_isa.h): the level is reported, each lower level can be forced, the variant that
// runs is the one asked for, and every variant computes what the best one does.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accel.h"
#include "autograd/ops.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/stubs/optim.h"
#include "core/generator.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_pool.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::cpu::CpuIsa;
using accel::test::max_abs_diff;

namespace {

// Restores the level a test case found.
struct IsaGuard {
  CpuIsa saved = cpu::cpu_isa();
  ~IsaGuard() { cpu::set_cpu_isa(saved); }
};

std::vector<CpuIsa> runnable_levels() {
  const CpuIsa best = cpu::cpu_isa_best();
  if (best == CpuIsa::Native) return {CpuIsa::Native};
  std::vector<CpuIsa> v;
  for (int i = 0; i <= int(best); ++i) v.push_back(CpuIsa(i));
  return v;
}

struct Inputs {
  Tensor x, row, y, cond, w, bias, logits, target, p, g, m, v, xb, yb;
};

Inputs make_inputs() {
  Generator gen(1234);
  Inputs in;
  // Odd sizes: every vector loop also runs its scalar tail.
  in.x = randn({37, 131}, {}, &gen);
  in.row = randn({131}, {}, &gen);
  in.y = add(rand({37, 131}, {}, &gen), 0.5);
  in.cond = gt(randn({37, 131}, {}, &gen), 0.0);
  in.w = randn({131}, {}, &gen);
  in.bias = randn({131}, {}, &gen);
  in.logits = mul(randn({29, 10}, {}, &gen), 3.0);
  in.target = randint(0, 10, {29}, TensorOptions(kInt64), &gen);
  in.p = randn({1000, 7}, {}, &gen);
  in.g = randn({1000, 7}, {}, &gen);
  in.m = mul(randn({1000, 7}, {}, &gen), 0.1);
  in.v = mul(rand({1000, 7}, {}, &gen), 0.01);
  in.xb = in.x.to(kBFloat16);
  in.yb = in.y.to(kBFloat16);
  return in;
}

struct Outputs {
  std::vector<std::string> names;
  std::vector<Tensor> values;
  void add(const std::string& name, const Tensor& t) {
    names.push_back(name);
    values.push_back(t.detach().contiguous().clone());
  }
};

Outputs run_kernels(const Inputs& in) {
  Outputs o;
  o.add("exp", exp(in.x));
  o.add("gelu_erf", gelu(in.x));
  o.add("gelu_tanh", gelu(in.x, "tanh"));
  o.add("sigmoid", sigmoid(in.x));
  o.add("silu", silu(in.x));
  o.add("tanh", tanh(in.x));
  o.add("erf", erf(in.x));
  o.add("relu", relu(in.x));
  o.add("add_broadcast_row", add(in.x, in.row));
  o.add("mul", mul(in.x, in.y));
  o.add("div", div(in.x, in.y));
  o.add("mul_scalar", mul(in.x, 0.37));
  o.add("where", where(in.cond, in.x, in.y));
  o.add("sum_rows", sum(in.x, {1}));
  o.add("mean_cols", mean(in.x, {0}));
  o.add("amax_rows", amax(in.x, {1}));
  o.add("sum_all", sum(in.x));
  o.add("softmax_rows", softmax(in.x, 1));
  o.add("log_softmax_cols", log_softmax(in.x, 0));
  o.add("layer_norm", layer_norm(in.x, {131}, in.w, in.bias));
  o.add("rms_norm", rms_norm(in.x, {131}, in.w));
  o.add("cross_entropy", cross_entropy(in.logits, in.target));
  o.add("bf16_gelu", gelu(in.xb));
  o.add("bf16_mul", mul(in.xb, in.yb));
  o.add("bf16_softmax", softmax(in.xb, 1));
  // Fused attention (its softmax rows are inlined per pass): (batch 2, heads 3, 37 tokens, 16).
  const Tensor q = in.x.narrow(1, 0, 96).reshape({2, 37, 3, 16}).transpose(1, 2).contiguous();
  o.add("sdpa_causal", scaled_dot_product_attention(q, mul(q, 0.5), add(q, 1.0), true));
  // Backward kernels: softmax, norms, cross-entropy and the elementwise gradients.
  Tensor x = in.x.clone().requires_grad_();
  Tensor logits = in.logits.clone().requires_grad_();
  Tensor h = layer_norm(x, {131}, in.w, in.bias);
  Tensor loss = add(mean(mul(softmax(gelu(h), 1), rms_norm(x, {131}, in.w))),
                    cross_entropy(logits, in.target));
  loss.backward();
  o.add("grad_x", x.grad());
  o.add("grad_logits", logits.grad());
  // The fused AdamW step, three steps.
  Tensor p = in.p.clone(), m = in.m.clone(), v = in.v.clone();
  for (int step = 1; step <= 3; ++step) {
    AdamStepParams hp;
    hp.lr = 1e-2;
    hp.weight_decay = 0.1;
    hp.bias_correction1 = 1 - std::pow(hp.beta1, step);
    hp.bias_correction2 = 1 - std::pow(hp.beta2, step);
    adamw_stub(kCPU, p, in.g, m, v, hp);
  }
  o.add("adamw_param", p);
  o.add("adamw_exp_avg_sq", v);
  return o;
}

}  // namespace

TEST_CASE("cpu_isa reports the best level, or the one ACCEL_CPU_ISA forces") {
  const std::string name = cpu::cpu_isa_name();
  MESSAGE("cpu_isa=", name, " best=", std::string(cpu::cpu_isa_name(cpu::cpu_isa_best())));
  const char* forced = std::getenv("ACCEL_CPU_ISA");
  if (forced != nullptr && *forced != '\0') {
    CHECK(name == forced);
  } else {
    CHECK(cpu::cpu_isa() == cpu::cpu_isa_best());
  }
  // The variant that runs says it was compiled for the level the dispatcher reports.
  CHECK(std::string(cpu::cpu_isa_kernel_probe()) == name);
#if defined(__x86_64__) && !defined(ACCEL_CPU_NATIVE)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    CHECK(cpu::cpu_isa_best() == CpuIsa::Avx512);
  }
#endif
}

TEST_CASE("bf16 GEMM route: probed once, forced by ACCEL_CPU_BF16_GEMM or set_bf16_gemm") {
  // Note [bf16 GEMM where it does not pay] in kernels/cpu/cpu_isa.h.
  const char* forced = std::getenv("ACCEL_CPU_BF16_GEMM");
  const std::string f = forced != nullptr ? forced : "";
  if (f == "bogus") {
    CHECK_THROWS_AS(cpu::bf16_gemm(), ValueError);
    try {
      cpu::bf16_gemm();
    } catch (const ValueError& e) {
      CHECK(std::string(e.what()).find("ACCEL_CPU_BF16_GEMM=bogus") != std::string::npos);
    }
    return;
  }
  const cpu::Bf16Gemm route = cpu::bf16_gemm();
  const std::string reason = cpu::bf16_gemm_reason();
  MESSAGE("bf16_gemm=", std::string(cpu::bf16_gemm_name()), " (", reason, ")");
  CHECK(!reason.empty());
  if (f == "native" || f == "f32") {
    CHECK(std::string(cpu::bf16_gemm_name()) == f);
    CHECK(reason == "ACCEL_CPU_BF16_GEMM");
  } else if (reason.rfind("vdpbf16ps_ns:", 0) == 0) {
    // The probe's rule, from its own figures.
    double dp = 0, fm = 0;
    REQUIRE(std::sscanf(reason.c_str(), "vdpbf16ps_ns:%lf,fma_ns:%lf", &dp, &fm) == 2);
    CHECK(dp > 0);
    CHECK(fm > 0);
    CHECK((route == cpu::Bf16Gemm::Native) == (2.0 * fm / dp >= 1.3));
  } else {
    CHECK((reason == "amx_bf16" || reason == "no_avx512_bf16"));
    CHECK((route == cpu::Bf16Gemm::Native) == (reason == "amx_bf16"));
  }
  cpu::set_bf16_gemm(cpu::Bf16Gemm::Native);
  CHECK(cpu::bf16_gemm() == cpu::Bf16Gemm::Native);
  CHECK(std::string(cpu::bf16_gemm_reason()) == "set_bf16_gemm");
  cpu::set_bf16_gemm(cpu::Bf16Gemm::F32);
  CHECK(std::string(cpu::bf16_gemm_name()) == "f32");
  cpu::set_bf16_gemm(route);
}

TEST_CASE("every runnable ISA variant is selected and computes what the best one does") {
  IsaGuard guard;
  const Inputs in = make_inputs();
  cpu::set_cpu_isa(cpu::cpu_isa_best());
  const Outputs ref = run_kernels(in);
  for (CpuIsa isa : runnable_levels()) {
    const std::string isa_name = cpu::cpu_isa_name(isa);
    CAPTURE(isa_name);
    cpu::set_cpu_isa(isa);
    REQUIRE(cpu::cpu_isa() == isa);
    CHECK(std::string(cpu::cpu_isa_kernel_probe()) == isa_name);
    const Outputs got = run_kernels(in);
    REQUIRE(got.values.size() == ref.values.size());
    for (size_t i = 0; i < ref.values.size(); ++i) {
      const bool half = ref.values[i].dtype() == kBFloat16;
      // Variants differ only in FMA contraction and summation order.
      const double rtol = half ? 1e-2 : 1e-4, atol = half ? 1e-2 : 1e-5;
      CHECK_MESSAGE(allclose(got.values[i].to(kFloat64), ref.values[i].to(kFloat64), rtol, atol),
                    ref.names[i], ": max |diff| = ", max_abs_diff(got.values[i], ref.values[i]));
    }
  }
}

TEST_CASE("float32 <-> bf16 / f16 conversions run at the level accel's kernels run at") {
  // Note [vectorised bf16 casts]: AVX512-BF16's vcvtneps2bf16 flushes a denormal input to zero;
  // the AVX2 and scalar conversions round it like BFloat16::from_float. A forced lower level must
  // not run the AVX-512 one (nor the result depend on it), whatever the CPU has.
  IsaGuard guard;
  __builtin_cpu_init();
  const bool bf16_insn = __builtin_cpu_supports("avx512bf16") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  const float den = 1e-39f;  // a float32 denormal; bf16 0x000b
  const uint16_t kept = BFloat16::from_float(den);
  REQUIRE(kept != 0);
  const Tensor src = full({40}, den);  // contiguous and longer than a vector: the vector kernels
  for (CpuIsa isa : runnable_levels()) {
    const std::string isa_name = cpu::cpu_isa_name(isa);
    CAPTURE(isa_name);
    cpu::set_cpu_isa(isa);
    const Tensor b = src.to(kBFloat16);
    const uint16_t* pb = static_cast<const uint16_t*>(b.data_ptr());
    const bool avx512 = isa == CpuIsa::Avx512 || isa == CpuIsa::Native;
    const uint16_t want = avx512 && bf16_insn ? uint16_t(0) : kept;
    int bad = 0;
    for (int i = 0; i < 40; ++i) bad += pb[i] != want;
    CHECK(bad == 0);
    // Every level gives the same bits away from denormals, both ways and for float16.
    const Tensor v = linspace(-300.0, 300.0, 1001);
    CHECK(equal(v.to(kBFloat16).to(kFloat32), v.to(kFloat64).to(kBFloat16).to(kFloat32)));
    CHECK(equal(v.to(kFloat16).to(kFloat32), v.to(kFloat64).to(kFloat16).to(kFloat32)));
  }
}

TEST_CASE("set_cpu_isa refuses a level the CPU or the build cannot run") {
  IsaGuard guard;
  if (cpu::cpu_isa_best() == CpuIsa::Native) {
    CHECK_THROWS_AS(cpu::set_cpu_isa(CpuIsa::Baseline), ValueError);
  } else {
    CHECK_THROWS_AS(cpu::set_cpu_isa(CpuIsa::Native), ValueError);
    if (cpu::cpu_isa_best() != CpuIsa::Avx512)
      CHECK_THROWS_AS(cpu::set_cpu_isa(CpuIsa::Avx512), ValueError);
  }
  CHECK(cpu::cpu_isa() == guard.saved);
}

// Note [own NCHW pooling] (kernels/cpu/pool.cc): accel's pool2d kernel, which runs where oneDNN
// only has a simple one (NCHW below AVX-512), computes what oneDNN's does and what the float64
// reference does, forward and backward, max (with its int32 argmax workspace) and avg.
TEST_CASE("pool2d: accel's NCHW kernel equals oneDNN's and the float64 reference") {
  struct Restore {
    ~Restore() { cpu::set_cpu_pool(cpu::CpuPool::Auto); }
  } restore;
  Generator gen(11);
  struct Geo {
    Shape in, kernel, stride, padding;
  };
  const std::vector<Geo> geos = {
      {{3, 5, 28, 28}, {2, 2}, {2, 2}, {0, 0}},
      {{2, 3, 13, 11}, {3, 3}, {2, 2}, {1, 1}},
      {{1, 4, 9, 10}, {3, 2}, {1, 2}, {1, 0}},
      {{2, 2, 7, 7}, {7, 7}, {1, 1}, {3, 3}},
      {{2, 3, 9, 11}, {2, 2}, {2, 2}, {1, 0}},
      {{2, 3, 10, 11}, {2, 2}, {2, 2}, {0, 0}},
      // Rows of 515 outputs: the bf16 row loop's chunks of 256 and their tail.
      {{1, 2, 4, 1030}, {2, 2}, {2, 2}, {0, 0}}};
  for (const Geo& geo : geos) {
    // Distinct values (a permutation): no ties in float32.
    const int64_t n = geo.in[0] * geo.in[1] * geo.in[2] * geo.in[3];
    const Tensor base = sub(div(randperm(n, &gen).to(kFloat64), double(n)), 0.5).reshape(geo.in);
    for (int kind = 0; kind < 3; ++kind) {  // max, avg including padding, avg excluding it
      for (DType dt : {kFloat32, kBFloat16}) {
        CAPTURE(geo.in);
        CAPTURE(geo.kernel);
        CAPTURE(kind);
        CAPTURE(dt);
        // The float64 reference runs on the same rounded values (bf16 rounding makes ties, which
        // every kernel breaks towards the first index).
        const Tensor xin = base.to(dt);
        auto run = [&](cpu::CpuPool impl, DType d) {
          cpu::set_cpu_pool(impl);
          Tensor x = xin.to(d).detach().requires_grad_();
          Tensor y = kind == 0 ? max_pool2d(x, geo.kernel, geo.stride, geo.padding)
                               : avg_pool2d(x, geo.kernel, geo.stride, geo.padding, kind == 1);
          // A weighted sum, so every output's gradient differs.
          const Tensor w = linspace(-1.0, 2.0, y.numel(), TensorOptions(d)).reshape(y.sizes());
          sum(mul(y, w)).backward();
          return std::pair<Tensor, Tensor>{y.detach().to(kFloat64), x.grad().to(kFloat64)};
        };
        const auto [y_own, g_own] = run(cpu::CpuPool::Own, dt);
        const auto [y_dnnl, g_dnnl] = run(cpu::CpuPool::OneDnn, dt);
        const auto [y_ref, g_ref] = run(cpu::CpuPool::Auto, kFloat64);
        const double tol = dt == kFloat32 ? 1e-6 : 1e-2;
        CHECK_MESSAGE(allclose(y_own, y_dnnl, tol, tol), "own vs oneDNN forward");
        CHECK_MESSAGE(allclose(g_own, g_dnnl, tol, tol), "own vs oneDNN backward");
        CHECK_MESSAGE(allclose(y_own, y_ref, tol, tol), "own vs float64 forward");
        CHECK_MESSAGE(allclose(g_own, g_ref, tol, tol), "own vs float64 backward");
      }
    }
  }
}

// Note [own 2 x 2 max pool]: the rows run on AVX-512 where the CPU has it; with NaNs and ties in
// every window they give the bits and argmax of the portable loop (ACCEL_CPU_ISA=avx2's route)
// and of the float64 reference: the first maximal element in row-major order, a NaN over any
// number, the first NaN.
TEST_CASE("pool2d: the 2 x 2 rows on AVX-512 equal the portable loop, NaNs and ties included") {
  IsaGuard guard;
  struct Restore {
    ~Restore() { cpu::set_cpu_pool(cpu::CpuPool::Auto); }
  } restore;
  cpu::set_cpu_pool(cpu::CpuPool::Own);
  if (cpu::cpu_isa_best() != CpuIsa::Avx512) {
    MESSAGE("no AVX-512 here: only the portable loop runs");
  }
  Generator gen(23);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Widths of 17 outputs (a vector of 16 and a tail), 7 (the cnn's second pool), an odd width.
  for (const Shape& in : {Shape{2, 3, 6, 34}, Shape{3, 2, 4, 14}, Shape{1, 2, 6, 11}}) {
    const int64_t n = in[0] * in[1] * in[2] * in[3];
    // Values from {-1, 0, 1, NaN}: ties and NaNs in most windows, -0 beside +0 too.
    std::vector<double> v(static_cast<size_t>(n));
    const Tensor pick = randint(0, 5, {n}, TensorOptions(kInt64), &gen);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = pick.data<int64_t>()[i];
      v[size_t(i)] = k == 0 ? -1.0 : k == 1 ? 0.0 : k == 2 ? -0.0 : k == 3 ? 1.0 : nan;
    }
    const Tensor base = tensor(v, in);
    for (DType dt : {kFloat32, kBFloat16}) {
      CAPTURE(in);
      CAPTURE(dt);
      auto run = [&](CpuIsa isa, DType d) {
        cpu::set_cpu_isa(isa);
        Tensor x = base.to(d).detach().requires_grad_();
        Tensor y = max_pool2d(x, {2, 2}, {2, 2}, {0, 0});
        const Tensor w = linspace(1.0, 2.0, y.numel(), TensorOptions(d)).reshape(y.sizes());
        // The loss is NaN; the gradient of each output is still its weight.
        sum(mul(y, w)).backward();
        return std::pair<Tensor, Tensor>{y.detach().to(kFloat64), x.grad().to(kFloat64)};
      };
      const auto [y_best, g_best] = run(cpu::cpu_isa_best(), dt);
      const auto [y_port, g_port] = run(CpuIsa::Avx2, dt);
      const auto [y_ref, g_ref] = run(CpuIsa::Avx2, kFloat64);
      // NaN where the reference has NaN, the same values elsewhere; each output's gradient (its
      // weight, >= 1) goes to the same cell, the same bits as the portable loop.
      const auto is_nan = [](const Tensor& t) { return ne(t, t); };
      const auto zero_nan = [&](const Tensor& t) { return where(is_nan(t), Scalar(0.0), t); };
      CHECK(equal(is_nan(y_best), is_nan(y_ref)));
      CHECK(equal(is_nan(y_port), is_nan(y_ref)));
      CHECK(equal(zero_nan(y_best), zero_nan(y_ref)));
      CHECK(equal(zero_nan(y_port), zero_nan(y_ref)));
      CHECK(equal(g_best, g_port));
      CHECK(equal(ne(g_best, 0.0), ne(g_ref, 0.0)));  // the same argmax cells
    }
  }
}

// Note [16-bit tables for polynomial ops] (kernels/cpu/elementwise.h): from kTableMin (65,536)
// contiguous bf16 / f16 elements the polynomial ops and the gradients g * d(x) read tables built
// by the chunk loop; below it they run that loop. Every 16-bit input, both ways, every level:
// the same bits (NaN stays NaN).
TEST_CASE("16-bit tables of the polynomial ops give the chunk loop's bits at every level") {
  IsaGuard guard;
  constexpr int64_t kAll = 65536, kHalf = kAll / 2;  // kHalf: below the tables' threshold
  const auto bits = [](const Tensor& t) {
    return static_cast<const uint16_t*>(t.contiguous().data_ptr());
  };
  // a and b agree bit for bit, or are both NaN; returns the mismatches.
  const auto mismatches = [&](const Tensor& a, const Tensor& b) {
    REQUIRE(a.numel() == b.numel());
    const Tensor af = a.to(kFloat32).contiguous();
    const float* fa = static_cast<const float*>(af.data_ptr());
    const Tensor bf = b.to(kFloat32).contiguous();
    const float* fb = static_cast<const float*>(bf.data_ptr());
    const uint16_t* pa = bits(a);
    const uint16_t* pb = bits(b);
    int64_t bad = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
      bad += pa[i] != pb[i] && !(std::isnan(fa[i]) && std::isnan(fb[i]));
    return bad;
  };
  // The table path on all of `x` against the chunk loop on its two halves.
  const auto halves = [&](const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
    return cat({f(x.slice(0, 0, kHalf)), f(x.slice(0, kHalf, kAll))}, 0);
  };
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = empty({kAll}, TensorOptions(dt));
    uint16_t* px = static_cast<uint16_t*>(x.data_ptr());
    for (int64_t i = 0; i < kAll; ++i) px[i] = uint16_t(i);
    // Gradients: normal values at three scales, then zeros, infinities, NaN, denormals.
    Generator gen(7);
    Tensor g = mul(randn({kAll}, {}, &gen), 3.0).to(dt);
    uint16_t* pg = static_cast<uint16_t*>(g.data_ptr());
    const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7f80, 0xff80, 0x7fc0, 0x3f80};
    for (int64_t i = 0; i < kAll; i += 97) pg[i] = specials[(i / 97) % 8];
    if (dt == kFloat16) {  // the same specials in float16's layout
      const uint16_t h[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7c00, 0xfc00, 0x7e00, 0x3c00};
      for (int64_t i = 0; i < kAll; i += 97) pg[i] = h[(i / 97) % 8];
    }
    const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> unary = {
        {"exp", [](const Tensor& t) { return exp(t); }},
        {"tanh", [](const Tensor& t) { return tanh(t); }},
        {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
        {"erf", [](const Tensor& t) { return erf(t); }},
        {"gelu", [](const Tensor& t) { return gelu(t); }},
        {"gelu_tanh", [](const Tensor& t) { return gelu(t, "tanh"); }},
        {"silu", [](const Tensor& t) { return silu(t); }}};
    const BinaryOp grads[] = {BinaryOp::GeluErfGrad, BinaryOp::GeluTanhGrad, BinaryOp::SiluGrad};
    for (CpuIsa isa : runnable_levels()) {
      const std::string isa_name = cpu::cpu_isa_name(isa);
      cpu::set_cpu_isa(isa);
      for (const auto& [name, f] : unary) {
        const std::string dtype(dtype_name(dt)), op = name;
        CAPTURE(isa_name);
        CAPTURE(dtype);
        CAPTURE(op);
        const Tensor whole = f(x);
        CHECK(whole.dtype() == dt);
        CHECK(mismatches(whole, halves(f, x)) == 0);
      }
      for (BinaryOp op : grads) {
        const std::string dtype(dtype_name(dt)), name = profile_label(op);
        CAPTURE(isa_name);
        CAPTURE(dtype);
        CAPTURE(name);
        const auto run = [&](const Tensor& gg, const Tensor& xx) {
          Tensor out = empty(xx.sizes(), TensorOptions(xx.dtype()));
          binary_stub(kCPU, op, gg, xx, out, 1.0);
          return out;
        };
        const Tensor whole = run(g, x);
        const Tensor parts = cat({run(g.slice(0, 0, kHalf), x.slice(0, 0, kHalf)),
                                  run(g.slice(0, kHalf, kAll), x.slice(0, kHalf, kAll))},
                                 0);
        CHECK(mismatches(whole, parts) == 0);
        // And against float32 arithmetic rounded once (the table holds d(x) in float32).
        const Tensor ref = run(g.to(kFloat32), x.to(kFloat32)).to(dt);
        CHECK(mismatches(whole, ref) <= kAll / 1000);
      }
    }
  }
}
