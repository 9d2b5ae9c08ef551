// Fused scaled dot-product attention (Note [fused attention]) against the composition of simple
// framework ops (matmul, masked_fill, softmax, matmul): values and gradients in f32 and f64, at
// sizes that cross the kernel's causal row blocks, through strided and packed inputs; the
// composed fallback for dtypes the kernel does not take; and one error test per misuse.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include "accel.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::check_close;
using accel::test::check_error;
using accel::test::leaves;
using accel::test::max_abs_diff;

namespace {

Generator& gen() {
  static Generator g(9182);
  return g;
}

Tensor rn(const Shape& s, DType dt) { return randn(s, TensorOptions(dt), &gen()); }

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void compare(const Fn& fused, const Fn& reference, const std::vector<Tensor>& inputs, double rtol,
             double atol) {
  std::vector<Tensor> a = leaves(inputs), b = leaves(inputs);
  Tensor ya = fused(a), yb = reference(b);
  check_close(ya, yb, rtol, atol);
  Tensor up = randn(ya.sizes(), TensorOptions(ya.dtype()), &gen());
  std::vector<Tensor> ga = autograd::grad({ya}, a, {up});
  std::vector<Tensor> gb = autograd::grad({yb}, b, {up});
  for (size_t i = 0; i < ga.size(); ++i) {
    INFO("gradient of input ", i);
    check_close(ga[i], gb[i], rtol * 10, atol * 10);
  }
}

// The textbook composition, written independently of the op's own fallback. mask: additive
// (float) or bool (true = takes part); scale 0 means 1 / sqrt(D).
Tensor ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                     const Tensor& mask = Tensor(), double scale = 0) {
  const int64_t T = q.size(-2), S = k.size(-2);
  Tensor att = scale != 0 ? mul(matmul(q, k.transpose(-2, -1)), scale)
                          : div(matmul(q, k.transpose(-2, -1)), std::sqrt(double(q.size(-1))));
  if (mask.defined()) {
    att = mask.dtype() == kBool ? where(mask, att, -INFINITY) : add(att, mask);
  }
  if (causal) {
    Tensor future = gt(arange(S).reshape({1, S}), arange(T).reshape({T, 1}));  // j > i
    att = masked_fill(att, future.to(q.device()), -INFINITY);
  }
  return matmul(softmax(att, -1), v);
}

Tensor ref_packed(const Tensor& qkv, int64_t H, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / H;
  auto heads = [&](int64_t w) {
    return qkv.narrow(2, w * C, C).reshape({B, T, H, D}).transpose(1, 2);
  };
  return ref_attention(heads(0), heads(1), heads(2), causal).transpose(1, 2).reshape({B, T, C});
}

double rtol_for(DType dt) { return dt == kFloat64 ? 1e-10 : 1e-4; }
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : 1e-5; }

}  // namespace

TEST_CASE("scaled_dot_product_attention matches the composed ops (f32 and f64)") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    // T = 150: three causal row blocks of 64, the last one partial.
    for (int64_t T : {1, 7, 64, 150}) {
      INFO("causal, T = ", T);
      compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
              [](const auto& x) { return ref_attention(x[0], x[1], x[2], true); },
              {rn({2, 3, T, 16}, dt), rn({2, 3, T, 16}, dt), rn({2, 3, T, 16}, dt)}, rtol_for(dt),
              atol_for(dt));
    }
    INFO("not causal, S != T, Dv != D");
    compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], false); },
            [](const auto& x) { return ref_attention(x[0], x[1], x[2], false); },
            {rn({2, 2, 9, 8}, dt), rn({2, 2, 70, 8}, dt), rn({2, 2, 70, 5}, dt)}, rtol_for(dt),
            atol_for(dt));
    INFO("strided views: q transposed in memory, k with a padded row stride, broadcast v");
    compare(
        [](const auto& x) {
          return scaled_dot_product_attention(x[0].transpose(2, 3), x[1].narrow(3, 0, 4),
                                              x[2].expand({2, 2, 20, 4}), true);
        },
        [](const auto& x) {
          return ref_attention(x[0].transpose(2, 3), x[1].narrow(3, 0, 4),
                               x[2].expand({2, 2, 20, 4}), true);
        },
        {rn({2, 2, 4, 20}, dt), rn({2, 2, 20, 6}, dt), rn({1, 2, 20, 4}, dt)}, rtol_for(dt),
        atol_for(dt));
  }
}

