// matmul / mm / bmm / linear, conv2d, max_pool2d / avg_pool2d: results against independent
// float64 references, lower-precision dtypes against float32, gradients, and every misuse.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "accel.h"
#include "kernels/common/geometry.h"  // MatmulGeometry::kMaxBatch, the batch-rank limit
#include "core/dispatch.h"            // StubCallRecorder
#include "kernels/cpu/cpu_isa.h"      // the bf16 GEMM route
#include "core/profiler.h"            // stub call counts
#include "kernels/stubs/linalg.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::max_abs_diff;
using accel::test::rel_max_diff;

namespace {

Generator& gen() {
  static Generator g(77);
  return g;
}
Tensor rand_t(const Shape& s, DType dt = kFloat32) {
  return uniform(s, -1.0, 1.0, TensorOptions(dt), &gen());
}

// Independent reference: broadcast multiply and sum over K (elementwise + reduce kernels only).
//   a (..., M, K), b (..., K, N) -> (..., M, N), computed in float64.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  NoGradGuard ng;
  Tensor x = a.to(kFloat64), y = b.to(kFloat64);
  return sum(mul(x.unsqueeze(-1), y.unsqueeze(-3)), {-2});
}

// Runs f, expecting an exception of type E whose message names `op` and contains `shape`.
template <typename E, typename F>
void check_error(F&& f, const std::string& op, const std::string& shape) {
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    const std::string msg = e.what();
    INFO("message: ", msg);
    CHECK(msg.rfind("[" + op + "]", 0) == 0);
    CHECK(msg.find(shape) != std::string::npos);
  }
  CHECK_MESSAGE(thrown, "expected an exception for ", op);
}

// A CUDA-tagged tensor over host memory: only its metadata is touched before the device check.
Tensor fake_cuda(const Shape& s, std::vector<float>& buf) {
  buf.assign(size_t(shape_numel(s)), 0.f);
  return from_blob(buf.data(), s, kFloat32, Device::cuda(0));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// matmul

TEST_CASE("matmul: f32 against the f64 reference, all rank combinations") {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{5, 7}, {7, 3}},          {{1, 1}, {1, 1}},
      {{64, 33}, {33, 17}},      {{2, 3, 4}, {2, 4, 5}},
      {{2, 1, 3, 4}, {3, 4, 2}}, {{3, 4}, {2, 4, 6}},
      {{2, 3, 4}, {4, 6}},       {{4, 1, 3, 5}, {1, 2, 5, 2}},
      {{130, 70}, {70, 90}},
  };
  for (const Case& c : cases) {
    INFO("a ", c.a, " b ", c.b);
    Tensor a = rand_t(c.a), b = rand_t(c.b);
    Tensor out = matmul(a, b);
    Tensor ref = ref_matmul(a, b);
    REQUIRE(out.sizes() == ref.sizes());
    CHECK(out.dtype() == kFloat32);
    CHECK(max_abs_diff(out, ref) < 1e-4 * double(c.a.back()));
    // f64 through the Eigen path agrees to rounding.
    Tensor out64 = matmul(a.to(kFloat64), b.to(kFloat64));
    CHECK(max_abs_diff(out64, ref) < 1e-12);
  }
}

TEST_CASE("matmul: 1-D operands follow torch.matmul") {
  Tensor v = rand_t({4}), w = rand_t({4}), m = rand_t({4, 3}), bm = rand_t({2, 4, 3});
  Tensor dot = matmul(v, w);
  CHECK(dot.dim() == 0);
  CHECK(dot.item<double>() ==
        doctest::Approx(sum(mul(v.to(kFloat64), w.to(kFloat64))).item<double>()).epsilon(1e-5));
  Tensor vm = matmul(v, m);
  CHECK(vm.sizes() == Shape{3});
  CHECK(max_abs_diff(vm, ref_matmul(v.unsqueeze(0), m).squeeze(0)) < 1e-5);
  Tensor mv = matmul(m.t(), v);
  CHECK(mv.sizes() == Shape{3});
  CHECK(max_abs_diff(mv, ref_matmul(m.t(), v.unsqueeze(1)).squeeze(1)) < 1e-5);
  Tensor vbm = matmul(v, bm);
  CHECK(vbm.sizes() == Shape{2, 3});
  Tensor bmv = matmul(bm.transpose(1, 2), v);
  CHECK(bmv.sizes() == Shape{2, 3});
  CHECK(max_abs_diff(bmv, ref_matmul(bm.transpose(1, 2), v.unsqueeze(1)).squeeze(-1)) < 1e-5);
}

TEST_CASE("matmul: strided operands (transposed, sliced, expanded) need no caller copy") {
  Tensor a = rand_t({6, 5}), b = rand_t({4, 6});
  // a.t(): (5, 6) column-major; b.t(): (6, 4) column-major.
  CHECK(max_abs_diff(matmul(a.t(), b.t()), ref_matmul(a.t(), b.t())) < 1e-5);
  // A row slice with a leading dimension larger than its width.
  Tensor big = rand_t({8, 10});
  Tensor s = big.narrow(1, 2, 6);  // (8, 6), row stride 10
  CHECK(max_abs_diff(matmul(s, a), ref_matmul(s, a)) < 1e-5);
  // Neither row- nor column-major (step-2 columns): copied inside the kernel.
  Tensor st = big.slice(1, 0, 10, 2);  // (8, 5), col stride 2
  CHECK(max_abs_diff(matmul(st, a.t()), ref_matmul(st, a.t())) < 1e-5);
  // An expanded batch operand (stride 0) is a broadcast, not a copy.
  Tensor e = rand_t({1, 3, 4}).expand({5, 3, 4});
  Tensor r = rand_t({5, 4, 2});
  CHECK(max_abs_diff(matmul(e, r), ref_matmul(e, r)) < 1e-5);
  // Permuted batch layout: (B, T, H, D) viewed as (B, H, T, D), as attention does.
  Tensor q = rand_t({2, 5, 3, 4}).permute({0, 2, 1, 3});
  Tensor k = rand_t({2, 5, 3, 4}).permute({0, 2, 3, 1});
  CHECK(max_abs_diff(matmul(q, k), ref_matmul(q, k)) < 1e-5);
}

