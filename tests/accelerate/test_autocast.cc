// Autocast wiring (Note [autocast in ops], Note [autocast on CPU]): matmul-class ops convert
// their inputs to bf16/fp16 and run the 16-bit kernel (output in that dtype, on CPU as on CUDA),
// parameters' copies come from the weight cache (Note [autocast weight cache]), fp32-only ops
// upcast low-precision inputs, gradients reach the float32 master weights, and bf16 training
// through the facade converges like the fp32 run.
//
// Until 2026-12 CPU autocast rounded the inputs and kept float32 outputs; the expectations below
// changed from "float32 output equal to the op on rounded float32 inputs" to "16-bit output
// equal to the op on 16-bit inputs", which is what the bf16 kernel computes now.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include <doctest/doctest.h>

#include "autograd/autocast.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "kernels/cpu/cpu_isa.h"   // the bf16 GEMM route
#include "kernels/stubs/linalg.h"  // round_to_lowp_stub
#include "tests/accelerate/training.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::max_abs_diff;
using accel::test::rel_max_diff;

namespace {

AcceleratorConfig mp_config(MixedPrecision mp) {
  AcceleratorConfig c;
  c.read_env = false;
  c.mixed_precision = mp;
  return c;
}

}  // namespace

TEST_CASE("autocast bf16: Linear forward runs the bf16 kernel, output bfloat16 on CPU") {
  Accelerator acc(mp_config(MixedPrecision::BF16));
  Generator g(1);
  nn::Linear lin(16, 8, true, &g);
  Tensor x = randn({4, 16}, {}, &g);
  Tensor y32 = lin.forward(x);
  Tensor y;
  {
    auto ac = acc.autocast();
    CHECK(autocast_enabled());
    CHECK(autocast_dtype() == kBFloat16);
    y = lin.forward(x);
  }
  CHECK_FALSE(autocast_enabled());
  CHECK(y.dtype() == kBFloat16);
  // Exactly the bf16 kernel on the bf16 values (fp32 accumulation, bias fused), not the fp32 one.
  Tensor want = linear(x.to(kBFloat16), lin.weight.to(kBFloat16), lin.bias.to(kBFloat16));
  CHECK(want.dtype() == kBFloat16);
  CHECK(equal(y, want));
  CHECK_FALSE(equal(y.to(kFloat32), y32));
  CHECK(rel_max_diff(y.to(kFloat32), y32) < 2e-2);  // bf16 has 8 significant bits
  // The parameters themselves stay float32 and untouched.
  CHECK(lin.weight.dtype() == kFloat32);
}

TEST_CASE(
    "autocast: matmul, mm, bmm, conv2d run in the 16-bit dtype; fp16 too; float64 untouched") {
  Generator g(2);
  Tensor a = randn({3, 5}, {}, &g), b = randn({5, 4}, {}, &g);
  Tensor a3 = randn({2, 3, 5}, {}, &g), b3 = randn({2, 5, 4}, {}, &g);
  Tensor xc = randn({1, 2, 6, 6}, {}, &g), wc = randn({3, 2, 3, 3}, {}, &g),
         bc = randn({3}, {}, &g);
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dt);
    AutocastGuard ac(true, dt);
    Tensor got = matmul(a, b);
    CHECK(got.dtype() == dt);
    CHECK(equal(got, [&] {
      AutocastSuspend off;
      return matmul(a.to(dt), b.to(dt));
    }()));
    Tensor got_mm = mm(a, b), got_bmm = bmm(a3, b3), got_conv = conv2d(xc, wc, bc, {1, 1}, {1, 1});
    CHECK(got_mm.dtype() == dt);
    CHECK(got_bmm.dtype() == dt);
    CHECK(got_conv.dtype() == dt);
    AutocastSuspend off;
    CHECK(equal(got_mm, mm(a.to(dt), b.to(dt))));
    CHECK(rel_max_diff(got_mm.to(kFloat32), mm(a, b)) < 2e-2);
    CHECK(equal(got_bmm, bmm(a3.to(dt), b3.to(dt))));
    CHECK(rel_max_diff(got_bmm.to(kFloat32), bmm(a3, b3)) < 2e-2);
    CHECK(equal(got_conv, conv2d(xc.to(dt), wc.to(dt), bc.to(dt), {1, 1}, {1, 1})));
    CHECK(rel_max_diff(got_conv.to(kFloat32), conv2d(xc, wc, bc, {1, 1}, {1, 1})) < 2e-2);
  }
  // float64 (what gradcheck uses) is left alone, as torch.autocast does.
  Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  Tensor plain = matmul(a64, b64);
  AutocastGuard ac(true, kBFloat16);
  Tensor under = matmul(a64, b64);
  CHECK(under.dtype() == kFloat64);
  CHECK(equal(under, plain));
  // A bf16 activation meets float32 weights: both become bf16, no dtype error.
  Tensor mixed = matmul(a.to(kBFloat16), b);
  CHECK(mixed.dtype() == kBFloat16);
  AutocastSuspend off;
  CHECK(equal(mixed, matmul(a.to(kBFloat16), b.to(kBFloat16))));
}

