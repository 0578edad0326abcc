#pragma once
// The scalar rules of FP8 scaling, shared by the CPU reference (cpu/fp8.cpp) and the CUDA kernels
// (cuda/fp8.cu) so both compute the same bits: the amax of one element and the power-of-two scale
// of an amax (lmscale/ops/fp8.h, fp8_update_scale).
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LMSCALE_FP8_HD __host__ __device__ __forceinline__
#else
#define LMSCALE_FP8_HD inline
#endif

namespace lmscale::ops::fp8_rule {

// |v| as bits that order like the values (non-negative floats order as unsigned integers), with
// every NaN made the canonical quiet NaN 0x7FC00000, which orders above +inf: the maximum of these
// bits over a tensor is its amax, NaN when any element is NaN, whatever the reduction order.
LMSCALE_FP8_HD std::uint32_t abs_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  u &= 0x7FFFFFFFu;
  return u > 0x7F800000u ? 0x7FC00000u : u;
}

// The exponent k of the scale 2^k for amax a (finite, > 0): the largest k with a 2^k <= fp8_max,
// minus margin, clamped to [-126, 126] so that 2^k and 2^-k are normal floats. Exact: from the
// significands and exponents of a and fp8_max, no rounded quotient.
LMSCALE_FP8_HD int scale_exponent(float a, float fp8_max, int margin) {
  int ea = 0, ef = 0;
  const float ma = frexpf(a, &ea), mf = frexpf(fp8_max, &ef);
  int k = ef - ea - (ma > mf ? 1 : 0) - margin;
  return k < -126 ? -126 : (k > 126 ? 126 : k);
}

// 2^k for k in [-126, 126], built from its exponent bits.
LMSCALE_FP8_HD float exp2i(int k) {
  const std::uint32_t u = static_cast<std::uint32_t>(k + 127) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Whether the largest history entry (NaN skipped) yields a new scale: finite and > 0.
LMSCALE_FP8_HD bool usable_amax(float a) { return a > 0.f && a <= 3.402823466e38f; }

}  // namespace lmscale::ops::fp8_rule
