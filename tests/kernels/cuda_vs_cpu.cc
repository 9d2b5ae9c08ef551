// What is CUDA-specific: devices, the caching allocator, streams and events, host <-> device and
// pinned copies, device-side errors, TF32 and the 16-bit-parameter AdamW step, and two end-to-end
// checks. The per-op CUDA vs CPU comparisons live in the op table (tests/ops/, run by
// op_cross_device). Without a CUDA device the program prints why and exits with 77, which meson
// reports as SKIP. Seed: ACCEL_TEST_SEED, else random (printed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/stubs/linalg.h"
#include "kernels/stubs/nn.h"
#include "kernels/stubs/optim.h"
#include "core/generator.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/device.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::check_close;

namespace {

const Device kGPU = Device::cuda(0);

uint64_t g_seed = 0;
Generator& gen() {
  static Generator g(g_seed);
  return g;
}

// ---------------- inputs ----------------

Tensor rnd(const Shape& s, DType dt, double lo = -2.0, double hi = 2.0) {
  if (is_floating(dt)) return uniform(s, lo, hi, TensorOptions(dt), &gen());
  if (dt == kBool) return randint(0, 2, s, TensorOptions(kInt64), &gen()).to(kBool);
  return randint(int64_t(lo), int64_t(hi) + 1, s, TensorOptions(dt), &gen());
}
Tensor gpu(const Tensor& t) { return t.to(kGPU); }
Tensor empty_on(const Shape& s, DType dt, Device d) { return empty(s, TensorOptions(dt, d)); }

// ---------------- comparison ----------------

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::Float64: return {1e-10, 1e-9};
    case DType::Float32: return {1e-5, 1e-4};
    case DType::Float16: return {2e-3, 5e-3};
    case DType::BFloat16: return {1.6e-2, 1.6e-2};
    default: return {0, 0};  // integers and bool: exact
  }
}

// got (CUDA) vs want (CPU): same dtype, and check_close (Note [check_close] in
// tests/common/check.h: same shape, |got - want| <= atol + rtol |want| everywhere, NaN where the
// reference has NaN, infinities equal).
void check_device_close(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  REQUIRE_MESSAGE(got.device().is_cuda(), what);
  REQUIRE_MESSAGE(got.dtype() == want.dtype(),
                  what << ": dtype " << got.dtype() << " vs " << want.dtype());
  std::ostringstream label;
  label << what << " (cuda vs cpu, seed " << g_seed << ")";
  check_close(got, want, tol.rtol, tol.atol, label.str());
}

std::string name(const char* what, DType dt) {
  std::ostringstream os;
  os << what << " [" << dt << "]";
  return os.str();
}

// ---------------- device-side errors and CUDA-only paths ----------------

TEST_CASE(
    "device errors: undefined integer ops are DTypeErrors, bad indices and targets IndexErrors") {
  const Tensor xi = gpu(rnd({4}, kInt64, 1, 5));
  Tensor out = empty_on({4}, kInt64, kGPU);
  CHECK_THROWS_AS(unary_stub(kGPU, UnaryOp::Exp, xi, out, UnaryParams{}), DTypeError);
  const Tensor a = gpu(rnd({4}, kInt32, 1, 5));
  Tensor out32 = empty_on({4}, kInt32, kGPU);
  CHECK_THROWS_AS(binary_stub(kGPU, BinaryOp::Div, a, a, out32, 1.0), DTypeError);

  const int64_t rows = 45, classes = 1000, ignore = -100;
  // A target outside [0, C): IndexError naming the op and the value, as on the CPU.
  Tensor bad = rnd({rows}, kInt64, 0, classes - 1);
  bad.narrow(0, 17, 1).fill_(classes + 3);
  const Tensor logits = gpu(rnd({rows, classes}, kFloat32));
  Tensor l = empty_on({rows}, kFloat32, kGPU), s = empty_on({rows}, kFloat32, kGPU),
         v = empty_on({}, kFloat32, kGPU);
  try {
    cross_entropy_stub(kGPU, logits, gpu(bad), ignore, 0.0, "cross_entropy", l, s, v);
    FAIL("no IndexError for target 1003");
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[cross_entropy]") == 0);
    CHECK(msg.find("1003") != std::string::npos);
    CHECK(msg.find("position 17") != std::string::npos);
  }
  CHECK_THROWS_AS(cross_entropy(logits, gpu(bad)), IndexError);

  const Tensor w = gpu(rnd({10, 4}, kFloat32));
  const Tensor bad_idx = gpu(tensor(std::vector<int64_t>{1, 2, 10}, {3}));
  try {
    (void)embedding(w, bad_idx);
    FAIL("no IndexError for index 10");
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("10 is out of bounds") != std::string::npos);
    CHECK(msg.find("size 10") != std::string::npos);
  }
  CHECK_THROWS_AS(gather(w, 1, gpu(tensor(std::vector<int64_t>{0, 4}, {1, 2}))), IndexError);
  // Advanced indexing checks its index tensors with device ops (the CPU loops over the values):
  // the same message, the first bad value; CPU index tensors are moved to the indexed device.
  try {
    (void)index(w, {indexing::Slice(), gpu(tensor(std::vector<int64_t>{0, -5, 7, 9}, {4}))});
    FAIL("no IndexError for index -5");
  } catch (const IndexError& e) {
    CHECK(std::string(e.what()).find(
              "[index] index -5 is out of bounds for dimension 1 with size 4") == 0);
  }
  CHECK_THROWS_AS(index_put(w, {gpu(tensor(std::vector<int64_t>{10}, {1}))}, gpu(zeros({4}))),
                  IndexError);
  CHECK(equal(index(w, {tensor(std::vector<int64_t>{-1, 0}, {2})}).cpu(),
              index(w.cpu(), {tensor(std::vector<int64_t>{9, 0}, {2})})));
  CHECK_THROWS_AS(index(w.cpu(), {bad_idx}), DeviceError);  // a CUDA index for a CPU tensor
}

