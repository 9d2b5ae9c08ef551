// The CPU pool2d kernel choice (kernels/cpu/pool.cc).
#pragma once

namespace accel::cpu {

// Which pool2d kernel the CPU runs (Note [own NCHW pooling] in pool.cc): Auto takes oneDNN's
// unless oneDNN picked a simple / reference implementation (its NCHW pooling below AVX-512), then
// accel's own; Own and OneDnn force one (tests compare the two). OneDnn still falls back to the
// own kernel for a dtype oneDNN lacks.
enum class CpuPool { Auto, Own, OneDnn };
void set_cpu_pool(CpuPool impl);
CpuPool cpu_pool();

}  // namespace accel::cpu
