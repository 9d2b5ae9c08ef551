// Core: dtypes, shapes, creation, views sharing storage, broadcasting, promotion, printing, errors.
#include <doctest/doctest.h>

#include <cmath>

#include "accel.h"
#include "core/dispatch.h"
#include "tests/common/util.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::contains;
using accel::test::expect_error;

TEST_CASE("dtype sizes, names and promotion") {
  CHECK(dtype_size(kFloat32) == 4);
  CHECK(dtype_size(kBFloat16) == 2);
  CHECK(dtype_size(kBool) == 1);
  CHECK(dtype_name(kBFloat16) == "bfloat16");
  CHECK(promote_types(kInt64, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat16, kBFloat16) == kFloat32);
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kBool, kUInt8) == kUInt8);
  CHECK(promote_types(kUInt8, kInt32) == kInt32);
  CHECK(promote_types(kInt32, kInt64) == kInt64);
}

TEST_CASE("half and bfloat16 conversion") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f, 3.14159f}) {
    CHECK(float(Half(f)) == doctest::Approx(f).epsilon(1e-3));
    CHECK(float(BFloat16(f)) == doctest::Approx(f).epsilon(1e-2));
  }
  CHECK(std::isinf(float(Half(1e6f))));
  CHECK(std::isnan(float(Half(NAN))));
  CHECK(std::isnan(float(BFloat16(NAN))));
  CHECK(BFloat16(1.0f).bits == 0x3f80);
  CHECK(Half(1.0f).bits == 0x3c00);
  // Every finite half round-trips exactly through float.
  for (uint32_t b = 0; b < 0x7c00; b += 7) {
    Half h = Half::from_bits(uint16_t(b));
    CHECK(Half(float(h)).bits == h.bits);
  }
}

TEST_CASE("device parsing") {
  CHECK(Device::parse("cpu") == kCPU);
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("cuda").str() == "cuda:0");
  CHECK_THROWS_AS(Device::parse("tpu"), ValueError);
  CHECK_THROWS_AS(Device::parse("cuda:x"), ValueError);
}