TEST_CASE("matmul: repeated calls reuse cached primitives and stay correct") {
  Tensor a = rand_t({16, 8}), b = rand_t({8, 4});
  Tensor first = matmul(a, b);
  for (int i = 0; i < 5; ++i) {
    Tensor a2 = rand_t({16, 8});
    CHECK(max_abs_diff(matmul(a2, b), ref_matmul(a2, b)) < 1e-5);
  }
  CHECK(max_abs_diff(matmul(a, b), first) == 0.0);
}

TEST_CASE("matmul: many batch dims (beyond oneDNN's rank limit) and empty shapes") {
  Shape sa{2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 3, 4};  // 11 batch dims
  Shape sb{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 4, 2};
  Tensor a = rand_t(sa), b = rand_t(sb);
  CHECK(max_abs_diff(matmul(a, b), ref_matmul(a, b)) < 1e-5);
  Tensor z = matmul(rand_t({3, 0}), rand_t({0, 2}));
  CHECK(z.sizes() == Shape{3, 2});
  CHECK(max_abs_diff(z, zeros({3, 2})) == 0.0);
  CHECK(matmul(rand_t({0, 3}), rand_t({3, 2})).sizes() == Shape{0, 2});
  CHECK(linear(rand_t({2, 0}), rand_t({3, 0}), ones({3})).sum().item<double>() == 6.0);
}

TEST_CASE("matmul: bf16 and f16 against f32") {
  Tensor a = rand_t({33, 48}), b = rand_t({48, 20});
  Tensor ref = matmul(a, b);
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO("dtype ", dt);
    Tensor out = matmul(a.to(dt), b.to(dt));
    CHECK(out.dtype() == dt);
    // Inputs rounded to 8 (bf16) / 11 (f16) bits, f32 accumulation.
    CHECK(max_abs_diff(out, ref) < (dt == kBFloat16 ? 0.25 : 0.03));
    Tensor lin = linear(a.to(dt), b.t().to(dt), ones({20}, dt));
    CHECK(max_abs_diff(lin, add(ref, 1.0)) < (dt == kBFloat16 ? 0.25 : 0.03));
  }
}

// Note [bf16 GEMM where it does not pay]: oneDNN's bf16 kernel and the float32 route (blocked
// rows, Note [bf16 through float32, blocked]) both sum exact products in float32 and round once,
// so either is within half a bf16 ulp (2^-8 relative) of the float64 product of the bf16 inputs,
// plus float32 summation error.
// Restores the process's bf16 GEMM route on scope exit.
struct RouteGuard {
  cpu::Bf16Gemm saved = cpu::bf16_gemm();
  ~RouteGuard() { cpu::set_bf16_gemm(saved); }
};

TEST_CASE("matmul, linear and conv2d in bf16 on both GEMM routes, and f16") {
  RouteGuard guard;
  struct Case {
    int64_t m, k, n;
    bool ta, tb, bias;
  };
  const Case cases[] = {{1, 1, 1, false, false, false},
                        {5, 7, 3, true, false, true},
                        {33, 48, 20, false, true, true},
                        {300, 200, 700, false, true, true},
                        {1000, 64, 50, true, false, false},
                        {17, 300, 1, true, true, false},
                        {260, 1030, 70, false, false, true},
                        // a^T with a last block of one row on 2+ threads (sgemm refused lda 1)
                        {33, 1030, 70, true, false, true}};
  // |out - ref| <= half an output ulp (rel: 2^-8 bf16, 2^-11 f16) of |ref|, plus float32
  // summation error.
  auto close = [](const Tensor& out, const Tensor& ref, int64_t k, double rel = 1.0 / 256) {
    NoGradGuard ng;
    const Tensor o = out.to(kFloat64);
    const double excess = amax(sub(abs(sub(o, ref)), mul(abs(ref), rel))).item<double>();
    return excess <= 1e-6 * double(k) + 1e-7;
  };
  // One case in dtype dt: a @ b (or linear with bias) against the float64 product of its inputs.
  auto check_case = [&](const Case& c, DType dt, double rel) {
    INFO("m ", c.m, " k ", c.k, " n ", c.n, " ta ", c.ta, " tb ", c.tb, " bias ", c.bias);
    const Tensor a = c.ta ? rand_t({c.k, c.m}, dt).t() : rand_t({c.m, c.k}, dt);
    const Tensor b = c.tb ? rand_t({c.n, c.k}, dt).t() : rand_t({c.k, c.n}, dt);
    const Tensor bias = rand_t({c.n}, dt);
    Tensor ref = ref_matmul(a, b);
    if (c.bias) ref = add(ref, bias.to(kFloat64));
    const Tensor out = c.bias ? linear(a, b.t(), bias) : matmul(a, b);  // weight (n, k): b^T
    CHECK(out.dtype() == dt);
    CHECK(out.sizes() == Shape{c.m, c.n});
    CHECK(close(out, ref, c.k, rel));
  };
  for (cpu::Bf16Gemm route : {cpu::Bf16Gemm::Native, cpu::Bf16Gemm::F32}) {
    cpu::set_bf16_gemm(route);
    INFO("route ", cpu::bf16_gemm_name());
    for (const Case& c : cases) check_case(c, kBFloat16, 1.0 / 256);
    // Batched products keep their batch geometry.
    const Tensor x = rand_t({3, 40, 24}, kBFloat16), y = rand_t({3, 24, 16}, kBFloat16);
    CHECK(close(bmm(x, y), ref_matmul(x, y), 24));
    const Tensor yb = rand_t({24, 16}, kBFloat16);
    CHECK(close(matmul(x, yb), ref_matmul(x, yb), 24));
  }
  // float16 takes the same blocked float32 route wherever oneDNN has no f16 kernel: within half
  // a float16 ulp (2^-11 relative) of the float64 product of the f16 inputs.
  for (const Case& c : cases) check_case(c, kFloat16, 1.0 / 2048);
  // Convolutions: same forward and gradients on both routes (to bf16 rounding).
  const Tensor x = rand_t({2, 8, 9, 9}), w = rand_t({16, 8, 3, 3}), b = rand_t({16});
  Tensor ys[2], gws[2], gxs[2];
  int i = 0;
  for (cpu::Bf16Gemm route : {cpu::Bf16Gemm::Native, cpu::Bf16Gemm::F32}) {
    cpu::set_bf16_gemm(route);
    Tensor xx = x.to(kBFloat16).detach().requires_grad_();
    Tensor ww = w.to(kBFloat16).detach().requires_grad_();
    ys[i] = conv2d(xx, ww, b.to(kBFloat16), {1, 1}, {1, 1});
    ys[i].sum().backward();
    gws[i] = ww.grad();
    gxs[i] = xx.grad();
    CHECK(gws[i].dtype() == kBFloat16);
    ++i;
  }
  const Tensor ref = conv2d(x.to(kBFloat16).to(kFloat64), w.to(kBFloat16).to(kFloat64),
                            b.to(kBFloat16).to(kFloat64), {1, 1}, {1, 1});
  CHECK(close(ys[0], ref, 72));
  CHECK(close(ys[1], ref, 72));
  CHECK(max_abs_diff(gws[0], gws[1]) < 1.0);  // sums of 162 O(1) products, bf16-rounded
  CHECK(max_abs_diff(gxs[0], gxs[1]) < 0.1);
}