TEST_CASE("scaled_dot_product_attention: causality and a large score range") {
  // Changing key/value t0 leaves the outputs before t0 bit-identical.
  Tensor q = rn({1, 2, 100, 8}, kFloat32), k = rn({1, 2, 100, 8}, kFloat32);
  Tensor v = rn({1, 2, 100, 8}, kFloat32);
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 70, 1).fill_(5.0);
  v2.narrow(2, 70, 1).fill_(-3.0);
  Tensor y2 = scaled_dot_product_attention(q, k2, v2, true);
  CHECK(equal(y.narrow(2, 0, 70), y2.narrow(2, 0, 70)));
  CHECK_FALSE(allclose(y.narrow(2, 70, 30), y2.narrow(2, 70, 30)));
  // Scores of +-1e3 stay finite (the row max is subtracted before exp).
  Tensor big = mul(q, 300.0);
  Tensor yb = scaled_dot_product_attention(big, k, v, true);
  CHECK(allclose(yb, ref_attention(big, k, v, true), 1e-4, 1e-4));
  for (double e : yb.tolist()) REQUIRE(std::isfinite(e));
}

TEST_CASE("scaled_dot_product_attention_packed matches narrow/reshape/transpose + composed ops") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    // The gpt workload's per-layer shape at a smaller batch: (B, T, 3C) with C = 128, 4 heads.
    compare([](const auto& x) { return scaled_dot_product_attention_packed(x[0], 4, true); },
            [](const auto& x) { return ref_packed(x[0], 4, true); }, {rn({2, 128, 384}, dt)},
            rtol_for(dt), atol_for(dt));
    compare([](const auto& x) { return scaled_dot_product_attention_packed(x[0], 3, false); },
            [](const auto& x) { return ref_packed(x[0], 3, false); }, {rn({3, 10, 18}, dt)},
            rtol_for(dt), atol_for(dt));
    // A non-unit channel stride is copied once; the gradient still reaches the caller's layout.
    compare(
        [](const auto& x) {
          return scaled_dot_product_attention_packed(x[0].transpose(1, 2), 2, true);
        },
        [](const auto& x) { return ref_packed(x[0].transpose(1, 2), 2, true); },
        {rn({2, 12, 9}, dt)}, rtol_for(dt), atol_for(dt));
  }
}

TEST_CASE("CausalSelfAttention: fused path equals the composed path") {
  // Dropout p > 0 in eval mode keeps the fused path; in training with p > 0 the module composes
  // ops. With p = 0 both must agree with the textbook composition on the same projection.
  manual_seed(5);
  nn::CausalSelfAttention attn(32, 4);
  Tensor x = rn({2, 80, 32}, kFloat32);
  Tensor y = attn.forward(x);
  const Tensor qkv = attn.qkv->forward(x);
  Tensor ref = attn.proj->forward(ref_packed(qkv, 4, true));
  check_close(y, ref, 1e-4, 1e-5);
}

TEST_CASE("scaled_dot_product_attention: dtypes the kernel does not take use the composed ops") {
  Tensor q = rn({1, 2, 9, 8}, kFloat32), k = rn({1, 2, 9, 8}, kFloat32),
         v = rn({1, 2, 9, 8}, kFloat32);
  Tensor ref = ref_attention(q, k, v, true);
  Tensor yh = scaled_dot_product_attention(q.to(kFloat16), k.to(kFloat16), v.to(kFloat16), true);
  CHECK(yh.dtype() == kFloat16);
  check_close(yh.to(kFloat32), ref, 5e-3, 5e-3);
}