TEST_CASE("autocast: softmax and losses run in float32 on bf16/fp16 inputs, norms keep bf16") {
  Generator g(3);
  Tensor x32 = randn({4, 6}, {}, &g);
  Tensor x = x32.to(kBFloat16);
  Tensor xf = x.to(kFloat32);  // the same values in float32
  Tensor w = randn({6}, {}, &g), bias = randn({6}, {}, &g);
  Tensor target = tensor(std::vector<int64_t>{0, 5, 2, 3}, {4});
  Tensor y32 = randn({4, 6}, {}, &g);
  // A bf16 input takes float32 parameters on the CPU (Note [mixed-dtype norms]); other mixes are
  // dtype errors naming the op.
  CHECK(layer_norm(x, {6}, w, bias).dtype() == kBFloat16);
  CHECK_THROWS_AS(layer_norm(x, {6}, w.to(kFloat64), bias), DTypeError);
  CHECK_THROWS_AS(layer_norm(xf, {6}, w.to(kBFloat16), bias), DTypeError);
  CHECK_THROWS_AS(rms_norm(x, {6}, w.to(kFloat16)), DTypeError);
  AutocastGuard ac(true, kBFloat16);
  struct Case {
    const char* name;
    Tensor got, want;
  };
  std::vector<Case> cases;
  {
    Tensor s = softmax(x, 1), ls = log_softmax(x, 1), ln = layer_norm(x, {6}, w, bias),
           rn = rms_norm(x, {6}, w), ce = cross_entropy(x, target), nl = nll_loss(x, target),
           ms = mse_loss(x, y32), bce = binary_cross_entropy_with_logits(x, sigmoid(y32));
    AutocastSuspend off;
    cases = {{"softmax", s, softmax(xf, 1)},
             {"log_softmax", ls, log_softmax(xf, 1)},
             {"layer_norm", ln, layer_norm(xf, {6}, w, bias)},
             {"rms_norm", rn, rms_norm(xf, {6}, w)},
             {"cross_entropy", ce, cross_entropy(xf, target)},
             {"nll_loss", nl, nll_loss(xf, target)},
             {"mse_loss", ms, mse_loss(xf, y32)},
             {"bce_with_logits", bce, binary_cross_entropy_with_logits(xf, sigmoid(y32))}};
  }
  for (auto& c : cases) {
    CAPTURE(c.name);
    // Note [autocast norms]: the norms keep a bf16 x bf16 (float32 statistics and parameters):
    // the float32 result rounded once.
    const bool norm =
        std::strcmp(c.name, "layer_norm") == 0 || std::strcmp(c.name, "rms_norm") == 0;
    CHECK(c.got.dtype() == (norm ? kBFloat16 : kFloat32));
    CHECK(equal(c.got, norm ? c.want.to(kBFloat16) : c.want));
  }
  // fp16 inputs likewise.
  Tensor h = x32.to(kFloat16);
  CHECK(softmax(h, 1).dtype() == kFloat32);
}