TEST_CASE("creation") {
  Tensor z = zeros({2, 3});
  CHECK(z.dtype() == kFloat32);
  CHECK(z.sizes() == Shape{2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.sum().item() == 0.0);
  CHECK(ones({4}, kInt32).sum().item<int64_t>() == 4);
  CHECK(full({2, 2}, 2.5).sum().item() == 10.0);
  Tensor a = arange(5);
  CHECK(a.dtype() == kInt64);
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(0.0, 1.0, 0.25, kFloat32).numel() == 4);
  CHECK(eye(3).sum().item() == 3.0);
  CHECK(linspace(0, 1, 5).tolist() == std::vector<double>{0, 0.25, 0.5, 0.75, 1});
  Generator g1(7), g2(7);
  CHECK(equal(randn({10}, {}, &g1), randn({10}, {}, &g2)));
  Tensor r = rand({1000});
  CHECK(amax(r).item() < 1.0);
  CHECK(amin(r).item() >= 0.0);
  Tensor n = randn({20000}, kFloat64);
  CHECK(std::abs(n.mean().item()) < 0.05);
  CHECK(std::abs(var(n).item() - 1.0) < 0.05);
  Tensor p = randperm(10);
  CHECK(sum(p).item<int64_t>() == 45);
  CHECK_THROWS_AS(empty({-1, 2}), ShapeError);
  CHECK_THROWS_AS(randn({2}, kInt64), DTypeError);
  CHECK_THROWS_AS(tensor(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
}

TEST_CASE("from_blob shares memory and runs the deleter") {
  static bool deleted = false;
  float buf[6] = {0, 1, 2, 3, 4, 5};
  {
    Tensor t = from_blob(buf, {2, 3}, kFloat32, kCPU, [](void*) { deleted = true; });
    CHECK(t.select(0, 1).select(0, 2).item() == 5.0);
    buf[5] = 7;
    CHECK(t.select(0, 1).select(0, 2).item() == 7.0);
  }
  CHECK(deleted);
}

TEST_CASE("views share storage") {
  Tensor x = arange(0, 24, 1, kFloat32).reshape({2, 3, 4});
  Tensor t = x.transpose(0, 2);
  CHECK(t.sizes() == Shape{4, 3, 2});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.storage() == x.storage());
  CHECK(x.permute({2, 0, 1}).sizes() == Shape{4, 2, 3});
  Tensor s = x.select(1, 2);
  CHECK(s.sizes() == Shape{2, 4});
  CHECK(s.tolist()[0] == 8.0);
  Tensor n = x.narrow(2, 1, 2);
  CHECK(n.sizes() == Shape{2, 3, 2});
  CHECK(n.tolist()[0] == 1.0);
  Tensor sl = x.slice(2, 0, 4, 2);
  CHECK(sl.tolist()[1] == 2.0);
  CHECK(x.unsqueeze(0).sizes() == Shape{1, 2, 3, 4});
  CHECK(x.unsqueeze(-1).sizes() == Shape{2, 3, 4, 1});
  CHECK(x.unsqueeze(0).squeeze(0).sizes() == x.sizes());
  CHECK(ones({1, 3, 1}).squeeze().sizes() == Shape{3});
  Tensor e = tensor({1.f, 2.f, 3.f}).unsqueeze(1).expand({3, 4});
  CHECK(e.strides()[1] == 0);
  CHECK(e.sum().item() == 24.0);
  // Writing through a view changes the base.
  {
    NoGradGuard ng;
    x.select(0, 0).fill_(-1);
  }
  CHECK(x.sum().item() == doctest::Approx(-12 + (12 + 23) * 12 / 2.0));
  // view needs compatible strides; reshape copies when needed.
  CHECK_THROWS_AS(t.view({24}), ShapeError);
  Tensor r = t.reshape({24});
  CHECK(r.is_contiguous());
  CHECK(r.storage() != x.storage());
  CHECK(x.view({6, -1}).sizes() == Shape{6, 4});
  CHECK(x.flatten(1).sizes() == Shape{2, 12});
  CHECK_THROWS_AS(x.view({5, -1}), ShapeError);
  CHECK_THROWS_AS(x.select(0, 2), IndexError);
  CHECK_THROWS_AS(x.transpose(0, 3), IndexError);
  CHECK_THROWS_AS(x.narrow(1, 2, 2), IndexError);
  CHECK_THROWS_AS(x.expand({3, 3, 4}), ShapeError);
  CHECK_THROWS_AS(x.permute({0, 0, 1}), ValueError);
}

TEST_CASE("contiguous copies of strided views") {
  Tensor x = arange(0, 6, 1, kFloat32).reshape({2, 3});
  Tensor c = x.t().contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.tolist() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("broadcasting and promotion in binary ops") {
  Tensor a = ones({2, 3}), b = arange(0, 3, 1, kFloat32);
  Tensor c = a + b;
  CHECK(c.sizes() == Shape{2, 3});
  CHECK(c.tolist() == std::vector<double>{1, 2, 3, 1, 2, 3});
  Tensor col = tensor({10.f, 20.f}).reshape({2, 1});
  CHECK((b + col).tolist() == std::vector<double>{10, 11, 12, 20, 21, 22});
  CHECK((arange(3) + ones({3})).dtype() == kFloat32);
  CHECK((arange(3) * 2).dtype() == kInt64);
  CHECK((arange(3) * 0.5).dtype() == kFloat32);
  CHECK((arange(4) / 2).dtype() == kFloat32);
  CHECK((ones({2}, kFloat64) + ones({2}, kFloat32)).dtype() == kFloat64);
  CHECK((ones({2}, kFloat16) + ones({2}, kBFloat16)).dtype() == kFloat32);
  CHECK((ones({2}, kBFloat16) * 3).to(kFloat32).tolist() == std::vector<double>{3, 3});
  CHECK((arange(3) < 2).dtype() == kBool);
  CHECK((arange(3) < 2).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1, 0});
  try {
    (void)(ones({2, 3}) + ones({4}));
    FAIL("expected ShapeError");
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[add]") == 0);
    CHECK(msg.find("(2, 3)") != std::string::npos);
    CHECK(msg.find("(4,)") != std::string::npos);
  }
}

TEST_CASE("every dtype converts through copy") {
  const DType all[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool};
  Tensor base = tensor({0.f, 1.f, 2.f, 3.f});
  for (DType t : all) {
    Tensor x = base.to(t);
    CHECK(x.dtype() == t);
    Tensor back = x.to(kFloat64);
    if (t == kBool) {
      CHECK(back.tolist() == std::vector<double>{0, 1, 1, 1});
    } else {
      CHECK(back.tolist() == std::vector<double>{0, 1, 2, 3});
    }
  }
}

TEST_CASE("in-place ops and autograd safety") {
  Tensor x = zeros({3});
  x.add_(ones({3}), 2);
  CHECK(x.tolist() == std::vector<double>{2, 2, 2});
  x.mul_(1.5);
  CHECK(x.tolist() == std::vector<double>{3, 3, 3});
  x.clamp_(0, 1);
  CHECK(x.tolist() == std::vector<double>{1, 1, 1});
  Tensor w = ones({3}).requires_grad_();
  CHECK_THROWS_AS(w.add_(ones({3})), ValueError);
  {
    NoGradGuard ng;
    w.add_(ones({3}));
  }
  CHECK(w.tolist() == std::vector<double>{2, 2, 2});
  CHECK_THROWS_AS(x.add_(ones({4})), ShapeError);
  CHECK_THROWS_AS(arange(3).requires_grad_(), DTypeError);
}

TEST_CASE("item and printing") {
  CHECK(scalar_tensor(3.5).item() == 3.5);
  CHECK_THROWS_AS(ones({2}).item(), ShapeError);
  const std::string s = tensor({1.f, 2.f}).str();
  CHECK(s == "tensor([1.0000, 2.0000])");
  CHECK(arange(3).str() == "tensor([0, 1, 2])");
  CHECK(ones({2}, kFloat64).requires_grad_().str().find("requires_grad=True") != std::string::npos);
  const std::string big = zeros({100, 100}).str();
  CHECK(big.find("...") != std::string::npos);
  CHECK(big.size() < 2000);
}

TEST_CASE("allocator caches freed blocks") {
  Allocator* a = get_allocator(kCPU);
  { Tensor t = empty({1000}); }
  const AllocatorStats before = a->stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = empty({1000});
  }
  const AllocatorStats after = a->stats();
  CHECK(after.alloc_count == before.alloc_count);
  CHECK(after.cache_hits >= before.cache_hits + 100);
}

