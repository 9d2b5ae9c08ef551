// Compiles the kernel file named by ACCEL_ISA_SELF once per instruction-set level, each pass in
// namespace accel::cpu::ACCEL_ISA_NS. See Note [portable builds and ISA dispatch] in cpu_isa.h.
// No include guard: a kernel file includes this once, from its outer (non-pass) part.
//
// Each pass also defines ACCEL_ISA_LEVEL (0 baseline, 1 AVX2, 2 AVX-512) for `#if`s in the pass:
// GCC's C++ front end preprocesses the whole file before it parses, so `#pragma GCC target` does
// not reach the preprocessor and __AVX2__ / __AVX512F__ keep the baseline's values there.
//
// The target strings are the x86-64-v3 and x86-64-v4 feature sets without `arch=` (cpu_isa.h says
// why); cpu_isa.cc checks the same features before it picks a level.
#if !defined(ACCEL_ISA_SELF)
#error "define ACCEL_ISA_SELF (this file's include path) before including isa_foreach.h"
#endif

#if defined(ACCEL_CPU_NATIVE)
#define ACCEL_ISA_NS native
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ACCEL_ISA_LEVEL 2
#elif defined(__AVX2__) && defined(__FMA__)
#define ACCEL_ISA_LEVEL 1
#else
#define ACCEL_ISA_LEVEL 0
#endif
#include ACCEL_ISA_SELF
#undef ACCEL_ISA_LEVEL
#undef ACCEL_ISA_NS
#else
#define ACCEL_ISA_NS baseline
#define ACCEL_ISA_LEVEL 0
#include ACCEL_ISA_SELF
#undef ACCEL_ISA_LEVEL
#undef ACCEL_ISA_NS

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe")
#define ACCEL_ISA_NS avx2
#define ACCEL_ISA_LEVEL 1
#include ACCEL_ISA_SELF
#undef ACCEL_ISA_LEVEL
#undef ACCEL_ISA_NS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target( \
    "avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")
#define ACCEL_ISA_NS avx512
#define ACCEL_ISA_LEVEL 2
#include ACCEL_ISA_SELF
#undef ACCEL_ISA_LEVEL
#undef ACCEL_ISA_NS
#pragma GCC pop_options
#endif