// Note [autocast linear in float32]: under autocast, where the 16-bit GEMM goes through float32,
// linear rounds its float32 operands inside the kernel and gives float32 inputs gradients the
// kernel rounded: the same bits, forward and backward, as casting x, w and b to the 16-bit dtype
// and running linear on the copies (what the other route, and CUDA, do).
TEST_CASE("autocast linear through float32: the bits of casting first, gradients too") {
  RouteGuard guard;
  struct Case {
    Shape x;
    int64_t n;
    bool bias, x_low, w_leaf;
  };
  const Case cases[] = {{{4, 3}, 5, true, false, true},       {{2, 5, 16}, 7, false, false, true},
                        {{16}, 3, true, false, true},         {{300, 200}, 90, true, true, true},
                        {{70, 1030}, 33, true, false, false}, {{1000, 64}, 50, false, false, true},
                        {{0, 8}, 4, true, false, true},       {{6, 0}, 4, true, false, true}};
  for (DType low : {kBFloat16, kFloat16}) {
    for (cpu::Bf16Gemm route : {cpu::Bf16Gemm::Native, cpu::Bf16Gemm::F32}) {
      cpu::set_bf16_gemm(route);
      const bool fused = low == kFloat16 || route == cpu::Bf16Gemm::F32;
      for (const Case& c : cases) {
        INFO(low, " route ", cpu::bf16_gemm_name(), " x ", c.x, " n ", c.n, " bias ", c.bias,
             " x_low ", c.x_low, " w_leaf ", c.w_leaf);
        const int64_t k = c.x.back();
        const Tensor x0 = c.x_low ? rand_t(c.x, low) : rand_t(c.x), w0 = rand_t({c.n, k}),
                     b0 = rand_t({c.n});
        Shape ys = c.x;
        ys.back() = c.n;
        const Tensor gy = rand_t(ys);
        // Under autocast: one linear node (the fused route) or casts + linear.
        Tensor x = x0.clone().requires_grad_(), wl = w0.clone().requires_grad_(),
               bl = b0.clone().requires_grad_();
        Tensor y;
        std::vector<std::pair<std::string, DeviceType>> calls;
        {
          StubCallRecorder rec;
          AutocastGuard ac(true, low);
          const Tensor w = c.w_leaf ? wl : mul(wl, 1.0);  // a non-leaf weight is not cached
          y = linear(x, w, c.bias ? bl : Tensor());
          calls = rec.calls();
        }
        CHECK(y.dtype() == low);
        CHECK(y.sizes() == ys);
        int64_t backward_copies = 0;
        {
          Profiler prof;  // counts calls per stub
          sum(mul(y.to(kFloat32), gy)).backward();
          for (const ProfileRow& r : prof.rows())
            if (r.op == "copy_stub") backward_copies += r.calls;
        }
        const bool lowp = std::find(calls.begin(), calls.end(),
                                    std::pair<std::string, DeviceType>{
                                        "matmul_lowp_stub", DeviceType::CPU}) != calls.end();
        CHECK(lowp == fused);
        // Reference: cast, then linear on the 16-bit copies, outside autocast.
        Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_(),
               br = b0.clone().requires_grad_();
        const Tensor yr = linear(xr.to(low), (c.w_leaf ? wr : mul(wr, 1.0)).to(low),
                                 c.bias ? br.to(low) : Tensor());
        int64_t ref_copies = 0;
        {
          Profiler prof;
          sum(mul(yr.to(kFloat32), gy)).backward();
          for (const ProfileRow& r : prof.rows())
            if (r.op == "copy_stub") ref_copies += r.calls;
        }
        if (!fused && shape_numel(c.x) > 0) {
          // One node, no cast nodes: no conversion pass for the gradient of the float32 weight
          // or of a float32 x (the bias gradient is still converted).
          CHECK(backward_copies <= ref_copies - 1 - int64_t(!c.x_low));
        }
        CHECK(equal(y, yr));
        CHECK(x.grad().dtype() == x0.dtype());
        CHECK(wl.grad().dtype() == kFloat32);
        if (c.bias) CHECK(equal(bl.grad(), br.grad()));
        const int64_t rows = shape_numel(c.x) / std::max<int64_t>(k, 1);
        if (fused || rows == 0 || k == 0) {  // (empty products: zeros either way)
          CHECK(equal(x.grad(), xr.grad()));
          CHECK(equal(wl.grad(), wr.grad()));
          continue;
        }
        // Note [autocast linear, native 16-bit]: the gradients of float32 inputs are the GEMM's
        // float32 sums of the 16-bit products, not rounded to 16 bits by a cast's backward:
        // within one rounding of the casts' values, and close to a float32 GEMM of the same
        // 16-bit operands (another summation order).
        const Tensor g2 = gy.to(low).to(kFloat32).reshape({-1, c.n});
        const Tensor x2 = x0.to(low).to(kFloat32).reshape({-1, k});
        const Tensor w2 = w0.to(low).to(kFloat32);
        const Tensor dw_f32 = mm(g2.t(), x2), dx_f32 = mm(g2, w2).reshape(c.x);
        const double tol = 1e-5 * std::sqrt(double(std::max<int64_t>(1, g2.size(0))));
        CHECK(rel_max_diff(wl.grad(), dw_f32) < tol);
        CHECK(rel_max_diff(wl.grad(), wr.grad()) < 1e-2);
        if (c.x_low) {
          CHECK(equal(x.grad(), xr.grad()));  // a 16-bit input keeps its 16-bit gradient
        } else {
          CHECK(rel_max_diff(x.grad(), dx_f32) < 1e-5 * std::sqrt(double(c.n)));
          CHECK(rel_max_diff(x.grad(), xr.grad()) < 1e-2);
        }
        // Not rounded to 16 bits (as the casts' gradients were).
        CHECK_FALSE(equal(wl.grad(), wl.grad().to(low).to(kFloat32)));
        if (!c.x_low) CHECK_FALSE(equal(x.grad(), x.grad().to(low).to(kFloat32)));
      }
      if (low == kFloat16) break;  // no bf16 route for float16
    }
  }
  // Misuse on the fused route is named like plain linear's.
  AutocastGuard ac(true, kFloat16);
  check_error<ShapeError>(
      [&] {
        linear(rand_t({4, 3}), rand_t({5, 4}));
      },
      "linear", "input (4, 3), weight (5, 4)");
  check_error<ShapeError>(
      [&] {
        linear(rand_t({4, 3}), rand_t({5, 3}), rand_t({4}));
      },
      "linear", "got (4,)");
  check_error<ShapeError>(
      [&] {
        linear(rand_t({4, 3}), rand_t({5, 3, 1}));
      },
      "linear", "(5, 3, 1)");
  check_error<DTypeError>(
      [&] {
        linear(rand_t({4, 3}), rand_t({5, 3}).to(kInt64));
      },
      "linear", "int64");
}