TEST_CASE("allocator peak bytes: raised by allocations, restarted by reset_peak_stats") {
  Allocator* a = get_allocator(kCPU);
  a->reset_peak_stats();
  const size_t base = a->stats().bytes_in_use;
  CHECK(a->stats().peak_bytes_in_use == base);
  { Tensor big = empty({1 << 20}); }  // 4 MiB, freed again
  const AllocatorStats s = a->stats();
  CHECK(s.peak_bytes_in_use >= base + (size_t(4) << 20));
  CHECK(s.bytes_in_use == base);
  a->reset_peak_stats();
  CHECK(a->stats().peak_bytes_in_use == a->stats().bytes_in_use);
}

TEST_CASE("released storage: views keep it, reads throw, materialize brings memory back") {
  Tensor t = arange(8, TensorOptions(kFloat32));
  Tensor view = t.narrow(0, 2, 4);
  Tensor saved = t.detach();
  const StoragePtr& st = t.storage();
  CHECK(st->allocated());
  const size_t in_use = get_allocator(kCPU)->stats().bytes_in_use;
  st->release();
  CHECK_FALSE(st->allocated());
  CHECK(get_allocator(kCPU)->stats().bytes_in_use < in_use);
  CHECK(t.sizes() == Shape{8});
  CHECK_THROWS_WITH_AS(view.sum(), doctest::Contains("not allocated"), ValueError);
  CHECK_THROWS_AS(saved.narrow(0, 0, 1).item<float>(), ValueError);
  st->release();  // twice is harmless
  st->materialize();
  CHECK(st->allocated());
  t.fill_(3.0);
  CHECK(view.sum().item<float>() == 12.0f);
  CHECK(saved.narrow(0, 7, 1).item<float>() == 3.0f);
  float host[4] = {1, 2, 3, 4};
  Tensor borrowed = from_blob(host, {4}, kFloat32);
  CHECK_THROWS_AS(borrowed.storage()->release(), ValueError);
}

