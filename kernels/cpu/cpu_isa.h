// Run-time choice of the instruction set for accel's own CPU kernels.
//
// Note [portable builds and ISA dispatch]: the default build targets x86-64-v2 (SSE4.2 and
// POPCNT, every x86-64 CPU since 2009; oneDNN needs SSE4.1 anyway and dispatches its own JIT
// kernels), so one library runs on any such machine. The hot kernel files (unary, binary,
// reductions, softmax, norms, losses, the fused AdamW step) are compiled three times in the same
// translation unit through kernels/cpu/isa_foreach.h: baseline, AVX2+FMA (x86-64-v3) and AVX-512
// (x86-64-v4), each pass in its own namespace under `#pragma GCC target`. Registered kernels are
// thin dispatchers (ACCEL_ISA_DISPATCH) that call the variant of the level picked once at start-up
// (the best the CPU and OS support, or ACCEL_CPU_ISA=baseline|avx2|avx512 to force a lower one).
// Only ISA flags are raised, never `arch=`: GCC refuses to inline a baseline function (cast<>,
// Tensor accessors) into one with another arch, and the loops would stop vectorising.
// With -Dnative=true every kernel is compiled once for the host and the level reads "native".
#pragma once

#include <atomic>

namespace accel::cpu {

enum class CpuIsa : int { Baseline = 0, Avx2 = 1, Avx512 = 2, Native = 3 };

// The level the dispatchers use now. The first call reads ACCEL_CPU_ISA and the CPU's features.
CpuIsa cpu_isa();
// "baseline", "avx2", "avx512" or "native".
const char* cpu_isa_name();
const char* cpu_isa_name(CpuIsa isa);
// The best level this CPU (and the build) can run.
CpuIsa cpu_isa_best();
// Forces a level for the rest of the process (tests, benches). Throws ValueError for a level the
// CPU cannot run, or for a non-native level in a -Dnative=true build.
void set_cpu_isa(CpuIsa isa);
// The level the kernel variant that the dispatcher picks now was compiled for (reported by the
// variant itself, from the compiler's ISA macros): tests check it equals cpu_isa().
const char* cpu_isa_kernel_probe();

namespace detail {
extern std::atomic<int> g_cpu_isa;  // -1 until the first cpu_isa()
CpuIsa init_cpu_isa();
}  // namespace detail

inline CpuIsa current_isa() {
  const int v = detail::g_cpu_isa.load(std::memory_order_relaxed);
  return v >= 0 ? CpuIsa(v) : detail::init_cpu_isa();
}

// Dispatcher for a kernel compiled in every pass: calls baseline::fn, avx2::fn or avx512::fn.
template <auto B, auto V3, auto V4, typename R, typename... A>
R isa_call(A... a) {
  switch (current_isa()) {
    case CpuIsa::Avx512: return V4(static_cast<A>(a)...);
    case CpuIsa::Avx2: return V3(static_cast<A>(a)...);
    default: return B(static_cast<A>(a)...);
  }
}
template <auto B, auto V3, auto V4, typename R, typename... A>
constexpr auto isa_pick(R (*)(A...)) {
  return &isa_call<B, V3, V4, R, A...>;
}

}  // namespace accel::cpu

#if defined(ACCEL_CPU_NATIVE)
#define ACCEL_ISA_DISPATCH(fn) (&::accel::cpu::native::fn)
#else
#define ACCEL_ISA_DISPATCH(fn)                                                  \
  (::accel::cpu::isa_pick<&::accel::cpu::baseline::fn, &::accel::cpu::avx2::fn, \
                          &::accel::cpu::avx512::fn>(&::accel::cpu::baseline::fn))
#endif