TEST_CASE("matmul with TF32 allowed stays within its looser bound") {
  // TF32 opt-in: f32 inputs rounded to 10-bit mantissas, so a looser bound.
  cuda::set_allow_tf32(true);
  const Tensor a = rnd({128, 256}, kFloat32, -1, 1), b = rnd({256, 64}, kFloat32, -1, 1);
  Tensor want = empty_on({128, 64}, kFloat32, kCPU), got = empty_on({128, 64}, kFloat32, kGPU);
  matmul_stub(kCPU, a, b, Tensor(), want);
  matmul_stub(kGPU, gpu(a), gpu(b), Tensor(), got);
  cuda::set_allow_tf32(false);
  check_device_close(got, want, Tol{2e-2, 1e-2}, "tf32 matmul");
}

TEST_CASE("adamw step on bf16 parameters with float32 states (a CUDA extension)") {
  // 16-bit params with float32 states (a CUDA extension): the same math as all-f32, rounded.
  Tensor p32 = rnd({4096}, kFloat32), m32 = zeros({4096}), v32 = zeros({4096});
  const Tensor g32 = rnd({4096}, kFloat32);
  Tensor pb = gpu(p32.to(kBFloat16)), mb = gpu(m32), vb = gpu(v32);
  Tensor pr = p32.to(kBFloat16).to(kFloat32);
  AdamStepParams hp;
  hp.bias_correction1 = 1 - hp.beta1;
  hp.bias_correction2 = 1 - hp.beta2;
  adamw_stub(kCPU, pr, g32.to(kBFloat16).to(kFloat32), m32, v32, hp);
  adamw_stub(kGPU, pb, gpu(g32.to(kBFloat16)), mb, vb, hp);
  check_device_close(pb, pr.to(kBFloat16), tol_for(kBFloat16), "adamw bf16 param, f32 states");
  check_device_close(mb, m32, tol_for(kFloat32), "adamw bf16 param, f32 exp_avg");
}

// ---------------- runtime: devices, memory, streams, copies ----------------

TEST_CASE("devices: count, guard, bad index is a DeviceError") {
  const int n = cuda::device_count();
  REQUIRE(n > 0);
  cuda::set_device(0);
  CHECK(cuda::current_device() == 0);
  {
    cuda::DeviceGuard g(n - 1);
    CHECK(cuda::current_device() == n - 1);
  }
  CHECK(cuda::current_device() == 0);
  CHECK_THROWS_AS(cuda::set_device(n), DeviceError);
  CHECK_THROWS_AS(zeros({2}, Device::cuda(n + 3)), DeviceError);
  try {
    cuda::check_device(Device::cuda(n), "test");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find("[test]") == 0);
  }
  CHECK(cuda::device_properties(0).multiProcessorCount > 0);
}

TEST_CASE("caching allocator: steady state reuses blocks, stats add up") {
  cuda::synchronize();
  { Tensor warm = empty({1000, 1000}, TensorOptions(kFloat32, kGPU)); }
  const AllocatorStats before = cuda::memory_stats(0);
  for (int i = 0; i < 200; ++i) {
    Tensor t = empty({1000, 1000}, TensorOptions(kFloat32, kGPU));
    Tensor u = t.mul_(2.0);
  }
  const AllocatorStats after = cuda::memory_stats(0);
  CHECK(after.alloc_count == before.alloc_count);
  CHECK(after.cache_hits >= before.cache_hits + 200);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved >= after.bytes_in_use);
  {
    Tensor big = empty({64 << 20}, TensorOptions(kUInt8, kGPU));
    CHECK(cuda::memory_stats(0).bytes_in_use >= before.bytes_in_use + (64u << 20));
  }
  const size_t reserved = cuda::memory_stats(0).bytes_reserved;
  cuda::empty_cache();
  CHECK(cuda::memory_stats(0).bytes_reserved < reserved);
  CHECK(get_allocator(kGPU)->stats().bytes_in_use == cuda::memory_stats(-1).bytes_in_use);
}