TEST_CASE("a CUDA tensor without a CUDA device is a DeviceError") {
  bool have_cuda = true;
  try {
    (void)get_allocator(Device::cuda(0));
  } catch (const DeviceError&) {
    have_cuda = false;
  }
  if (have_cuda) {
    MESSAGE("CUDA allocator present: skipping the no-device check");
    return;
  }
  CHECK_THROWS_AS(zeros({2}, Device::cuda(0)), DeviceError);
  CHECK_THROWS_AS(ones({2}).to(Device::cuda(0)), DeviceError);
}

TEST_CASE("float32 elementwise math matches the float64 reference") {
  // The float paths use vectorised exp/erf (kernels/cpu/vec_math.h); float64 uses libm.
  Generator g(11);
  Tensor x = mul(randn({4096}, {}, &g), 4.0);
  Tensor xd = x.to(kFloat64);
  auto max_err = [](const Tensor& a, const Tensor& ref, bool relative) {
    Tensor d = abs(sub(a.to(kFloat64), ref));
    if (relative) d = div(d, add(abs(ref), 1e-30));
    return amax(d).item();
  };
  CHECK(max_err(exp(x), exp(xd), true) < 2e-7);
  CHECK(max_err(erf(x), erf(xd), false) < 1e-6);
  CHECK(max_err(gelu(x), gelu(xd), false) < 2e-6);
  CHECK(max_err(sigmoid(x), sigmoid(xd), false) < 1e-6);
  CHECK(max_err(silu(x), silu(xd), false) < 4e-6);
  // Special values.
  Tensor sp = tensor({-INFINITY, INFINITY, NAN, 0.f, -100.f, 100.f});
  std::vector<double> e = exp(sp).tolist();
  CHECK(e[0] == 0.0);
  CHECK(std::isinf(e[1]));
  CHECK(std::isnan(e[2]));
  CHECK(e[3] == 1.0);
  CHECK(e[4] == 0.0);
  CHECK(std::isinf(e[5]));
  std::vector<double> er = erf(sp).tolist();
  CHECK(er[0] == -1.0);
  CHECK(er[1] == 1.0);
  CHECK(std::isnan(er[2]));
  CHECK(er[3] == 0.0);
  // The GELU backward kernel too.
  Tensor xf = x.detach().requires_grad_(), xg = xd.detach().requires_grad_();
  gelu(xf).sum().backward();
  gelu(xg).sum().backward();
  CHECK(max_err(xf.grad(), xg.grad(), false) < 4e-6);
}

