// Rotary position embedding on the CPU, in place on x viewed as [B, T, H, Dh] with (b, t) rows
// row_stride elements apart (H*Dh when contiguous). The pair
// (x[2i], x[2i+1]) of the head vector at position t rotates by angle a = t * theta^(-2i/Dh):
//   x[2i]'   = x[2i] cos a - x[2i+1] sin a
//   x[2i+1]' = x[2i] sin a + x[2i+1] cos a
// inverse rotates by -a (the transpose), which is the backward. Angles, cos and sin are computed
// in double (t * theta^(-2i/Dh) reaches thousands of radians, where fp32 angles lose ~1e-4) and
// stored in the element type for the rotation.
#include <cmath>
#include <vector>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {

void rope(Context&, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride) {
  const std::int64_t half = Dh / 2;
  dispatch_real("ops::rope", x.dtype(), [&](auto tag) {
    using E = decltype(tag);
    // cos and sin tables [T, Dh/2]
    std::vector<E> cos_t(static_cast<std::size_t>(T * half)), sin_t(static_cast<std::size_t>(T * half));
    std::vector<double> inv_freq(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) {
      inv_freq[static_cast<std::size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(Dh));
    }
    const double sign = inverse ? -1.0 : 1.0;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(t) * inv_freq[static_cast<std::size_t>(i)];
        cos_t[static_cast<std::size_t>(t * half + i)] = static_cast<E>(std::cos(a));
        sin_t[static_cast<std::size_t>(t * half + i)] = static_cast<E>(sign * std::sin(a));
      }
    }
    E* p = x.data_as<E>();
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t t = 0; t < T; ++t) {
        const E* c = cos_t.data() + t * half;
        const E* s = sin_t.data() + t * half;
        for (std::int64_t h = 0; h < H; ++h) {
          E* v = p + (b * T + t) * row_stride + h * Dh;
          for (std::int64_t i = 0; i < half; ++i) {
            const E x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c[i] - x1 * s[i];
            v[2 * i + 1] = x0 * s[i] + x1 * c[i];
          }
        }
      }
    }
  });
}

}  // namespace lmscale::ops::cpu
