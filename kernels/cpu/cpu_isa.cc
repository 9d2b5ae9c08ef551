// CPU instruction-set level for the dispatched kernels (Note [portable builds and ISA dispatch]
// in cpu_isa.h).
#include "core/env_contract.h"
#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
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

}  // namespace accel::cpu