// The same route for matmul / mm by a 2-D weight (x @ W, W (K, N)): the bits of casting first.
TEST_CASE("autocast matmul and mm by a 2-D weight through float32: the bits of casting first") {
  RouteGuard guard;
  cpu::set_bf16_gemm(cpu::Bf16Gemm::F32);
  struct Case {
    Shape x;
    int64_t n;
    bool x_low, use_mm;
  };
  const Case cases[] = {{{4, 3}, 5, false, false},     {{2, 5, 16}, 7, false, false},
                        {{16}, 3, false, false},       {{300, 200}, 90, true, false},
                        {{70, 1030}, 33, false, true}, {{0, 8}, 4, false, true}};
  for (DType low : {kBFloat16, kFloat16}) {
    for (const Case& c : cases) {
      INFO(low, " x ", c.x, " n ", c.n, " x_low ", c.x_low, " mm ", c.use_mm);
      const int64_t k = c.x.back();
      const Tensor x0 = c.x_low ? rand_t(c.x, low) : rand_t(c.x), w0 = rand_t({k, c.n});
      Shape ys = c.x;
      ys.back() = c.n;
      const Tensor gy = rand_t(ys);
      auto run = [&](const Tensor& x, const Tensor& w) {
        return c.use_mm ? mm(x, w) : matmul(x, w);
      };
      Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      Tensor y;
      std::vector<std::pair<std::string, DeviceType>> calls;
      {
        StubCallRecorder rec;
        AutocastGuard ac(true, low);
        y = run(x, w);
        calls = rec.calls();
      }
      CHECK(std::find(calls.begin(), calls.end(),
                      std::pair<std::string, DeviceType>{"matmul_lowp_stub", DeviceType::CPU}) !=
            calls.end());
      CHECK(y.dtype() == low);
      CHECK(y.sizes() == ys);
      sum(mul(y.to(kFloat32), gy)).backward();
      Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
      const Tensor yr = run(xr.to(low), wr.to(low));
      sum(mul(yr.to(kFloat32), gy)).backward();
      CHECK(equal(y, yr));
      CHECK(equal(x.grad(), xr.grad()));
      CHECK(w.grad().dtype() == kFloat32);
      CHECK(equal(w.grad(), wr.grad()));
    }
  }
  // Misuse still names the op.
  AutocastGuard ac(true, kFloat16);
  check_error<ShapeError>(
      [&] {
        matmul(rand_t({4, 3}), rand_t({5, 2}));
      },
      "matmul", "(4, 3) @ (5, 2)");
  check_error<ShapeError>([&] { mm(rand_t({4, 3}), rand_t({5, 2})); }, "mm", "(4, 3) @ (5, 2)");
}