namespace {

// ---- bf16 (Note [bf16 fused attention]) ----
// The reference is the float64 composition of the same bf16 values (inputs and upstream gradient
// rounded once, then widened exactly), so only the kernel's own roundings are measured. Each
// result passes through at most four bf16 roundings of relative size u = 2^-9 (P or dS before
// their products; O through delta = rowsum(dO * O); the stored P; the output itself), each
// applied to terms bounded by the result's largest magnitude: |error| <= 4 u max|ref|, checked
// with a factor 2 margin. float32 accumulation and exp add ~1e-6 relative, far below.
constexpr double kBf16U = 1.0 / 512;

void check_bf16(const Tensor& got, const Tensor& want64) {
  REQUIRE(got.sizes() == want64.sizes());
  CHECK(got.dtype() == kBFloat16);
  double scale = 0;
  for (double x : want64.tolist()) scale = std::max(scale, std::abs(x));
  const double err = max_abs_diff(got.to(kFloat64), want64), tol = 8 * kBf16U * scale;
  CHECK_MESSAGE(err <= tol, "max |diff| = ", err, " > ", tol, " (max |ref| ", scale, ")");
}

// fused on bf16 leaves against reference on their float64 images; returns the fused output and
// gradients (for the route comparison).
std::vector<Tensor> compare_bf16(const Fn& fused, const Fn& reference,
                                 const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in16, in64;
  for (const Tensor& x : inputs) {
    in16.push_back(x.to(kBFloat16).detach().requires_grad_());
    in64.push_back(x.to(kBFloat16).to(kFloat64).detach().requires_grad_());
  }
  Tensor ya = fused(in16), yb = reference(in64);
  INFO("output");
  check_bf16(ya, yb);
  Generator g(77);
  Tensor up = randn(ya.sizes(), TensorOptions(kBFloat16), &g);
  std::vector<Tensor> ga = autograd::grad({ya}, in16, {up});
  std::vector<Tensor> gb = autograd::grad({yb}, in64, {up.to(kFloat64)});
  std::vector<Tensor> r = {ya.detach()};
  for (size_t i = 0; i < ga.size(); ++i) {
    INFO("gradient of input ", i);
    check_bf16(ga[i], gb[i]);
    r.push_back(ga[i]);
  }
  return r;
}

struct Bf16Case {
  std::string name;
  Fn fused, reference;
  std::vector<Tensor> inputs;  // float32, rounded to bf16 by compare_bf16
};

std::vector<Bf16Case> bf16_cases() {
  const DType f = kFloat32;
  auto plain = [](bool causal) {
    return Fn(
        [causal](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); });
  };
  auto ref = [](bool causal) {
    return Fn([causal](const auto& x) { return ref_attention(x[0], x[1], x[2], causal); });
  };
  std::vector<Bf16Case> cs;
  // T = 7 (odd: a half row pair), 71 (a second, partial row block), 150 (three); D = 24 (not a
  // multiple of 16).
  for (int64_t T : {7, 71, 150}) {
    cs.push_back({"causal T = S = " + std::to_string(T) + ", D = 24",
                  plain(true),
                  ref(true),
                  {rn({2, 2, T, 24}, f), rn({2, 2, T, 24}, f), rn({2, 2, T, 24}, f)}});
  }
  // Odd everything: T 7, S 13, D 9, Dv 5.
  cs.push_back({"not causal T 7 S 13 D 9 Dv 5",
                plain(false),
                ref(false),
                {rn({2, 3, 7, 9}, f), rn({2, 3, 13, 9}, f), rn({2, 3, 13, 5}, f)}});
  cs.push_back({"causal T 7 S 13 D 40",
                plain(true),
                ref(true),
                {rn({1, 2, 7, 40}, f), rn({1, 2, 13, 40}, f), rn({1, 2, 13, 40}, f)}});
  cs.push_back({"causal T 13 S 7 D 40 Dv 3",
                plain(true),
                ref(true),
                {rn({1, 2, 13, 40}, f), rn({1, 2, 7, 40}, f), rn({1, 2, 7, 3}, f)}});
  Tensor keep = gt(rn({7, 13}, f), -0.8);
  keep.narrow(1, 0, 1).fill_(1.0);  // no fully masked row
  cs.push_back(
      {"bool mask (T, S), D 40",
       Fn([keep](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], keep); }),
       Fn([keep](const auto& x) { return ref_attention(x[0], x[1], x[2], false, keep); }),
       {rn({2, 2, 7, 40}, f), rn({2, 2, 13, 40}, f), rn({2, 2, 13, 40}, f)}});
  // A float mask (given in float32: the kernel adds it in float32) and an explicit scale.
  Tensor fm = rn({2, 1, 7, 13}, f);
  cs.push_back({"float mask (B, 1, T, S), scale 0.3",
                Fn([fm](const auto& x) {
                  return scaled_dot_product_attention(x[0], x[1], x[2], fm, 0.0, false, 0.3);
                }),
                Fn([fm](const auto& x) {
                  return ref_attention(x[0], x[1], x[2], false, fm.to(kFloat64), 0.3);
                }),
                {rn({2, 2, 7, 24}, f), rn({2, 2, 13, 24}, f), rn({2, 2, 13, 24}, f)}});
  // S 300: P not kept (the backward recomputes it from lse); S 700: two key blocks (the online
  // softmax rescales O).
  for (int64_t S : {300, 700}) {
    cs.push_back({"not causal T 5 S " + std::to_string(S),
                  plain(false),
                  ref(false),
                  {rn({1, 2, 5, 8}, f), rn({1, 2, S, 8}, f), rn({1, 2, S, 6}, f)}});
  }
  cs.push_back({"causal T = S = 600, D 4",
                plain(true),
                ref(true),
                {rn({1, 1, 600, 4}, f), rn({1, 1, 600, 4}, f), rn({1, 1, 600, 4}, f)}});
  cs.push_back({"strided: q transposed in memory, k narrowed, v broadcast",
                Fn([](const auto& x) {
                  return scaled_dot_product_attention(x[0].transpose(2, 3), x[1].narrow(3, 0, 4),
                                                      x[2].expand({2, 2, 20, 4}), true);
                }),
                Fn([](const auto& x) {
                  return ref_attention(x[0].transpose(2, 3), x[1].narrow(3, 0, 4),
                                       x[2].expand({2, 2, 20, 4}), true);
                }),
                {rn({2, 2, 4, 20}, f), rn({2, 2, 20, 6}, f), rn({1, 2, 20, 4}, f)}});
  // Packed: the gpt workload's per-layer shape at batch 2 (C 128, 4 heads of 32), odd heads of
  // D 3, and a non-unit channel stride.
  cs.push_back(
      {"packed (2, 128, 384) H 4 causal",
       Fn([](const auto& x) { return scaled_dot_product_attention_packed(x[0], 4, true); }),
       Fn([](const auto& x) { return ref_packed(x[0], 4, true); }),
       {rn({2, 128, 384}, f)}});
  cs.push_back(
      {"packed (3, 11, 27) H 3 not causal",
       Fn([](const auto& x) { return scaled_dot_product_attention_packed(x[0], 3, false); }),
       Fn([](const auto& x) { return ref_packed(x[0], 3, false); }),
       {rn({3, 11, 27}, f)}});
  cs.push_back({"packed transposed (2, 9, 13) H 1 causal",
                Fn([](const auto& x) {
                  return scaled_dot_product_attention_packed(x[0].transpose(1, 2), 1, true);
                }),
                Fn([](const auto& x) { return ref_packed(x[0].transpose(1, 2), 1, true); }),
                {rn({2, 15, 13}, f)}});
  return cs;
}

}  // namespace

