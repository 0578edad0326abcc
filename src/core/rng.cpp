#include "lmscale/core/rng.h"

#include <cmath>

namespace lmscale {

std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double CounterRng::normal(std::uint64_t index, std::uint32_t draw) const {
  const double u1 = uniform(index, 2 * draw);
  const double u2 = uniform(index, 2 * draw + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double CounterRng::truncated_normal(std::uint64_t index, double std, double clip) const {
  for (std::uint32_t d = 0;; ++d) {
    const double z = normal(index, d);
    if (std::fabs(z) <= clip) return z * std;
  }
}

}  // namespace lmscale
