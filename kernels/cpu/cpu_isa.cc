// CPU instruction-set level for the dispatched kernels (Note [portable builds and ISA dispatch]
// in cpu_isa.h).
#include "core/env_contract.h"
#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"

namespace accel::cpu {
namespace detail {
std::atomic<int> g_cpu_isa{-1};
}  // namespace detail

namespace {

constexpr const char* kIsaEnv = env::kCpuIsa;

CpuIsa detect_best() {
#if defined(ACCEL_CPU_NATIVE)
  return CpuIsa::Native;
#else
  // __builtin_cpu_supports checks the OS enables the wide registers too (XCR0), not only CPUID.
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("lzcnt") &&
                  __builtin_cpu_supports("movbe");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  return v4 ? CpuIsa::Avx512 : v3 ? CpuIsa::Avx2 : CpuIsa::Baseline;
#endif
}

CpuIsa parse_isa(const std::string& s) {
  if (s == "baseline") return CpuIsa::Baseline;
  if (s == "avx2") return CpuIsa::Avx2;
  if (s == "avx512") return CpuIsa::Avx512;
  if (s == "native") return CpuIsa::Native;
  ACCEL_THROW(ValueError, "cpu_isa", kIsaEnv, "=", s, " is not one of baseline, avx2, avx512");
}

void check_runnable(CpuIsa isa, const char* source) {
  const CpuIsa best = cpu_isa_best();
  if (best == CpuIsa::Native) {
    ACCEL_CHECK(
        isa == CpuIsa::Native, ValueError, "cpu_isa", source, " asks for ", cpu_isa_name(isa),
        " but this library was built with -Dnative=true: its kernels exist only for the host CPU");
    return;
  }
  ACCEL_CHECK(isa != CpuIsa::Native, ValueError, "cpu_isa", source,
              " asks for native kernels but this library is a portable build (use baseline, avx2 "
              "or avx512)");
  ACCEL_CHECK(int(isa) <= int(best), ValueError, "cpu_isa", source, " asks for ", cpu_isa_name(isa),
              " but this CPU supports at most ", cpu_isa_name(best));
}

}  // namespace

namespace detail {
CpuIsa init_cpu_isa() {
  CpuIsa isa = cpu_isa_best();
  if (const char* e = std::getenv(kIsaEnv); e != nullptr && *e != '\0') {
    isa = parse_isa(e);
    check_runnable(isa, kIsaEnv);
  }
  int expected = -1;
  // A concurrent first call or set_cpu_isa may have won; keep theirs.
  g_cpu_isa.compare_exchange_strong(expected, int(isa), std::memory_order_relaxed);
  return CpuIsa(g_cpu_isa.load(std::memory_order_relaxed));
}
}  // namespace detail

CpuIsa cpu_isa() { return current_isa(); }

CpuIsa cpu_isa_best() {
  static const CpuIsa best = detect_best();
  return best;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Baseline: return "baseline";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Native: return "native";
  }
  return "unknown";
}

const char* cpu_isa_name() { return cpu_isa_name(cpu_isa()); }

void set_cpu_isa(CpuIsa isa) {
  check_runnable(isa, "set_cpu_isa");
  detail::g_cpu_isa.store(int(isa), std::memory_order_relaxed);
}

// ---------------- bf16 GEMM route (Note [bf16 GEMM where it does not pay]) ----------------

namespace {

// CPUID says AMX-BF16 and the OS saves the tile state (XCR0 bits 17-18); oneDNN asks Linux for
// the permission itself.
bool amx_bf16_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1u)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x60000u) == 0x60000u;
}

// 12 independent accumulators, so the loop measures issue throughput, not latency.
#define ACCEL_X12(op)                                                    \
  op " %%zmm0, %%zmm1, %%zmm4\n\t" op " %%zmm0, %%zmm1, %%zmm5\n\t" op   \
     " %%zmm0, %%zmm1, %%zmm6\n\t" op " %%zmm0, %%zmm1, %%zmm7\n\t" op   \
     " %%zmm0, %%zmm1, %%zmm8\n\t" op " %%zmm0, %%zmm1, %%zmm9\n\t" op   \
     " %%zmm0, %%zmm1, %%zmm10\n\t" op " %%zmm0, %%zmm1, %%zmm11\n\t" op \
     " %%zmm0, %%zmm1, %%zmm12\n\t" op " %%zmm0, %%zmm1, %%zmm13\n\t" op \
     " %%zmm0, %%zmm1, %%zmm14\n\t" op " %%zmm0, %%zmm1, %%zmm15\n\t"