TEST_CASE("bf16 scaled_dot_product_attention: fused kernel against float64 on the same values") {
  // At the best level (vdpbf16ps microkernels on an AVX512-BF16 CPU) and forced to AVX2 (bf16
  // blocks widened to float32 for the float32 kernel): both within the bf16 bound of the
  // reference, and of each other.
  const cpu::CpuIsa saved = cpu::cpu_isa();
  std::vector<Bf16Case> cs = bf16_cases();
  std::vector<std::vector<Tensor>> best;
  for (const Bf16Case& c : cs) {
    CAPTURE(c.name);
    best.push_back(compare_bf16(c.fused, c.reference, c.inputs));
  }
  if (cpu::cpu_isa_best() >= cpu::CpuIsa::Avx2 && cpu::cpu_isa_best() != cpu::CpuIsa::Native) {
    cpu::set_cpu_isa(cpu::CpuIsa::Avx2);
    for (size_t i = 0; i < cs.size(); ++i) {
      CAPTURE(cs[i].name);
      std::vector<Tensor> got = compare_bf16(cs[i].fused, cs[i].reference, cs[i].inputs);
      for (size_t j = 0; j < got.size(); ++j) {
        INFO("avx2 against best, result ", j);
        check_bf16(got[j], best[i][j].to(kFloat64));
      }
    }
    cpu::set_cpu_isa(saved);
  }
}

