#include "lmscale/core/dtype.h"

#include <cmath>

#include "lmscale/core/error.h"

namespace lmscale {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::bf16: case DType::f16: case DType::u16: return 2;
    case DType::u8: case DType::e4m3: case DType::e5m2: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f64: return "fp64";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u16: return "uint16";
    case DType::u32: return "uint32";
    case DType::u8: return "uint8";
    case DType::e4m3: return "fp8_e4m3";
    case DType::e5m2: return "fp8_e5m2";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "fp32" || n == "float32" || n == "float") return DType::f32;
  if (n == "fp64" || n == "float64" || n == "double") return DType::f64;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "fp16" || n == "float16" || n == "half") return DType::f16;
  if (n == "int32" || n == "int") return DType::i32;
  if (n == "int64") return DType::i64;
  if (n == "uint16") return DType::u16;
  if (n == "uint32") return DType::u32;
  if (n == "uint8") return DType::u8;
  throw Error("unknown dtype '" + std::string(n) + "' (use fp32, fp64, bf16, fp16, int32, int64, uint16, uint32)");
}

float f16_to_float(f16_t h) {
  const std::uint32_t sign = (h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t man = h.bits & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t float_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t exp = (u >> 23) & 0xffu;
  std::uint32_t man = u & 0x7fffffu;
  if (exp == 255) return f16_t{static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0u))};
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return f16_t{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (e <= 0) {  // subnormal or zero in half
    if (e < -10) return f16_t{sign};
    man |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16_t{static_cast<std::uint16_t>(sign | half)};
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return f16_t{static_cast<std::uint16_t>(sign | half)};
}

}  // namespace lmscale