// Note [autocast cross-entropy]: on the CPU the kernel reads the bf16 logits as they are (no
// float32 copy); the losses are float32 and equal the float32 op's on the same values, the
// gradient is the upcast route's (float32, then rounded to bf16 once).
TEST_CASE("autocast: cross_entropy reads bf16 logits in float32, float32 losses, same gradient") {
  Generator g(5);
  const Tensor x32 = randn({70, 300}, {}, &g).mul(3.0);
  Tensor target = randint(0, 300, {70}, TensorOptions(kInt64), &g);
  target.data<int64_t>()[3] = -100;  // an ignored row
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double ls : {0.0, 0.1}) {
      CAPTURE(int(r));
      CAPTURE(ls);
      const Tensor x = x32.to(kBFloat16).requires_grad_(true);
      const Tensor xf = x.detach().to(kFloat32).requires_grad_(true);
      const Tensor w = randn(r == Reduction::None ? Shape{70} : Shape{}, {}, &g);
      Tensor got;
      {
        AutocastGuard ac(true, kBFloat16);
        got = cross_entropy(x, target, -100, r, ls);
      }
      const Tensor want = cross_entropy(xf, target, -100, r, ls);
      CHECK(got.dtype() == kFloat32);
      CHECK(max_abs_diff(got, want) <= 1e-6 * (1 + max_abs_diff(want, zeros_like(want))));
      sum(got * w).backward();
      sum(want * w).backward();
      REQUIRE(x.grad().defined());
      CHECK(x.grad().dtype() == kBFloat16);
      // The same float32 gradient rounded to bf16: at most one bf16 step apart where a float32
      // rounding of the two formulas differs.
      const Tensor a = x.grad().to(kFloat32), b = xf.grad().to(kBFloat16).to(kFloat32);
      CHECK(max_abs_diff(a, b) <= 1.0 / 128 * (1e-3 + max_abs_diff(b, zeros_like(b))));
    }
  }
}

TEST_CASE("autocast: attention is matmul-class on CPU under bf16 (fused bf16 kernel, bf16 out)") {
  // Note [autocast attention]: float32 q, k, v are cast to bf16 and bf16 ones pass as they are;
  // the fused bf16 kernel (Note [bf16 fused attention]) gives bf16, the same values as calling it
  // outside autocast. Under f16 autocast attention stays a float32 op on upcast inputs.
  Generator g(6);
  Tensor q = randn({1, 2, 5, 8}, {}, &g), k = randn({1, 2, 5, 8}, {}, &g),
         v = randn({1, 2, 5, 8}, {}, &g);
  Tensor f32 = scaled_dot_product_attention(q, k, v, true);
  auto merged = [](const Tensor& t) { return t.transpose(1, 2).reshape({1, 5, 16}); };
  Tensor qkv = cat({merged(q), merged(k), merged(v)}, 2);  // (B, T, 3C) = [q | k | v]
  Tensor q16 = q.to(kBFloat16), k16 = k.to(kBFloat16), v16 = v.to(kBFloat16);
  Tensor want16 = scaled_dot_product_attention(q16, k16, v16, true);
  Tensor want_packed16 = scaled_dot_product_attention_packed(qkv.to(kBFloat16), 2, true);
  REQUIRE(want16.dtype() == kBFloat16);
  Tensor qf16 = q.to(kFloat16), kf16 = k.to(kFloat16), vf16 = v.to(kFloat16);
  Tensor want_f16 =
      scaled_dot_product_attention(qf16.to(kFloat32), kf16.to(kFloat32), vf16.to(kFloat32), true);
  Tensor ql = q.detach().clone().requires_grad_();
  Tensor got, packed, got16, packed16, gotf16;
  {
    AutocastGuard ac(true, kBFloat16);
    got = scaled_dot_product_attention(ql, k, v, true);
    packed = scaled_dot_product_attention_packed(qkv, 2, true);
    got16 = scaled_dot_product_attention(q16, k16, v16, true);
    packed16 = scaled_dot_product_attention_packed(qkv.to(kBFloat16), 2, true);
  }
  {
    AutocastGuard ac(true, kFloat16);
    gotf16 = scaled_dot_product_attention(qf16, kf16, vf16, true);
  }
  CHECK(got.dtype() == kBFloat16);
  CHECK(equal(got, want16));
  CHECK(packed.dtype() == kBFloat16);
  CHECK(equal(packed, want_packed16));
  CHECK(equal(packed, merged(got)));
  CHECK(got16.dtype() == kBFloat16);
  CHECK(equal(got16, want16));
  CHECK(equal(packed16, want_packed16));
  CHECK(rel_max_diff(got.to(kFloat32), f32) < 3e-2);
  // The float32 leaf gets a float32 gradient through the cast.
  got.to(kFloat32).sum().backward();
  const Tensor gq = ql.grad().clone();
  CHECK(gq.dtype() == kFloat32);
  ql.grad().zero_();
  scaled_dot_product_attention(ql, k, v, true).sum().backward();
  CHECK(rel_max_diff(gq, ql.grad()) < 5e-2);
  CHECK(gotf16.dtype() == kFloat32);
  CHECK(equal(gotf16, want_f16));
}