#define ACCEL_ZCLOBBER                                                                       \
  "xmm0", "xmm1", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15"

// Nanoseconds per instruction over `iters` x 12 zmm `vdpbf16ps` (bf16) or `vfmadd231ps`
// (zeroed operands: no denormals). Called only where the CPU has AVX512-BF16.
__attribute__((target("avx512f,avx512bf16"), noinline)) double time_zmm(bool bf16, int iters) {
  const auto t0 = std::chrono::steady_clock::now();
  __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1" ::
                       : ACCEL_ZCLOBBER);
  if (bf16) {
    for (int i = 0; i < iters; ++i) __asm__ volatile(ACCEL_X12("vdpbf16ps")::: ACCEL_ZCLOBBER);
  } else {
    for (int i = 0; i < iters; ++i) __asm__ volatile(ACCEL_X12("vfmadd231ps")::: ACCEL_ZCLOBBER);
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (12.0 * iters);
}
#undef ACCEL_X12
#undef ACCEL_ZCLOBBER

struct Bf16Choice {
  Bf16Gemm route = Bf16Gemm::F32;
  char reason[96] = {};
};

std::mutex g_bf16_mu;
std::atomic<int> g_bf16_route{-1};
Bf16Choice g_bf16_choice;  // guarded by g_bf16_mu once g_bf16_route is set

Bf16Choice decide_bf16() {
  Bf16Choice c;
  auto say = [&](Bf16Gemm r, const char* why) {
    c.route = r;
    std::snprintf(c.reason, sizeof c.reason, "%s", why);
    return c;
  };
  if (const char* e = std::getenv(env::kCpuBf16Gemm); e != nullptr && *e != '\0') {
    const std::string v = e;
    if (v == "native") return say(Bf16Gemm::Native, env::kCpuBf16Gemm);
    if (v == "f32") return say(Bf16Gemm::F32, env::kCpuBf16Gemm);
    ACCEL_CHECK(v == "auto", ValueError, "bf16_gemm", env::kCpuBf16Gemm, "=", v,
                " is not one of auto, native, f32");
  }
  if (amx_bf16_usable()) return say(Bf16Gemm::Native, "amx_bf16");
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512f"))
    return say(Bf16Gemm::F32, "no_avx512_bf16");
  // Alternate short samples and keep each one's best: a preempted sample only ever reads slow.
  double dp = 1e30, fm = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    dp = std::min(dp, time_zmm(true, 1500));
    fm = std::min(fm, time_zmm(false, 1500));
  }
  // vdpbf16ps does two multiply-adds per float32 lane, an FMA one.
  c.route = 2.0 * fm / dp >= 1.3 ? Bf16Gemm::Native : Bf16Gemm::F32;
  std::snprintf(c.reason, sizeof c.reason, "vdpbf16ps_ns:%.3f,fma_ns:%.3f", dp, fm);
  return c;
}

void ensure_bf16_choice() {
  if (g_bf16_route.load(std::memory_order_acquire) >= 0) return;
  std::lock_guard<std::mutex> lock(g_bf16_mu);
  if (g_bf16_route.load(std::memory_order_relaxed) >= 0) return;
  g_bf16_choice = decide_bf16();
  g_bf16_route.store(int(g_bf16_choice.route), std::memory_order_release);
}

}  // namespace

Bf16Gemm bf16_gemm() {
  const int v = g_bf16_route.load(std::memory_order_acquire);
  if (v >= 0) return Bf16Gemm(v);
  ensure_bf16_choice();
  return Bf16Gemm(g_bf16_route.load(std::memory_order_acquire));
}

const char* bf16_gemm_name() { return bf16_gemm() == Bf16Gemm::Native ? "native" : "f32"; }

const char* bf16_gemm_reason() {
  ensure_bf16_choice();
  std::lock_guard<std::mutex> lock(g_bf16_mu);
  return g_bf16_choice.reason;
}

void set_bf16_gemm(Bf16Gemm route) {
  ensure_bf16_choice();
  std::lock_guard<std::mutex> lock(g_bf16_mu);
  g_bf16_choice.route = route;
  std::snprintf(g_bf16_choice.reason, sizeof g_bf16_choice.reason, "set_bf16_gemm");
  g_bf16_route.store(int(route), std::memory_order_release);
}

}  // namespace accel::cpu