TEST_CASE("mm and bmm") {
  Tensor a = rand_t({3, 4}), b = rand_t({4, 2});
  CHECK(max_abs_diff(mm(a, b), ref_matmul(a, b)) < 1e-5);
  Tensor x = rand_t({5, 3, 4}), y = rand_t({5, 4, 6});
  CHECK(max_abs_diff(bmm(x, y), ref_matmul(x, y)) < 1e-5);
}

TEST_CASE("linear: fused bias, any leading dims, matches x @ w^T + b") {
  Tensor w = rand_t({6, 4}), bias = rand_t({6});
  for (Shape s : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}}) {
    INFO("x ", s);
    Tensor x = rand_t(s);
    Tensor ref = add(ref_matmul(x.dim() == 1 ? x.unsqueeze(0) : x, w.t()), bias.to(kFloat64));
    if (x.dim() == 1) ref = ref.squeeze(0);
    Tensor out = linear(x, w, bias);
    REQUIRE(out.sizes() == ref.sizes());
    CHECK(max_abs_diff(out, ref) < 1e-5);
    CHECK(max_abs_diff(linear(x, w), sub(ref, bias.to(kFloat64))) < 1e-5);
  }
  // Non-contiguous input (transposed): folded through a copy.
  Tensor xt = rand_t({4, 3, 2}).transpose(0, 2);  // (2, 3, 4)
  CHECK(max_abs_diff(linear(xt, w, bias), add(ref_matmul(xt, w.t()), bias.to(kFloat64))) < 1e-5);
}

TEST_CASE("linear and matmul backward: f32 gradients match f64") {
  Tensor x = rand_t({8, 5}), w = rand_t({3, 5}), b = rand_t({3}), g = rand_t({8, 3});
  std::vector<Tensor> grads32, grads64;
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor xx = x.to(dt).detach().requires_grad_(), ww = w.to(dt).detach().requires_grad_(),
           bb = b.to(dt).detach().requires_grad_();
    Tensor out = linear(xx, ww, bb);
    out.backward(g.to(dt));
    auto& dst = dt == kFloat32 ? grads32 : grads64;
    dst = {xx.grad(), ww.grad(), bb.grad()};
  }
  for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(grads32[i], grads64[i]) < 1e-5);
  // Explicit formulas: dx = g w, dw = g^T x, db = sum(g).
  CHECK(max_abs_diff(grads64[0], ref_matmul(g, w)) < 1e-12);
  CHECK(max_abs_diff(grads64[1], ref_matmul(g.t(), x)) < 1e-12);
  CHECK(max_abs_diff(grads64[2], sum(g.to(kFloat64), {0})) < 1e-12);

  // Batched broadcast: the rhs gradient is summed over the broadcast batch dim.
  Tensor a = rand_t({4, 2, 3}).requires_grad_(), m = rand_t({1, 3, 2}).requires_grad_();
  matmul(a, m).sum().backward();
  CHECK(m.grad().sizes() == Shape{1, 3, 2});
  Tensor expect = ref_matmul(a.detach().transpose(1, 2), ones({4, 2, 2})).sum({0}, true);
  CHECK(max_abs_diff(m.grad(), expect) < 1e-5);
}

TEST_CASE("matmul family: errors name the op and the shapes") {
  Tensor a = rand_t({4, 3}), b = rand_t({5, 2});
  check_error<ShapeError>([&] { matmul(a, b); }, "matmul", "(4, 3) @ (5, 2)");
  check_error<ShapeError>([&] { matmul(rand_t({3}), rand_t({4})); }, "matmul", "(3,) @ (4,)");
  check_error<ShapeError>([&] { matmul(scalar_tensor(1.0), a); }, "matmul", "(4, 3)");
  check_error<ShapeError>(
      [&] {
        matmul(rand_t({2, 4, 3}), rand_t({3, 3, 2}));
      },
      "matmul", "(2, 4, 3) @ (3, 3, 2)");
  check_error<ShapeError>(
      [&] {
        mm(rand_t({2, 3, 4}), rand_t({4, 2}));
      },
      "mm", "(2, 3, 4) @ (4, 2)");
  check_error<ShapeError>([&] { mm(a, b); }, "mm", "(4, 3) @ (5, 2)");
  check_error<ShapeError>([&] { bmm(a, rand_t({3, 2})); }, "bmm", "(4, 3) @ (3, 2)");
  {  // the batch-rank limit of the kernels' geometry is checked by the op, not the kernel
    auto operands = [](int64_t batch_dims) {
      Shape sa(size_t(batch_dims), 1), sb(size_t(batch_dims), 1);
      sa.push_back(2), sa.push_back(3), sb.push_back(3), sb.push_back(2);
      return std::pair{rand_t(sa), rand_t(sb)};
    };
    const int64_t limit = common::MatmulGeometry::kMaxBatch;
    auto [a1, b1] = operands(limit + 1);
    check_error<ShapeError>([&] { matmul(a1, b1); }, "matmul", "batch dimensions are supported");
    auto [a2, b2] = operands(limit);  // exactly at the limit: runs
    const Tensor want = matmul(a2.reshape({2, 3}), b2.reshape({3, 2}));
    CHECK(max_abs_diff(matmul(a2, b2).reshape({2, 2}), want) == 0.0);
  }
  check_error<ShapeError>(
      [&] {
        bmm(rand_t({2, 3, 4}), rand_t({3, 4, 2}));
      },
      "bmm", "(2, 3, 4) @ (3, 4, 2)");
  check_error<ShapeError>(
      [&] {
        bmm(rand_t({2, 3, 4}), rand_t({2, 3, 2}));
      },
      "bmm", "(2, 3, 4) @ (2, 3, 2)");
  check_error<DTypeError>([&] { matmul(a, rand_t({3, 2}, kFloat64)); }, "matmul", "(4, 3)");
  check_error<DTypeError>(
      [&] {
        matmul(ones({2, 2}, kInt64), ones({2, 2}, kInt64));
      },
      "matmul", "(2, 2)");
  std::vector<float> buf;
  Tensor c = fake_cuda({3, 2}, buf);
  check_error<DeviceError>([&] { matmul(a, c); }, "matmul", "(3, 2)");
  check_error<DeviceError>(
      [&] {
        linear(rand_t({2, 2}), fake_cuda({3, 2}, buf));
      },
      "linear", "(3, 2)");
  // linear
  check_error<ShapeError>([&] { linear(rand_t({2, 4}), rand_t({3, 5})); }, "linear", "(3, 5)");
  check_error<ShapeError>(
      [&] {
        linear(rand_t({2, 4}), rand_t({3, 4, 1}));
      },
      "linear", "(3, 4, 1)");
  check_error<ShapeError>(
      [&] {
        linear(rand_t({2, 4}), rand_t({3, 4}), rand_t({4}));
      },
      "linear", "(4,)");
  check_error<DTypeError>(
      [&] {
        linear(rand_t({2, 4}), rand_t({3, 4}), rand_t({3}, kFloat64));
      },
      "linear", "(3,)");
}