TEST_CASE(
    "autocast weight cache: one conversion per parameter per region, invalidated by updates") {
  // On both bf16 GEMM routes: oneDNN's bf16 kernel on cached bf16 copies (the activation x is
  // converted on every call), and the float32 route's fused linear on cached float32 images (x
  // is rounded inside the kernel: no conversion counted; Note [autocast linear in float32]).
  const cpu::Bf16Gemm saved = cpu::bf16_gemm();
  for (cpu::Bf16Gemm route : {cpu::Bf16Gemm::Native, cpu::Bf16Gemm::F32}) {
    cpu::set_bf16_gemm(route);
    const bool fused = route == cpu::Bf16Gemm::F32;
    const int64_t xc = fused ? 0 : 1;  // conversions of x per forward
    CAPTURE(fused);
    Generator g(7);
    nn::Linear lin(16, 8, true, &g);
    Tensor x = randn({4, 16}, {}, &g);
    const AutocastCacheStats s0 = autocast_cache_stats();
    CHECK(s0.entries == 0);
    Tensor y1, y2, y3, y4;
    {
      AutocastGuard ac(true, kBFloat16);
      y1 = lin.forward(x);  // x (not a parameter) + weight + bias
      const AutocastCacheStats s1 = autocast_cache_stats();
      CHECK(s1.conversions - s0.conversions == 2 + xc);
      CHECK(s1.hits - s0.hits == 0);
      CHECK(s1.entries == 2);
      y2 = lin.forward(x);  // only x converts; weight and bias come from the cache
      const AutocastCacheStats s2 = autocast_cache_stats();
      CHECK(s2.conversions - s1.conversions == xc);
      CHECK(s2.hits - s1.hits == 2);
      CHECK(equal(y1, y2));
      {
        AutocastGuard inner(true, kBFloat16);  // nested: shares the cache and does not clear it
        lin.forward(x);
        CHECK(autocast_cache_stats().hits - s2.hits == 2);
      }
      CHECK(autocast_cache_stats().entries == 2);
      // An in-place update bumps the weight's version: the next use converts it again.
      {
        NoGradGuard ng;
        lin.weight.mul_(2.0);
      }
      const AutocastCacheStats s3 = autocast_cache_stats();
      y3 = lin.forward(x);
      const AutocastCacheStats s4 = autocast_cache_stats();
      CHECK(s4.conversions - s3.conversions == 1 + xc);  // the weight (and x)
      CHECK(s4.hits - s3.hits == 1);                     // the bias
      CHECK(rel_max_diff(y3.to(kFloat32), [&] {
              AutocastSuspend off;
              return lin.forward(x);
            }()) < 2e-2);
      // An optimizer step updates every parameter: both are converted again.
      {
        Tensor loss = cross_entropy(y3, tensor(std::vector<int64_t>{0, 1, 2, 3}, {4}));
        AutocastSuspend off;
        loss.backward();
      }
      optim::AdamW opt(lin.parameters(), optim::AdamWOptions{});
      opt.step();
      const AutocastCacheStats s5 = autocast_cache_stats();
      y4 = lin.forward(x);
      CHECK(autocast_cache_stats().conversions - s5.conversions == 2 + xc);
      CHECK(autocast_cache_stats().hits - s5.hits == 0);
      CHECK_FALSE(equal(y4, y3));
    }
    // The outermost guard's exit drops the copies.
    CHECK(autocast_cache_stats().entries == 0);
    // Both routes now cache copies without history (the float32 images, and the bf16 copies of
    // the native route's one-node linear, Note [autocast linear, native 16-bit]): one made under
    // no_grad is reused with grad on, and only x converts again on the native route.
    AutocastGuard ac(true, kBFloat16);
    {
      NoGradGuard ng;
      lin.forward(x);
    }
    const AutocastCacheStats s6 = autocast_cache_stats();
    Tensor y5 = lin.forward(x);
    CHECK(autocast_cache_stats().conversions - s6.conversions == xc);
    CHECK(y5.requires_grad());
    // autocast_cast's copies (conv2d, bmm) carry history: one made under no_grad is not reused.
    {
      NoGradGuard ng;
      autocast_cast(lin.weight);
    }
    const AutocastCacheStats s7 = autocast_cache_stats();
    CHECK(autocast_cast(lin.weight).requires_grad());
    CHECK(autocast_cache_stats().conversions - s7.conversions == 1);
    clear_autocast_cache();
  }
  cpu::set_bf16_gemm(saved);
}

