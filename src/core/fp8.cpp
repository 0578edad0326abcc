// Host conversions of the FP8 formats (lmscale/core/fp8.h). Written from the format definitions,
// not from the bit tricks of cuda_fp8.hpp, so the unit tests that hold them against the CUDA
// conversions compare two independent implementations.
#include "lmscale/core/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lmscale/core/error.h"

namespace lmscale {
namespace {

struct Layout {
  int mantissa_bits;   // m
  int bias;
  int min_exponent;    // of the normal numbers: 1 - bias; subnormals are k * 2^(min_exponent - m)
  int max_magnitude;   // the largest finite code without the sign bit
};
constexpr Layout layout(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Layout{3, 7, -6, 0x7E} : Layout{2, 15, -14, 0x7B};
}

constexpr std::uint8_t kNaN = 0x7F;
constexpr std::uint8_t kSign = 0x80;

}  // namespace

DType fp8_dtype(Fp8Format f) { return f == Fp8Format::e4m3 ? DType::e4m3 : DType::e5m2; }

Fp8Format fp8_format(DType t) {
  if (t == DType::e4m3) return Fp8Format::e4m3;
  if (t == DType::e5m2) return Fp8Format::e5m2;
  throw Error(std::string("expected an fp8 dtype (fp8_e4m3, fp8_e5m2), got ") + dtype_name(t));
}

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

float fp8_to_float(std::uint8_t bits, Fp8Format f) {
  const Layout l = layout(f);
  const bool negative = (bits & kSign) != 0;
  const int magnitude = bits & 0x7F;
  const int exponent = magnitude >> l.mantissa_bits;
  const int mantissa = magnitude & ((1 << l.mantissa_bits) - 1);
  float v;
  if (f == Fp8Format::e4m3 && magnitude == kNaN) return std::numeric_limits<float>::quiet_NaN();
  if (f == Fp8Format::e5m2 && exponent == 31) {
    if (mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
    v = std::numeric_limits<float>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), l.min_exponent - l.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>((1 << l.mantissa_bits) + mantissa), exponent - l.bias - l.mantissa_bits);
  }
  return negative ? -v : v;
}

std::uint8_t float_to_fp8(float x, Fp8Format f, Fp8Overflow overflow) {
  if (std::isnan(x)) return kNaN;
  const Layout l = layout(f);
  const std::uint8_t sign = std::signbit(x) ? kSign : 0;
  const auto overflowed = [&]() -> std::uint8_t {
    if (overflow == Fp8Overflow::satfinite) return static_cast<std::uint8_t>(sign | l.max_magnitude);
    return static_cast<std::uint8_t>(sign | (f == Fp8Format::e4m3 ? kNaN : 0x7C));   // NaN / inf
  };
  const float a = std::fabs(x);
  if (std::isinf(a)) return overflowed();
  if (a == 0.f) return sign;
  // a in [2^e, 2^(e+1)); below the normal range the spacing stays that of the smallest binade.
  int e2 = 0;
  std::frexp(a, &e2);
  const int e = std::max(e2 - 1, l.min_exponent);
  // a in units of the spacing 2^(e - m) of fp8 values near a: scaling by a power of two is exact.
  const float q = std::ldexp(a, l.mantissa_bits - e);
  const float floor_q = std::floor(q);
  const float rest = q - floor_q;
  long r = static_cast<long>(floor_q);
  if (rest > 0.5f || (rest == 0.5f && (r & 1) != 0)) ++r;   // to nearest, ties to even
  if (r == 0) return sign;
  const long implicit = 1L << l.mantissa_bits;
  long magnitude;
  if (r < implicit) {
    magnitude = r;   // subnormal (e == min_exponent)
  } else {
    // r in [2^m, 2^(m+1)]: 2^(m+1) carries into the next exponent with mantissa 0, which the sum does.
    magnitude = (static_cast<long>(e + l.bias) << l.mantissa_bits) + (r - implicit);
  }
  if (magnitude > l.max_magnitude) return overflowed();
  return static_cast<std::uint8_t>(sign | magnitude);
}

}  // namespace lmscale
