#include "lmscale/core/timer.h"

#include <algorithm>
#include <cmath>

namespace lmscale {

Stats summarize(std::vector<double> v) {
  Stats s;
  s.count = static_cast<long>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(n));
  return s;
}

}  // namespace lmscale
