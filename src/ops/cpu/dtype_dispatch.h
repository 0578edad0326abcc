#pragma once
// Runtime dtype -> C++ element type for the CPU kernels.
// - dispatch_real: fp32 -> float, fp64 -> double; anything else is an error that says mixed
//   precision (bf16/fp16) is CUDA-only. Used by the math ops.
// - dispatch_floating: also bf16 -> bf16_t and fp16 -> f16_t, for the data movers; load/store
//   below convert those through float (16-bit values are exact in float) or, from double, with
//   one correct rounding.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "lmscale/core/dtype.h"
#include "lmscale/core/error.h"

namespace lmscale::ops::cpu {

template <class F>
decltype(auto) dispatch_real(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    default:
      throw Error(fmt::format("{}: the CPU implementation supports fp32 and fp64, got {} (bf16/fp16 mixed precision "
                              "runs on CUDA only)",
                              op, dtype_name(t)));
  }
}

template <class F>
decltype(auto) dispatch_floating(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16_t{});
    case DType::f16: return f(f16_t{});
    default:
      throw Error(fmt::format("{}: expected a floating dtype (fp32, fp64, bf16, fp16), got {}", op, dtype_name(t)));
  }
}

// Rounds double to float toward zero and sets the lowest significand bit when inexact ("round to
// odd"). Rounding that float to nearest-even in a format with at least two fewer significand bits
// (bf16: 8, fp16: 11, float: 24) then equals rounding the double directly: no double rounding.
inline float double_to_float_round_odd(double d) {
  const float f = static_cast<float>(d);   // round to nearest even
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;   // rounded away from zero: step back (sign-magnitude)
  u |= 1u;
  return std::bit_cast<float>(u);
}

// Element loads (to the compute type) and stores (from it) for every floating element type.
template <class T>
inline double load_f64(T x) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_to_float(x);
  else if constexpr (std::is_same_v<T, f16_t>) return f16_to_float(x);
  else return static_cast<double>(x);
}
template <class T>
inline float load_f32(T x) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_to_float(x);
  else if constexpr (std::is_same_v<T, f16_t>) return f16_to_float(x);
  else return static_cast<float>(x);
}
// Stores a float with one round-to-nearest-even.
template <class T>
inline T store_from_f32(float x) {
  if constexpr (std::is_same_v<T, bf16_t>) return float_to_bf16(x);
  else if constexpr (std::is_same_v<T, f16_t>) return float_to_f16(x);
  else return static_cast<T>(x);
}
// Stores a double with one round-to-nearest-even (16-bit formats via round-to-odd float).
template <class T>
inline T store_from_f64(double x) {
  if constexpr (std::is_same_v<T, bf16_t>) return float_to_bf16(double_to_float_round_odd(x));
  else if constexpr (std::is_same_v<T, f16_t>) return float_to_f16(double_to_float_round_odd(x));
  else return static_cast<T>(x);
}

// The arithmetic type used for an element type: 16-bit formats compute in float.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
inline compute_t<T> load(T x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return load_f32(x);
}
template <class T>
inline T store(compute_t<T> x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return store_from_f32<T>(x);
}

}  // namespace lmscale::ops::cpu
