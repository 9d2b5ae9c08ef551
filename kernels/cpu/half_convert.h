// Vectorised float32 <-> bfloat16 / float16 conversion of contiguous runs, on the calling thread
// (Note [vectorised bf16 casts] in elementwise_copy.cc): the best variant the CPU runs, picked
// once.
#pragma once

#include <cstdint>

namespace accel::cpu {

// d[i] = bf16(s[i]), round to nearest even (NaN stays NaN).
void f32_to_bf16(const float* s, uint16_t* d, int64_t n);
// d[i] = float(s[i]) (exact).
void bf16_to_f32(const uint16_t* s, float* d, int64_t n);
// d[i] = half(s[i]), round to nearest even, overflow to inf, subnormals kept (NaN stays NaN).
void f32_to_f16(const float* s, uint16_t* d, int64_t n);
// d[i] = float(s[i]) (exact).
void f16_to_f32(const uint16_t* s, float* d, int64_t n);
// d[i] = float(bf16(s[i])) / float(half(s[i])): the down conversion then the up one, same bits,
// in one pass (s == d allowed).
void round_to_bf16(const float* s, float* d, int64_t n);
void round_to_f16(const float* s, float* d, int64_t n);

}  // namespace accel::cpu