TEST_CASE("bf16 scaled_dot_product_attention: causality holds exactly, fully masked rows are NaN") {
  Tensor q = rn({1, 2, 100, 8}, kBFloat16), k = rn({1, 2, 100, 8}, kBFloat16);
  Tensor v = rn({1, 2, 100, 8}, kBFloat16);
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  CHECK(y.dtype() == kBFloat16);
  Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 70, 1).fill_(5.0);
  v2.narrow(2, 70, 1).fill_(-3.0);
  Tensor y2 = scaled_dot_product_attention(q, k2, v2, true);
  CHECK(equal(y.narrow(2, 0, 70), y2.narrow(2, 0, 70)));
  CHECK_FALSE(equal(y.narrow(2, 70, 30), y2.narrow(2, 70, 30)));
  Tensor none = ones({5, 7}, TensorOptions(kBool));
  none.narrow(0, 2, 1).fill_(0.0);
  Tensor yn = scaled_dot_product_attention(rn({1, 1, 5, 4}, kBFloat16), rn({1, 1, 7, 4}, kBFloat16),
                                           rn({1, 1, 7, 2}, kBFloat16), none);
  std::vector<double> vals = yn.tolist();
  for (size_t i = 0; i < vals.size(); ++i) CHECK(std::isnan(vals[i]) == (i / 2 == 2));
}

TEST_CASE("scaled_dot_product_attention: errors name the op and the shapes") {
  Tensor q = rn({1, 2, 5, 4}, kFloat32);
  check_error<ShapeError>(
      [&] {
        scaled_dot_product_attention(q, rn({1, 2, 5, 3}, kFloat32), q, false);
      },
      {"[scaled_dot_product_attention]", "(1, 2, 5, 4)", "(1, 2, 5, 3)"});
  check_error<ShapeError>([&] { scaled_dot_product_attention(q.flatten(0, 1), q, q, false); },
                          {"[scaled_dot_product_attention]", "(2, 5, 4)"});
  check_error<ValueError>(
      [&] {
        scaled_dot_product_attention(q, q, q, ones({5, 5}, TensorOptions(kBool)), 0.0, true);
      },
      {"[scaled_dot_product_attention]", "is_causal", "(5, 5)"});
  check_error<ShapeError>(
      [&] {
        scaled_dot_product_attention(q, q, q, ones({3, 5}, TensorOptions(kBool)));
      },
      {"[scaled_dot_product_attention] attn_mask", "(3, 5)", "(1, 2, 5, 5)"});
  check_error<DTypeError>(
      [&] {
        scaled_dot_product_attention(q, q, q, ones({5, 5}, TensorOptions(kInt64)));
      },
      {"[scaled_dot_product_attention] attn_mask", "int64"});
  check_error<ValueError>([&] { scaled_dot_product_attention(q, q, q, Tensor(), 1.5); },
                          {"[scaled_dot_product_attention] dropout_p", "1.5"});
  check_error<DTypeError>([&] { scaled_dot_product_attention(q, q.to(kFloat64), q, false); },
                          {"[scaled_dot_product_attention]", "float64"});
  check_error<ShapeError>(
      [&] {
        scaled_dot_product_attention_packed(rn({2, 5, 10}, kFloat32), 4, true);
      },
      {"[scaled_dot_product_attention_packed]", "(2, 5, 10)"});
  check_error<DTypeError>(
      [&] {
        scaled_dot_product_attention_packed(ones({2, 5, 12}, TensorOptions(kInt64)), 2, true);
      },
      {"[scaled_dot_product_attention_packed]"});
}

TEST_CASE("scaled_dot_product_attention: masks, scale, cross-attention and long rows") {
  // S > 256 drops the kept probabilities (the backward recomputes them from lse); S > 512 spans
  // two key blocks (the online softmax rescales O). Masks: bool (T, S) broadcast, float
  // (B, 1, T, S), bool with a padded key column per batch (B, 1, 1, S).
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    for (int64_t S : {9, 300, 700}) {
      INFO("S = ", S);
      const int64_t T = 5;
      const std::vector<Tensor> in = {rn({2, 3, T, 8}, dt), rn({2, 3, S, 8}, dt),
                                      rn({2, 3, S, 6}, dt)};
      Tensor keep = gt(rn({T, S}, kFloat32), -0.8);
      keep.narrow(1, 0, 1).fill_(1.0);  // no fully masked row
      compare([&](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], keep); },
              [&](const auto& x) { return ref_attention(x[0], x[1], x[2], false, keep); }, in,
              rtol_for(dt), atol_for(dt));
      Tensor fm = rn({2, 1, T, S}, dt);
      compare(
          [&](const auto& x) {
            return scaled_dot_product_attention(x[0], x[1], x[2], fm, 0.0, false, 0.3);
          },
          [&](const auto& x) { return ref_attention(x[0], x[1], x[2], false, fm, 0.3); }, in,
          rtol_for(dt), atol_for(dt));
      Tensor pad = ones({2, 1, 1, S}, TensorOptions(kBool));
      pad.narrow(0, 1, 1).narrow(3, S - 2, 2).fill_(0.0);
      compare([&](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], pad); },
              [&](const auto& x) { return ref_attention(x[0], x[1], x[2], false, pad); }, in,
              rtol_for(dt), atol_for(dt));
    }
    INFO("causal, T = S = 600: two key blocks, no kept probabilities");
    compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
            [](const auto& x) { return ref_attention(x[0], x[1], x[2], true); },
            {rn({1, 2, 600, 4}, dt), rn({1, 2, 600, 4}, dt), rn({1, 2, 600, 4}, dt)}, rtol_for(dt),
            atol_for(dt));
    INFO("causal with T != S (top-left aligned, as torch)");
    compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
            [](const auto& x) { return ref_attention(x[0], x[1], x[2], true); },
            {rn({1, 2, 70, 4}, dt), rn({1, 2, 6, 4}, dt), rn({1, 2, 6, 3}, dt)}, rtol_for(dt),
            atol_for(dt));
    compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
            [](const auto& x) { return ref_attention(x[0], x[1], x[2], true); },
            {rn({1, 2, 6, 4}, dt), rn({1, 2, 70, 4}, dt), rn({1, 2, 70, 3}, dt)}, rtol_for(dt),
            atol_for(dt));
  }
}

