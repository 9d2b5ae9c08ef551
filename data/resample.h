// Internal to data/resample.cc (private header, not installed): the tap tables of one axis and
// the kernels' entry points, compiled once per instruction-set level (Note [portable builds and
// ISA dispatch] in kernels/cpu/cpu_isa.h). See Note [resize like torch 1.13] in resample.cc.
#pragma once

#include <cstdint>
#include <vector>

namespace accel::data::resample {

// How a pass sums an output's taps, each the float32 operation sequence that torch 1.13's AVX2
// kernel compiles to (Note [resize like torch 1.13]).
enum class SumKind : int {
  kLinear,     // fma(t0, w0, t1 * w1)
  kCubic,      // fma(t3, w3, fma(t2, w2, fma(t0, w0, t1 * w1)))
  kAntialias,  // t0 * w0, then the first 4 * floor((n - 1) / 4) taps added unfused, the rest fused
};

// The taps of one axis: output i reads inputs index[i * width + j] with weights
// weight[i * width + j], j < count[i]. A = float (uint8 and float32 images) or double (float64).
template <typename A>
struct Taps {
  int64_t in = 0, out = 0, width = 0;
  std::vector<int64_t> index;
  std::vector<int32_t> count;
  std::vector<A> weight;
};

// A rectangle of an image in memory: `planes` planes of h x w elements; element (k, y, x) is at
// data[k * plane + y * row + x * pix]. uint8 (H, W, C) images have plane 1 and pix C; floating
// (..., C, H, W) images plane H * W and pix 1.
template <typename T>
struct Region {
  const T* data = nullptr;
  int64_t planes = 0, h = 0, w = 0;
  int64_t plane = 0, row = 0, pix = 0;
};

template <typename T>
struct OutRegion {
  T* data = nullptr;
  int64_t planes = 0, h = 0, w = 0;
  int64_t plane = 0, row = 0, pix = 0;
};

}  // namespace accel::data::resample