TEST_CASE("creation checks its size arithmetic: overflow is a ShapeError naming the op and shape") {
  // 65536^4 = 2^64 elements wrapped to 0: a "tensor" of 2^64 elements over 0 bytes.
  const Shape wraps{65536, 65536, 65536, 65536};
  std::string m = expect_error<ShapeError>([&] { empty(wraps); });
  CHECK(contains(m, "[empty]"));
  CHECK(contains(m, "(65536, 65536, 65536, 65536)"));
  CHECK(contains(expect_error<ShapeError>([&] { zeros(wraps); }), "[zeros]"));
  CHECK(contains(expect_error<ShapeError>([&] { ones(wraps); }), "[ones]"));
  CHECK(contains(expect_error<ShapeError>([&] { full(wraps, 2.0); }), "[full]"));
  CHECK(contains(expect_error<ShapeError>([&] { randn(wraps); }), "[randn]"));
  CHECK(contains(expect_error<ShapeError>([&] { eye(int64_t(1) << 32); }), "[eye]"));
  // Element count fits, byte count does not: 2^61 float64 = 2^64 bytes.
  m = expect_error<ShapeError>([&] { empty({int64_t(1) << 61}, kFloat64); });
  CHECK(contains(m, "[empty]"));
  CHECK(contains(m, "bytes"));
  // Borrowed memory and explicit strides.
  float buf[4] = {};
  CHECK(contains(expect_error<ShapeError>([&] {
                   from_blob(buf, {int64_t(1) << 40, int64_t(1) << 40}, kFloat32);
                 }),
                 "[from_blob]"));
  CHECK(contains(expect_error<ShapeError>([&] {
                   from_blob(buf, {2, 2}, {INT64_MAX, 1}, kFloat32);
                 }),
                 "[from_blob]"));
  CHECK(contains(expect_error<ShapeError>([&] {
                   empty_strided({3, 2}, {INT64_MAX / 2, 1});
                 }),
                 "[empty_strided]"));
  CHECK(
      contains(expect_error<ShapeError>([&] { tensor(std::vector<float>{}, wraps); }), "[tensor]"));
  // A view of an empty tensor whose target shape wraps to 0 elements.
  Tensor e = zeros({0});
  CHECK(contains(expect_error<ShapeError>([&] { e.view({int64_t(1) << 62, 4}); }), "[view]"));
  CHECK(contains(expect_error<ShapeError>([&] { e.reshape({int64_t(1) << 62, 4}); }), "[reshape]"));
  // arange with a count beyond int64: the double-to-int64 conversion was undefined.
  CHECK_THROWS_AS(arange(0.0, 1e300, 1.0), ValueError);
  // Negative dimensions are still ShapeErrors; zero dimensions make empty tensors whatever the
  // other dimensions are.
  CHECK(contains(expect_error<ShapeError>([&] { zeros({2, -1}); }), "negative"));
  CHECK(empty({0, int64_t(1) << 40, int64_t(1) << 20}).numel() == 0);
  CHECK(e.view({int64_t(1) << 40, 0, int64_t(1) << 20}).numel() == 0);
}

TEST_CASE("dispatch: kernel registrations are logged and a recorder sees the stubs called") {
  auto regs = registered_kernels();
  auto has_reg = [&](const char* stub) {
    for (auto& r : regs)
      if (r.stub == stub && r.device == DeviceType::CPU) return true;
    return false;
  };
  CHECK(has_reg("copy_stub"));
  CHECK(has_reg("binary_stub"));
  CHECK(has_reg("matmul_stub"));
  CHECK_FALSE(has_reg("no_such_stub"));

  Tensor a = ones({2, 3});
  std::vector<std::pair<std::string, DeviceType>> calls;
  {
    StubCallRecorder rec;
    CHECK_THROWS_AS(StubCallRecorder(), Error);  // one at a time
    Tensor b = matmul(a, a.t());
    calls = rec.calls();
  }
  auto called = [&](const char* stub) {
    for (auto& c : calls)
      if (c.first == stub && c.second == DeviceType::CPU) return true;
    return false;
  };
  CHECK(called("matmul_stub"));
  CHECK_FALSE(called("softmax_stub"));
  // Nothing is recorded once the recorder is gone, and a new one starts empty.
  softmax(a, -1);
  StubCallRecorder again;
  CHECK(again.calls().empty());
}