TEST_CASE("vectorised float32 <-> bfloat16 conversion equals the scalar rounding") {
  // Values around every rounding case: ties to even, just above/below, inf, NaN, large, negative.
  std::vector<float> v;
  Generator g(8);
  for (double d : randn({1000}, {}, &g).tolist()) v.push_back(float(d) * 1e3f);
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu,
                        0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                        0x00000000u, 0x80000000u, 0x3f800000u, 0x47efffffu}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  const int64_t n = int64_t(v.size());
  Tensor src = tensor(v, {n});
  Tensor fast = src.to(kBFloat16);  // contiguous: the vectorised kernel
  // A strided destination takes the element-wise loop with BFloat16::from_float.
  Tensor wide = zeros({n, 2}, kBFloat16);
  Tensor slow = wide.select(1, 0);
  slow.copy_(src);
  const BFloat16* pf = fast.data<BFloat16>();
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CAPTURE(v[size_t(i)]);
    const uint16_t want = BFloat16::from_float(v[size_t(i)]);
    const uint16_t got = pf[i].bits;
    if (std::isnan(v[size_t(i)])) {
      CHECK((got & 0x7fffu) > 0x7f80u);  // a NaN stays a NaN
    } else {
      CHECK(got == want);
    }
  }
  Tensor finite = src.narrow(0, 0, 1000);
  CHECK(
      equal(finite.to(kBFloat16).to(kFloat32), slow.narrow(0, 0, 1000).contiguous().to(kFloat32)));
  // bfloat16 -> float32 is exact: back and forth again gives the same bits.
  Tensor back = fast.to(kFloat32);
  CHECK(equal(back.to(kBFloat16).to(kFloat32).narrow(0, 0, 1000), back.narrow(0, 0, 1000)));
}

TEST_CASE("vectorised float32 <-> float16 conversion equals the scalar rounding") {
  // Every float16 value converts up exactly (contiguous: the F16C kernel) and back to itself.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  Tensor h = empty({65536}, kFloat16);
  std::memcpy(h.data_ptr(), all.data(), all.size() * 2);
  Tensor up = h.to(kFloat32);
  Tensor down = up.to(kFloat16);
  const float* pu = up.data<float>();
  const uint16_t* pd = static_cast<const uint16_t*>(down.data_ptr());
  int64_t bad_up = 0, bad_down = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = Half::to_float(uint16_t(i));
    if (std::isnan(want) ? !std::isnan(pu[i]) : std::memcmp(&want, &pu[i], 4) != 0) ++bad_up;
    const bool nan = (i & 0x7fffu) > 0x7c00u;
    if (nan ? (pd[i] & 0x7fffu) <= 0x7c00u : pd[i] != i) ++bad_down;
  }
  CHECK(bad_up == 0);
  CHECK(bad_down == 0);
  // float32 values at every rounding case: ties to even in the normal and subnormal ranges, the
  // overflow threshold (65520 rounds to inf, 65519.99 to 65504), the underflow one, inf, NaN.
  std::vector<float> v;
  Generator g(9);
  for (double d : randn({1000}, {}, &g).tolist()) v.push_back(float(d) * 300.0f);
  for (double d : randn({500}, {}, &g).tolist()) v.push_back(float(d) * 1e-5f);
  for (float f : {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f, 65519.99f, 65520.0f, 1e6f,
                  -65520.0f, 2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f, 6.1035156e-5f,
                  6.0975552e-5f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN})
    v.push_back(f);
  const int64_t n = int64_t(v.size());
  Tensor src = tensor(v, {n});
  Tensor fast = src.to(kFloat16);
  const uint16_t* pf = static_cast<const uint16_t*>(fast.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CAPTURE(v[size_t(i)]);
    if (std::isnan(v[size_t(i)])) {
      CHECK((pf[i] & 0x7fffu) > 0x7c00u);
    } else {
      CHECK(pf[i] == Half::from_float(v[size_t(i)]));
    }
  }
}