// ---------------------------------------------------------------------------------------------
// conv2d and pooling

namespace {

struct ConvCfg {
  Shape x, w;
  bool bias;
  Shape stride, padding, dilation;
  int64_t groups;
};

// x zero-padded by (ph, pw) with `fill` around it (float64, no autograd).
Tensor pad_hw(const Tensor& x, int64_t ph, int64_t pw, double fill) {
  Tensor out = full({x.size(0), x.size(1), x.size(2) + 2 * ph, x.size(3) + 2 * pw}, fill,
                    TensorOptions(kFloat64));
  out.narrow(2, ph, x.size(2)).narrow(3, pw, x.size(3)).copy_(x);
  return out;
}

// The input window of kernel tap (p, q) for every output cell: (N, C, Ho, Wo), a strided view.
Tensor tap(const Tensor& xp, int64_t p, int64_t q, int64_t ho, int64_t wo, const Shape& s,
           const Shape& d) {
  return xp.slice(2, p * d[0], p * d[0] + (ho - 1) * s[0] + 1, s[0])
      .slice(3, q * d[1], q * d[1] + (wo - 1) * s[1] + 1, s[1]);
}

// Independent conv2d reference: a sum over kernel taps of (O_g, C_g) @ (N, C_g, Ho*Wo) matmuls
// on padded, strided slices, in float64.
Tensor ref_conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const ConvCfg& c) {
  NoGradGuard ng;
  Tensor x = x_in.to(kFloat64), w = w_in.to(kFloat64);
  const int64_t n = x.size(0), o = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t cg = w.size(1), og = o / c.groups;
  const int64_t ho =
      (x.size(2) + 2 * c.padding[0] - c.dilation[0] * (kh - 1) - 1) / c.stride[0] + 1;
  const int64_t wo =
      (x.size(3) + 2 * c.padding[1] - c.dilation[1] * (kw - 1) - 1) / c.stride[1] + 1;
  Tensor xp = pad_hw(x, c.padding[0], c.padding[1], 0.0);
  Tensor out = zeros({n, o, ho * wo}, TensorOptions(kFloat64));
  for (int64_t g = 0; g < c.groups; ++g) {
    Tensor og_out = out.narrow(1, g * og, og);
    for (int64_t p = 0; p < kh; ++p) {
      for (int64_t q = 0; q < kw; ++q) {
        Tensor xs = tap(xp.narrow(1, g * cg, cg), p, q, ho, wo, c.stride, c.dilation)
                        .reshape({n, cg, ho * wo});
        Tensor wpq = w.narrow(0, g * og, og).select(3, q).select(2, p);  // (og, cg)
        og_out.add_(matmul(wpq, xs));
      }
    }
  }
  if (b_in.defined()) out.add_(b_in.to(kFloat64).reshape({1, o, 1}));
  return out.reshape({n, o, ho, wo});
}

// Independent pooling reference from strided slices of the padded input.
Tensor ref_pool(bool is_max, const Tensor& x_in, const Shape& k, const Shape& s, const Shape& pad,
                bool include_pad) {
  NoGradGuard ng;
  Tensor x = x_in.to(kFloat64);
  const int64_t ho = (x.size(2) + 2 * pad[0] - k[0]) / s[0] + 1;
  const int64_t wo = (x.size(3) + 2 * pad[1] - k[1]) / s[1] + 1;
  const double inf = std::numeric_limits<double>::infinity();
  Tensor xp = pad_hw(x, pad[0], pad[1], is_max ? -inf : 0.0);
  Tensor valid = pad_hw(ones_like(x), pad[0], pad[1], 0.0);
  Tensor acc, cnt;
  for (int64_t p = 0; p < k[0]; ++p) {
    for (int64_t q = 0; q < k[1]; ++q) {
      Tensor v = tap(xp, p, q, ho, wo, s, {1, 1});
      Tensor m = tap(valid, p, q, ho, wo, s, {1, 1});
      acc = !acc.defined() ? v.contiguous() : (is_max ? maximum(acc, v) : add(acc, v));
      cnt = !cnt.defined() ? m.contiguous() : add(cnt, m);
    }
  }
  if (is_max) return acc;
  return include_pad ? div(acc, double(k[0] * k[1])) : div(acc, cnt);
}

}  // namespace

