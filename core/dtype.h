// Element types and type promotion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "core/error.h"
#include "core/half.h"

namespace accel {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int32, Int64, UInt8, Bool };
constexpr int kNumDTypes = 8;

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kBFloat16 = DType::BFloat16;
constexpr DType kInt32 = DType::Int32;
constexpr DType kInt64 = DType::Int64;
constexpr DType kUInt8 = DType::UInt8;
constexpr DType kBool = DType::Bool;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
    case DType::Bool: return 1;
  }
  return 0;
}

// Short names as in PyTorch ("float32", "bfloat16", "int64", "bool").
std::string_view dtype_name(DType t);
// Safetensors names ("F32", "BF16", "I64", "U8", "BOOL").
std::string_view dtype_safetensors_name(DType t);
std::ostream& operator<<(std::ostream& os, DType t);

constexpr bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}
constexpr bool is_integral(DType t, bool include_bool = false) {
  return t == DType::Int32 || t == DType::Int64 || t == DType::UInt8 ||
         (include_bool && t == DType::Bool);
}

// PyTorch-style promotion for two tensors of the same category rank:
// bool < integers < floating. Within floats: f16+bf16 -> f32; otherwise the wider.
DType promote_types(DType a, DType b);

// Default floating type for ops that need a float result from integer input (mean, exp, ...).
constexpr DType kDefaultFloat = DType::Float32;
inline DType to_floating(DType t) { return is_floating(t) ? t : kDefaultFloat; }

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};

}  // namespace accel

// The dtype switch lives inside kernels:
//   ACCEL_DISPATCH_ALL(t.dtype(), "add", [&]<typename scalar_t>() { ... });
// The lambda is instantiated once per listed type.
#define ACCEL_DTYPE_CASE(enum_v, type) \
  case ::accel::DType::enum_v: return fn.template operator()<type>();

namespace accel::detail {
template <typename F>
decltype(auto) dispatch_all(DType t, const char* op, F&& fn) {
  switch (t) {
    ACCEL_DTYPE_CASE(Float32, float)
    ACCEL_DTYPE_CASE(Float64, double)
    ACCEL_DTYPE_CASE(Float16, ::accel::Half)
    ACCEL_DTYPE_CASE(BFloat16, ::accel::BFloat16)
    ACCEL_DTYPE_CASE(Int32, int32_t)
    ACCEL_DTYPE_CASE(Int64, int64_t)
    ACCEL_DTYPE_CASE(UInt8, uint8_t)
    ACCEL_DTYPE_CASE(Bool, bool)
  }
  ACCEL_THROW(DTypeError, op, "unsupported dtype ", t);
}
template <typename F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& fn) {
  switch (t) {
    ACCEL_DTYPE_CASE(Float32, float)
    ACCEL_DTYPE_CASE(Float64, double)
    ACCEL_DTYPE_CASE(Float16, ::accel::Half)
    ACCEL_DTYPE_CASE(BFloat16, ::accel::BFloat16)
    default: break;
  }
  ACCEL_THROW(DTypeError, op, "expected a floating dtype, got ", t);
}
// Numeric types excluding bool.
template <typename F>
decltype(auto) dispatch_numeric(DType t, const char* op, F&& fn) {
  switch (t) {
    ACCEL_DTYPE_CASE(Float32, float)
    ACCEL_DTYPE_CASE(Float64, double)
    ACCEL_DTYPE_CASE(Float16, ::accel::Half)
    ACCEL_DTYPE_CASE(BFloat16, ::accel::BFloat16)
    ACCEL_DTYPE_CASE(Int32, int32_t)
    ACCEL_DTYPE_CASE(Int64, int64_t)
    ACCEL_DTYPE_CASE(UInt8, uint8_t)
    default: break;
  }
  ACCEL_THROW(DTypeError, op, "dtype ", t, " is not supported");
}
template <typename F>
decltype(auto) dispatch_index(DType t, const char* op, F&& fn) {
  switch (t) {
    ACCEL_DTYPE_CASE(Int32, int32_t)
    ACCEL_DTYPE_CASE(Int64, int64_t)
    default: break;
  }
  ACCEL_THROW(DTypeError, op, "indices must be int32 or int64, got ", t);
}
}  // namespace accel::detail

#define ACCEL_DISPATCH_ALL(dtype, op, ...) ::accel::detail::dispatch_all(dtype, op, __VA_ARGS__)
#define ACCEL_DISPATCH_FLOATING(dtype, op, ...) \
  ::accel::detail::dispatch_floating(dtype, op, __VA_ARGS__)
#define ACCEL_DISPATCH_NUMERIC(dtype, op, ...) \
  ::accel::detail::dispatch_numeric(dtype, op, __VA_ARGS__)
#define ACCEL_DISPATCH_INDEX(dtype, op, ...) ::accel::detail::dispatch_index(dtype, op, __VA_ARGS__)