TEST_CASE("scaled_dot_product_attention: a float mask that requires grad gets its gradient") {
  const std::vector<Tensor> in = {rn({1, 2, 4, 3}, kFloat64), rn({1, 2, 6, 3}, kFloat64),
                                  rn({1, 2, 6, 3}, kFloat64), rn({4, 6}, kFloat64)};
  compare([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
          [](const auto& x) { return ref_attention(x[0], x[1], x[2], false, x[3]); }, in, 1e-10,
          1e-12);
}

TEST_CASE("scaled_dot_product_attention: other ranks, dropout, fully masked rows") {
  Tensor q = rn({3, 5, 4}, kFloat64), k = rn({3, 7, 4}, kFloat64), v = rn({3, 7, 2}, kFloat64);
  Tensor keep = gt(rn({5, 7}, kFloat32), -0.5);
  keep.narrow(1, 0, 1).fill_(1.0);
  // (N, T, D) and (A, B, H, T, D) against the (B, H, T, D) op on the same data.
  Tensor y3 = scaled_dot_product_attention(q, k, v, keep);
  CHECK(y3.sizes() == Shape{3, 5, 2});
  check_close(y3, ref_attention(q, k, v, false, keep), 1e-10, 1e-12);
  Tensor y5 = scaled_dot_product_attention(q.reshape({1, 3, 1, 5, 4}), k.reshape({1, 3, 1, 7, 4}),
                                           v.reshape({1, 3, 1, 7, 2}), Tensor(), 0.0, true);
  CHECK(y5.sizes() == Shape{1, 3, 1, 5, 2});
  check_close(y5.reshape({3, 5, 2}), ref_attention(q, k, v, true), 1e-10, 1e-12);
  // Dropout: the attention weights dropped with the generator's draws, scaled by 1 / (1 - p).
  Tensor q4 = q.unsqueeze(0), k4 = k.unsqueeze(0), v4 = v.unsqueeze(0);
  Generator g1(11), g2(11);
  Tensor yd = scaled_dot_product_attention(q4, k4, v4, Tensor(), 0.3, false, std::nullopt, &g1);
  Tensor att = softmax(div(matmul(q4, k4.transpose(-2, -1)), 2.0), -1);
  Tensor ref = matmul(dropout(att, 0.3, true, &g2), v4);
  check_close(yd, ref, 1e-10, 1e-12);
  CHECK_FALSE(allclose(yd, matmul(att, v4), 1e-3, 1e-3));
  // A row with every key masked is NaN, fused and composed alike (torch's math path too).
  Tensor none = ones({5, 7}, TensorOptions(kBool));
  none.narrow(0, 2, 1).fill_(0.0);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor yn = scaled_dot_product_attention(q4.to(dt), k4.to(dt), v4.to(dt), none);
    std::vector<double> vals = yn.tolist();
    for (size_t i = 0; i < vals.size(); ++i) {
      const int64_t row = int64_t(i / 2) % 5;
      CHECK(std::isnan(vals[i]) == (row == 2));
    }
  }
}