TEST_CASE("conv2d: f32 (oneDNN) and f64 (reference) against an independent reference") {
  const ConvCfg cfgs[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{1, 2, 9, 8}, {3, 2, 3, 2}, false, {2, 3}, {1, 0}, {1, 1}, 1},
      {{2, 4, 9, 9}, {6, 2, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 2},
      {{1, 6, 5, 5}, {6, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 6},       // depthwise
      {{2, 3, 4, 4}, {5, 3, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1},       // 1x1
      {{4, 32, 14, 14}, {64, 32, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},  // the cnn's conv 2
      {{3, 1, 28, 28}, {32, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},    // the cnn's conv 1
  };
  for (const ConvCfg& c : cfgs) {
    INFO("x ", c.x, " w ", c.w, " stride ", c.stride, " pad ", c.padding, " dil ", c.dilation,
         " groups ", c.groups);
    Tensor x = rand_t(c.x), w = rand_t(c.w), b = c.bias ? rand_t({c.w[0]}) : Tensor();
    Tensor ref = ref_conv2d(x, w, b, c);
    Tensor y32 = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    REQUIRE(y32.sizes() == ref.sizes());
    const double fan_in = double(c.w[1] * c.w[2] * c.w[3]);
    CHECK(max_abs_diff(y32, ref) < 2e-6 * fan_in);
    Tensor y64 = conv2d(x.to(kFloat64), w.to(kFloat64), b.defined() ? b.to(kFloat64) : Tensor(),
                        c.stride, c.padding, c.dilation, c.groups);
    CHECK(max_abs_diff(y64, ref) < 1e-12);
  }
}

TEST_CASE("conv2d backward: f32 (oneDNN) gradients match f64 (gradchecked reference)") {
  const ConvCfg cfgs[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{1, 4, 9, 9}, {6, 2, 3, 3}, true, {2, 1}, {2, 1}, {2, 1}, 2},
      {{4, 32, 14, 14}, {64, 32, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{3, 1, 28, 28}, {32, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
  };
  for (const ConvCfg& c : cfgs) {
    INFO("x ", c.x, " w ", c.w);
    Tensor x = rand_t(c.x), w = rand_t(c.w), b = rand_t({c.w[0]});
    Tensor gy;
    std::vector<Tensor> res[2];
    for (int k = 0; k < 2; ++k) {
      const DType dt = k == 0 ? kFloat32 : kFloat64;
      Tensor xx = x.to(dt).detach().requires_grad_(), ww = w.to(dt).detach().requires_grad_(),
             bb = b.to(dt).detach().requires_grad_();
      Tensor y = conv2d(xx, ww, bb, c.stride, c.padding, c.dilation, c.groups);
      if (!gy.defined()) gy = rand_t(y.sizes());
      y.backward(gy.to(dt));
      res[k] = {xx.grad(), ww.grad(), bb.grad()};
    }
    const double n_out = double(shape_numel(gy.sizes()));
    CHECK(max_abs_diff(res[0][0], res[1][0]) < 1e-5 * double(c.w[0] * c.w[2] * c.w[3]));
    CHECK(max_abs_diff(res[0][1], res[1][1]) < 1e-6 * n_out);
    CHECK(max_abs_diff(res[0][2], res[1][2]) < 1e-6 * n_out);
  }
  // Only the weight gradient wanted (the first layer of a network: data needs no gradient).
  Tensor x = rand_t({2, 1, 8, 8}), w = rand_t({4, 1, 3, 3}).requires_grad_();
  conv2d(x, w, Tensor(), {1, 1}, {1, 1}).sum().backward();
  Tensor w64 = w.detach().to(kFloat64).requires_grad_();
  conv2d(x.to(kFloat64), w64, Tensor(), {1, 1}, {1, 1}).sum().backward();
  CHECK(max_abs_diff(w.grad(), w64.grad()) < 1e-4);
}

TEST_CASE("conv2d: bf16 and f16 against f32") {
  Tensor x = rand_t({2, 8, 10, 10}), w = rand_t({16, 8, 3, 3}), b = rand_t({16});
  Tensor ref = conv2d(x, w, b, {1, 1}, {1, 1});
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO("dtype ", dt);
    Tensor y = conv2d(x.to(dt), w.to(dt), b.to(dt), {1, 1}, {1, 1});
    CHECK(y.dtype() == dt);
    CHECK(max_abs_diff(y, ref) < (dt == kBFloat16 ? 0.3 : 0.05));
    Tensor xx = x.to(dt).detach().requires_grad_(), ww = w.to(dt).detach().requires_grad_(),
           bb = b.to(dt).detach().requires_grad_();
    conv2d(xx, ww, bb, {1, 1}, {1, 1}).sum().backward();
    for (const Tensor& t : {xx, ww, bb}) CHECK(t.grad().dtype() == dt);
    // d sum / d b = N * Ho * Wo = 200 per channel; dw sums 200 products of O(1) values.
    CHECK(max_abs_diff(bb.grad(), full({16}, 200.0)) < (dt == kBFloat16 ? 1.0 : 0.2));
    Tensor w32 = w.detach().requires_grad_();
    conv2d(x, w32, b, {1, 1}, {1, 1}).sum().backward();
    CHECK(max_abs_diff(ww.grad(), w32.grad()) < (dt == kBFloat16 ? 2.0 : 0.3));
  }
}

TEST_CASE("pooling: f32 (oneDNN) and f64 (reference) against an independent reference") {
  struct PoolCfg {
    Shape x, k, s, pad;
  };
  const PoolCfg cfgs[] = {
      {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}},
      {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}},
      {{2, 2, 6, 5}, {3, 2}, {1, 2}, {1, 1}},
      {{8, 32, 28, 28}, {2, 2}, {2, 2}, {0, 0}},  // the cnn's first pool
  };
  for (const PoolCfg& c : cfgs) {
    INFO("x ", c.x, " k ", c.k, " s ", c.s, " pad ", c.pad);
    Tensor x = rand_t(c.x);
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor xd = x.to(dt);
      CHECK(max_abs_diff(max_pool2d(xd, c.k, c.s, c.pad),
                         ref_pool(true, x, c.k, c.s, c.pad, true)) < 1e-6);
      for (bool inc : {true, false}) {
        CHECK(max_abs_diff(avg_pool2d(xd, c.k, c.s, c.pad, inc),
                           ref_pool(false, x, c.k, c.s, c.pad, inc)) < 1e-6);
      }
    }
  }
  // Stride defaults to the kernel; a 3-D input is one image.
  Tensor x = rand_t({3, 6, 6});
  CHECK(max_pool2d(x, {3, 3}).sizes() == Shape{3, 2, 2});
  CHECK(max_abs_diff(max_pool2d(x, {3}), max_pool2d(x.unsqueeze(0), {3, 3}, {3, 3}).squeeze(0)) ==
        0.0);
}

TEST_CASE("pooling backward: f32 (oneDNN, workspace) matches f64 (gradchecked reference)") {
  Tensor x = rand_t({4, 16, 12, 12});
  for (int kind = 0; kind < 3; ++kind) {
    INFO("kind ", kind);
    std::vector<Tensor> gx;
    Tensor gy;
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor xx = x.to(dt).detach().requires_grad_();
      Tensor y = kind == 0   ? max_pool2d(xx, {3, 3}, {2, 2}, {1, 1})
                 : kind == 1 ? avg_pool2d(xx, {3, 3}, {2, 2}, {1, 1}, true)
                             : avg_pool2d(xx, {2, 2});
      if (!gy.defined()) gy = rand_t(y.sizes());
      y.backward(gy.to(dt));
      gx.push_back(xx.grad());
    }
    CHECK(max_abs_diff(gx[0], gx[1]) < 1e-5);
  }
  // bf16 / f16 pooling with a gradient.
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor xx = x.to(dt).detach().requires_grad_();
    Tensor y = max_pool2d(xx, {2, 2});
    CHECK(max_abs_diff(y, max_pool2d(x.to(dt).to(kFloat32), {2, 2})) == 0.0);
    y.sum().backward();
    CHECK(xx.grad().to(kFloat32).sum().item<double>() == doctest::Approx(double(y.numel())));
  }
}

