// 16-bit floating point storage types. Arithmetic happens in float; these only convert.
#pragma once

#include <cstdint>
#include <cstring>

namespace accel {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float
  operator float() const { return bits_float(uint32_t(bits) << 16); }
  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    // Round to nearest even.
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
  }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const { return to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  static float to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss_wrapper(h);
#else
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
      if (man == 0) {
        out = sign;
      } else {  // subnormal: normalise
        exp = 127 - 15 + 1;
        while ((man & 0x400u) == 0) {
          man <<= 1;
          --exp;
        }
        man &= 0x3ffu;
        out = sign | (exp << 23) | (man << 13);
      }
    } else if (exp == 0x1f) {
      out = sign | 0x7f800000u | (man << 13);
    } else {
      out = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return bits_float(out);
#endif
  }
  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf (rounds up)
    if (absu < 0x38800000u) {                                  // subnormal or zero in half
      if (absu < 0x33000000u) return uint16_t(sign);           // < 2^-25 rounds to 0
      uint32_t exp = absu >> 23;
      uint32_t man = (absu & 0x7fffffu) | 0x800000u;
      uint32_t shift = 126 - exp;  // 14 + (113 - exp) ... amount to shift mantissa into place
      // value = man * 2^(exp-150); half subnormal unit = 2^-24 -> shift = 150-24-exp = 126-exp
      uint32_t half_man = man >> shift;
      uint32_t rem = man & ((1u << shift) - 1);
      uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half_man & 1u))) ++half_man;
      return uint16_t(sign | half_man);
    }
    uint32_t exp = (absu >> 23) - 127 + 15;
    uint32_t man = absu & 0x7fffffu;
    uint32_t half = (exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: fine
    return uint16_t(sign | half);
  }

 private:
#if defined(__F16C__)
  static float _cvtsh_ss_wrapper(uint16_t h);
#endif
};

}  // namespace accel

#if defined(__F16C__)
#include <immintrin.h>
inline float accel::Half::_cvtsh_ss_wrapper(uint16_t h) { return _cvtsh_ss(h); }
#endif
