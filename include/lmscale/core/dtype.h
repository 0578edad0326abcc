#pragma once
// Element types of tensors and host-side conversions for the 16-bit float formats (the 8-bit
// ones are in fp8.h).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lmscale {

// e4m3, e5m2: the 8-bit float formats of FP8 GEMM operands (lmscale/core/fp8.h). They are storage
// types only: is_floating() is false for them, so the general ops refuse them; the FP8 ops
// (lmscale/ops/fp8.h) read and write them.
enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, u16, u32, u8, e4m3, e5m2 };

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);   // "fp32", "fp64", "bf16", "fp16", "int32", ..., "fp8_e4m3", "fp8_e5m2"
// Parses the names above (and "float32", "float64", "bfloat16", "float16", "int"); throws on others.
DType parse_dtype(std::string_view name);
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }

// bfloat16 stored as its 16 bits; conversion from float rounds to nearest even (NaN kept quiet).
struct bf16_t {
  std::uint16_t bits = 0;
};
// IEEE half stored as its 16 bits.
struct f16_t {
  std::uint16_t bits = 0;
};

inline float bf16_to_float(bf16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return bf16_t{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<std::uint16_t>(u >> 16)};
}
float f16_to_float(f16_t h);
f16_t float_to_f16(float f);   // round to nearest even, overflow to inf

}  // namespace lmscale