TEST_CASE("conv2d and pooling: errors name the op and the shapes") {
  Tensor x = rand_t({2, 4, 8, 8}), w = rand_t({6, 4, 3, 3});
  check_error<ShapeError>([&] { conv2d(x, rand_t({6, 4, 3})); }, "conv2d", "(6, 4, 3)");
  check_error<ShapeError>([&] { conv2d(rand_t({4, 8}), w); }, "conv2d", "(4, 8)");
  check_error<ShapeError>([&] { conv2d(x, rand_t({6, 3, 3, 3})); }, "conv2d", "(6, 3, 3, 3)");
  check_error<ShapeError>(
      [&] {
        conv2d(x, rand_t({6, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3);
      },
      "conv2d", "(2, 4, 8, 8)");
  check_error<ShapeError>(
      [&] {
        conv2d(x, rand_t({5, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
      },
      "conv2d", "(5, 2, 3, 3)");
  check_error<ValueError>(
      [&] {
        conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 1}, 0);
      },
      "conv2d", "0");
  check_error<ShapeError>([&] { conv2d(x, w, rand_t({5})); }, "conv2d", "(5,)");
  check_error<ShapeError>([&] { conv2d(rand_t({1, 4, 2, 2}), w); }, "conv2d", "(1, 4, 2, 2)");
  check_error<ShapeError>(
      [&] {
        conv2d(rand_t({1, 4, 5, 5}), w, Tensor(), {1, 1}, {0, 0}, {3, 3});
      },
      "conv2d", "(1, 4, 5, 5)");
  check_error<ValueError>([&] { conv2d(x, w, Tensor(), {0, 1}); }, "conv2d", "(0, 1)");
  check_error<ValueError>([&] { conv2d(x, w, Tensor(), {1, 1, 1}); }, "conv2d", "(1, 1, 1)");
  check_error<DTypeError>([&] { conv2d(x, w.to(kFloat64)); }, "conv2d", "(6, 4, 3, 3)");
  check_error<DTypeError>(
      [&] {
        conv2d(ones({1, 1, 3, 3}, kInt64), ones({1, 1, 1, 1}, kInt64));
      },
      "conv2d", "(1, 1, 3, 3)");
  std::vector<float> buf;
  check_error<DeviceError>(
      [&] {
        conv2d(x, fake_cuda({6, 4, 3, 3}, buf));
      },
      "conv2d", "(6, 4, 3, 3)");
  // pooling
  check_error<ShapeError>(
      [&] {
        max_pool2d(rand_t({1, 1, 2, 2}), {3, 3});
      },
      "max_pool2d", "(1, 1, 2, 2)");
  check_error<ShapeError>(
      [&] {
        avg_pool2d(rand_t({1, 1, 2, 5}), {3, 3});
      },
      "avg_pool2d", "(1, 1, 2, 5)");
  check_error<ValueError>([&] { max_pool2d(x, {2, 2}, {2, 2}, {2, 2}); }, "max_pool2d", "(2, 2)");
  check_error<ValueError>([&] { avg_pool2d(x, {0, 2}); }, "avg_pool2d", "(0, 2)");
  check_error<ValueError>([&] { max_pool2d(x, {2, 2}, {0}); }, "max_pool2d", "(0,)");
  check_error<ShapeError>([&] { max_pool2d(rand_t({8, 8}), {2, 2}); }, "max_pool2d", "(8, 8)");
  check_error<DTypeError>(
      [&] {
        max_pool2d(ones({1, 1, 4, 4}, kInt32), {2, 2});
      },
      "max_pool2d", "(1, 1, 4, 4)");
}
