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

#include "core/dtype.h"

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

// Note [bf16 GEMM where it does not pay]: a bf16 matmul or convolution either runs oneDNN's bf16
// kernel (AMX tiles, or `vdpbf16ps` on AVX512-BF16) or converts its operands to float32, runs
// the float32 kernel and rounds the output once. Both accumulate in float32 and the product of
// two bf16 values is exact in float32, so the two routes differ only in summation order, like
// two blockings of the same kernel. Which is faster depends on the core, not the ISA flags: on
// some AVX512-BF16 parts (an Emerald Rapids VM measured 0.76 ns per zmm `vdpbf16ps` against
// 0.18 ns per zmm FMA) the bf16 instruction peak is half the float32 one, and oneDNN's bf16 GEMM
// runs at 0.6x of sgemm. The choice, made once per process:
//   - ACCEL_CPU_BF16_GEMM=native|f32 forces a route (tests, benches);
//   - AMX-BF16 present and enabled by the OS: native;
//   - AVX512-BF16: a ~0.2 ms probe times a zmm `vdpbf16ps` against a zmm FMA (best of several
//     alternating samples); native when the bf16 instruction delivers at least 1.3x the float32
//     FLOP rate (it does 2x the multiply-adds per instruction), else f32;
//   - neither: f32 (oneDNN would emulate bf16 on AVX-512 or refuse it on AVX2).
enum class Bf16Gemm : int { Native = 0, F32 = 1 };
Bf16Gemm bf16_gemm();
const char* bf16_gemm_name();  // "native" or "f32"
// Why the current route was chosen: "ACCEL_CPU_BF16_GEMM", "amx_bf16", "set_bf16_gemm",
// "no_avx512_bf16" or the probe's figures ("vdpbf16ps_ns:0.763,fma_ns:0.183": no spaces, so a
// bench can print it as one key=value field).
const char* bf16_gemm_reason();
// Forces a route for the rest of the process (tests, benches).
void set_bf16_gemm(Bf16Gemm route);
// Whether a GEMM or convolution with output dtype `dt` takes the float32 route because of the
// choice above (bf16 only: float16 goes there wherever oneDNN has no f16 kernel).
inline bool bf16_via_f32(DType dt) { return dt == kBFloat16 && bf16_gemm() == Bf16Gemm::F32; }

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