TEST_CASE(
    "round_to_lowp_stub: float32 rounded to bf16 / f16 in one pass, the bits of down then up") {
  // Note [autocast linear in float32]: the cached weight images and the float32 gradients of the
  // fused linear are rounded in registers; they must equal the two conversions bit for bit
  // (vcvtneps2bf16's flushed denormals included), NaN staying NaN.
  std::vector<float> v;
  Generator g(10);
  for (double d : randn({70001}, {}, &g).tolist()) v.push_back(float(d) * 100.0f);
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
        0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x00000001u, 0x807fffffu, 0x00000000u,
        0x80000000u, 0x477ff000u, 0x477fefffu, 0x33800000u, 0x33800001u, 0x387fc000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  const int64_t n = int64_t(v.size());
  const Tensor src = tensor(v, {n});
  const Device cpu(DeviceType::CPU, 0);
  for (DType low : {kBFloat16, kFloat16}) {
    CAPTURE(low);
    // Contiguous, and a strided source (copied first), including a short unaligned tail.
    for (const Tensor& s : {src, src.narrow(0, 3, n - 3), stack({src, src}, 1).select(1, 1)}) {
      Tensor got = empty(s.sizes());
      round_to_lowp_stub(cpu, s, got, low);
      // (from a contiguous copy: a strided cast takes the scalar loop, which keeps the denormals
      // vcvtneps2bf16 flushes)
      const Tensor ref = s.contiguous().to(low).to(kFloat32);
      const uint32_t* pg = static_cast<const uint32_t*>(got.data_ptr());
      const uint32_t* pr = static_cast<const uint32_t*>(ref.data_ptr());
      int64_t bad = 0;
      for (int64_t i = 0; i < s.numel(); ++i) {
        const bool nan = (pr[i] & 0x7fffffffu) > 0x7f800000u;
        if (nan ? (pg[i] & 0x7fffffffu) <= 0x7f800000u : pg[i] != pr[i]) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("float16 elementwise ops: chunked contiguous loops give the per-element loop's bits") {
  // Note [float16 elementwise in float32 chunks]: contiguous float16 -> float16 unary and binary
  // ops convert 256-element chunks with F16C; a strided view takes the per-element loop with
  // Half's own conversions. 70001 elements: several threads' ranges and a partial last chunk.
  Generator g(10);
  const int64_t n = 70001;
  auto strided = [&](const Tensor& t) {  // the same values, one column of a (n, 2) tensor
    Tensor w = zeros({n, 2}, kFloat16);
    Tensor col = w.select(1, 0);
    col.copy_(t);
    return col;
  };
  Tensor x = mul(randn({n}, {}, &g), 4.0).to(kFloat16);
  Tensor y = add(mul(randn({n}, {}, &g), 3.0), 0.1).to(kFloat16);
  Tensor xs = strided(x), ys = strided(y);
  REQUIRE(!xs.is_contiguous());
  auto same = [](const Tensor& fast, const Tensor& slow) {
    const Tensor s = slow.contiguous();
    const uint16_t* pf = static_cast<const uint16_t*>(fast.data_ptr());
    const uint16_t* ps = static_cast<const uint16_t*>(s.data_ptr());
    int64_t bad = 0;
    for (int64_t i = 0; i < fast.numel(); ++i) {
      const bool nan_f = (pf[i] & 0x7fffu) > 0x7c00u, nan_s = (ps[i] & 0x7fffu) > 0x7c00u;
      if (nan_f != nan_s || (!nan_f && pf[i] != ps[i])) ++bad;
    }
    return bad;
  };
  CHECK(same(add(x, y), add(xs, ys)) == 0);
  CHECK(same(mul(x, y), mul(xs, ys)) == 0);
  CHECK(same(div(x, y), div(xs, ys)) == 0);
  CHECK(same(sub(x, y), sub(xs, ys)) == 0);
  const Tensor one = full({1}, 1.5, kFloat16);
  CHECK(same(mul(x, one), mul(xs, one)) == 0);
  CHECK(same(exp(x), exp(xs)) == 0);
  CHECK(same(gelu(x), gelu(xs)) == 0);
  CHECK(same(relu(x), relu(xs)) == 0);
  CHECK(same(neg(x), neg(xs)) == 0);
  CHECK(same(sqrt(abs(x)), sqrt(abs(xs))) == 0);
}

namespace {
// x: (B, 8) -> (B, 3)
std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 32, true, &g),
                                          std::make_shared<nn::Tanh>(),
                                          std::make_shared<nn::Linear>(32, 3, true, &g));
}

// Linearly separable 3-class data: label = argmax(x @ teacher).
std::vector<Tensor> make_classes(int64_t n) {
  Generator g(9);
  Tensor x = randn({n, 8}, {}, &g);
  Tensor teacher = randn({8, 3}, {}, &g);
  Tensor y = argmax(matmul(x, teacher), 1);
  return {x, y};
}
}  // namespace

TEST_CASE("autocast bf16: float32 loss and weight gradients, close to the fp32 run") {
  auto data = make_classes(64);
  auto grads_of = [&](bool autocast) {
    auto mlp = make_mlp(4);
    Accelerator acc(mp_config(autocast ? MixedPrecision::BF16 : MixedPrecision::No));
    acc.prepare_model(mlp);
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = cross_entropy(mlp->forward(data[0]), data[1]);
    }
    CHECK(loss.dtype() == kFloat32);
    acc.backward(loss);
    std::vector<Tensor> gs;
    for (auto& p : mlp->parameters()) {
      CHECK(p.dtype() == kFloat32);
      REQUIRE(p.grad().defined());
      CHECK(p.grad().dtype() == kFloat32);
      gs.push_back(p.grad().clone());
    }
    return std::make_pair(loss.item<double>(), gs);
  };
  auto [loss32, g32] = grads_of(false);
  auto [loss16, g16] = grads_of(true);
  CHECK(loss16 == doctest::Approx(loss32).epsilon(2e-2));
  CHECK(loss16 != loss32);
  REQUIRE(g16.size() == g32.size());
  for (size_t i = 0; i < g16.size(); ++i) {
    CAPTURE(i);
    CHECK(rel_max_diff(g16[i], g32[i]) < 5e-2);
    CHECK_FALSE(equal(g16[i], g32[i]));
  }
  // backward() suspends autocast: called inside the scope it gives the same gradients.
  auto mlp = make_mlp(4);
  Accelerator acc(mp_config(MixedPrecision::BF16));
  acc.prepare_model(mlp);
  {
    auto ac = acc.autocast();
    acc.backward(cross_entropy(mlp->forward(data[0]), data[1]));
  }
  std::vector<Tensor> inside;
  for (auto& p : mlp->parameters()) inside.push_back(p.grad());
  for (size_t i = 0; i < inside.size(); ++i) CHECK(equal(inside[i], g16[i]));
}