TEST_CASE("streams and events: work on a side stream, ordering through events") {
  const cuda::Stream side = cuda::new_stream(0);
  CHECK(cuda::current_stream(0).is_default());
  const Tensor x = gpu(rnd({1 << 20}, kFloat32));
  Tensor y;
  cuda::Event done(true), start(true), ready;
  ready.record(cuda::current_stream(0));  // x's upload was queued on the default stream
  ready.block(side);
  {
    cuda::StreamGuard g(side);
    CHECK(cuda::current_stream(0) == side);
    start.record();
    y = exp(x) * 2.0;  // allocated and computed on `side`
    cuda::record_stream(x, side);
    done.record();
  }
  CHECK(cuda::current_stream(0).is_default());
  done.block(cuda::current_stream(0));
  const Tensor z = y + 1.0;
  done.synchronize();
  CHECK(done.query());
  CHECK(start.elapsed_ms(done) >= 0.0f);
  check_device_close(z, exp(x.cpu()) * 2.0 + 1.0, tol_for(kFloat32), "side stream result");
}

TEST_CASE("host <-> device copies: pageable, pinned, non_blocking, between dtypes") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    const Tensor h = rnd({257, 33}, dt, 0, 100);
    const Tensor d = h.to(kGPU);
    CHECK(d.device() == kGPU);
    check_device_close(d, h, Tol{0, 0}, name("h2d2h roundtrip", dt));
    Tensor pinned = cuda::empty_pinned(h.sizes(), dt);
    CHECK(cuda::is_pinned(pinned.storage()->data()));
    pinned.copy_(d);  // D2H into pinned memory
    check_device_close(d, pinned, Tol{0, 0}, name("d2h pinned", dt));
    const Tensor back = pinned.to(kGPU, /*non_blocking=*/true);
    cuda::current_stream().synchronize();
    check_device_close(back, h, Tol{0, 0}, name("pinned h2d non_blocking", dt));
  }
  // Strided destination and converting copy across devices.
  Tensor dst = zeros({33, 257}, TensorOptions(kFloat64, kGPU));
  const Tensor src = rnd({257, 33}, kFloat32);
  Tensor dstt = dst.t();
  dstt.copy_(src);
  check_device_close(dst.t().contiguous(), src.to(kFloat64), Tol{0, 0},
                     "strided converting h2d copy_");
}

// ---------------- end to end through the ops, with backward ----------------

TEST_CASE("a small MLP: forward, loss and gradients on CUDA match the CPU") {
  const Tensor x = rnd({64, 100}, kFloat32), target = rnd({64}, kInt64, 0, 9);
  Tensor w1 = rnd({128, 100}, kFloat32, -0.1, 0.1), b1 = rnd({128}, kFloat32, -0.1, 0.1);
  Tensor w2 = rnd({10, 128}, kFloat32, -0.1, 0.1), b2 = rnd({10}, kFloat32, -0.1, 0.1);
  auto run = [&](Device d) {
    Tensor pw1 = w1.to(d).detach().requires_grad_(), pb1 = b1.to(d).detach().requires_grad_();
    Tensor pw2 = w2.to(d).detach().requires_grad_(), pb2 = b2.to(d).detach().requires_grad_();
    Tensor h = gelu(layer_norm(linear(x.to(d), pw1, pb1), {128}));
    Tensor loss = cross_entropy(linear(h, pw2, pb2), target.to(d));
    loss.backward();
    return std::vector<Tensor>{loss.detach(), pw1.grad(), pb1.grad(), pw2.grad(), pb2.grad()};
  };
  const std::vector<Tensor> c = run(kCPU), g = run(kGPU);
  const char* names[] = {"loss", "dw1", "db1", "dw2", "db2"};
  for (size_t i = 0; i < c.size(); ++i)
    check_device_close(g[i], c[i], Tol{1e-5, 1e-3}, std::string("mlp ") + names[i]);
}

TEST_CASE("a training step does no cudaMalloc once warm") {
  Tensor w = rnd({256, 256}, kFloat32, -0.05, 0.05).to(kGPU).requires_grad_();
  const Tensor x = gpu(rnd({128, 256}, kFloat32)), target = gpu(rnd({128}, kInt64, 0, 255));
  auto step = [&] {
    Tensor loss = cross_entropy(relu(matmul(x, w)), target);
    loss.backward();
    NoGradGuard ng;
    w.sub_(w.grad() * 0.1);
    w.zero_grad();
  };
  step();
  step();
  const size_t allocs = cuda::memory_stats(0).alloc_count;
  for (int i = 0; i < 5; ++i) step();
  CHECK(cuda::memory_stats(0).alloc_count == allocs);
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf(
        "SKIP cuda_vs_cpu: no CUDA device present (%s); the CUDA kernels are compiled and linked "
        "but not "
        "run\n",
        cuda::unavailable_reason().c_str());
    return 77;  // meson: skipped
  }
  const char* s = std::getenv("ACCEL_TEST_SEED");
  g_seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
  std::printf("cuda_vs_cpu: %d device(s), %s; seed %llu (ACCEL_TEST_SEED=%llu reproduces)\n",
              cuda::device_count(), cuda::device_properties(0).name, (unsigned long long)g_seed,
              (unsigned long long)g_seed);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
