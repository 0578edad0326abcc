#pragma once
// The two 8-bit float formats of FP8 training (docs/precision.md), stored as their 8 bits, and their
// exact host conversions. The bit layouts are those of the OCP FP8 specification that Hopper's
// tensor cores read (CUDA_R_8F_E4M3, CUDA_R_8F_E5M2):
//
//   e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; S.1111.111 is NaN, so
//         the largest finite value is S.1111.110 = 448. Smallest subnormal 2^-9.
//   e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is inf,
//         S.11111.xx (xx != 0) NaN; largest finite 57344, smallest subnormal 2^-16.
//
// float -> fp8 rounds to nearest, ties to even, as __nv_cvt_float_to_fp8 documents
// (cuda_fp8.h). Out-of-range values follow its two saturation modes:
//   Fp8Overflow::satfinite (the cast used in training): |x| beyond the largest finite value,
//     infinities included, becomes the largest finite value of the same sign (448, 57344);
//   Fp8Overflow::nosat: it becomes NaN (e4m3, which has no inf) or inf (e5m2).
// "Beyond" means rounding would leave the finite range: 448 < |x| < 464 still rounds to 448 in
// e4m3 (464 is the midpoint to the next, non-existent, value; it ties to the even 448), and in
// e5m2 |x| >= 61440 overflows. Every NaN input becomes the code 0x7F (positive quiet NaN; the sign
// of a NaN is not kept, as the CUDA conversion does not keep it). Zero keeps its sign; values at
// or below half the smallest subnormal round to a signed zero.
#include <cstdint>

#include "lmscale/core/dtype.h"

namespace lmscale {

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };
enum class Fp8Overflow : std::uint8_t { satfinite, nosat };

struct fp8_e4m3_t {
  std::uint8_t bits = 0;
};
struct fp8_e5m2_t {
  std::uint8_t bits = 0;
};

// The largest finite value of each format: 448 (e4m3), 57344 (e5m2).
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.f : 57344.f; }
// The DType of a format's tensors (DType::e4m3, DType::e5m2), and back (throws for others).
DType fp8_dtype(Fp8Format f);
Fp8Format fp8_format(DType t);
const char* fp8_format_name(Fp8Format f);   // "e4m3", "e5m2"

// The value of a code (exact: every fp8 value is a float). NaN codes give a quiet NaN.
float fp8_to_float(std::uint8_t bits, Fp8Format f);
// The code of x, rounded to nearest even, out-of-range values as `overflow` says.
std::uint8_t float_to_fp8(float x, Fp8Format f, Fp8Overflow overflow = Fp8Overflow::satfinite);

inline float e4m3_to_float(fp8_e4m3_t x) { return fp8_to_float(x.bits, Fp8Format::e4m3); }
inline float e5m2_to_float(fp8_e5m2_t x) { return fp8_to_float(x.bits, Fp8Format::e5m2); }
inline fp8_e4m3_t float_to_e4m3(float x, Fp8Overflow o = Fp8Overflow::satfinite) {
  return fp8_e4m3_t{float_to_fp8(x, Fp8Format::e4m3, o)};
}
inline fp8_e5m2_t float_to_e5m2(float x, Fp8Overflow o = Fp8Overflow::satfinite) {
  return fp8_e5m2_t{float_to_fp8(x, Fp8Format::e5m2, o)};
}

}  // namespace lmscale