TEST_CASE("mixed_precision=bf16: a tiny MLP trains through the facade and converges") {
  auto data = make_classes(256);
  auto train = [&](MixedPrecision mp) {
    Accelerator acc(mp_config(mp));
    auto mlp = make_mlp(5);
    optim::AdamWOptions o;
    o.lr(1e-2);
    auto opt = std::make_shared<optim::AdamW>(mlp->parameters(), o);
    data::DataLoaderOptions lo;
    lo.batch_size = 32;
    lo.shuffle = true;
    lo.seed = 2;
    auto loader = std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{data[0], data[1]}), lo);
    auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
    std::vector<double> epoch_loss;
    for (int e = 0; e < 15; ++e) {
      double total = 0;
      int n = 0;
      for (auto& b : *aloader) {
        Tensor loss;
        {
          auto ac = acc.autocast();
          loss = cross_entropy(model->forward(b[0]), b[1]);
        }
        acc.backward(loss);
        aopt->step();
        aopt->zero_grad();
        total += loss.item<double>();
        ++n;
      }
      epoch_loss.push_back(total / n);
    }
    Tensor pred = argmax(model->forward(data[0]), 1);
    const double accuracy = eq(pred, data[1]).to(kFloat32).mean().item<double>();
    return std::make_pair(epoch_loss, accuracy);
  };
  auto [bf16, acc16] = train(MixedPrecision::BF16);
  auto [fp32, acc32] = train(MixedPrecision::No);
  MESSAGE("bf16 loss " << bf16.front() << " -> " << bf16.back() << ", accuracy " << acc16
                       << "; fp32 " << fp32.front() << " -> " << fp32.back() << ", " << acc32);
  CHECK(bf16.back() < 0.25 * bf16.front());
  CHECK(acc16 > 0.9);
  CHECK(std::abs(bf16.back() - fp32.back()) < 0.1);
  CHECK(bf16 != fp32);  // autocast really changed the arithmetic
}
