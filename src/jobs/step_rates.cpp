#include "lmscale/jobs/step_rates.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lmscale::jobs {

StepRates step_rates(double tokens, double flops, double seconds, int world, double peak_flops) {
  StepRates r;
  const double ranks = std::max(1, world);
  if (!(seconds > 0)) {
    r.mfu = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  r.tokens_per_s_per_gpu = tokens / seconds / ranks;
  const double flops_per_s_per_gpu = flops / seconds / ranks;
  r.tflops_per_gpu = flops_per_s_per_gpu / 1e12;
  r.mfu = peak_flops > 0 ? flops_per_s_per_gpu / peak_flops : std::numeric_limits<double>::quiet_NaN();
  return r;
}

namespace {
double meminfo_total() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    double kib = 0;
    if (fields >> kib) return kib * 1024.0;
  }
  return 0;
}
double cgroup_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    double v = 0;
    if (in >> v && v > 0 && v < 1e18) return v;   // "max" (no limit) does not parse
  }
  return 0;
}
}  // namespace

double device_memory_bytes(ops::Runtime& rt) {
  if (rt.device() == Device::cuda) {
#ifdef LMSCALE_WITH_CUDA
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return static_cast<double>(total);
    cudaGetLastError();
#endif
    return 0;
  }
  const double host = meminfo_total(), limit = cgroup_limit();
  return limit > 0 && (host <= 0 || limit < host) ? limit : host;
}

std::string three_digits(double v) {
  if (!std::isfinite(v)) return "n/a";
  if (v == 0) return "0";
  // Fixed notation with the decimals that three significant digits need (145, 14.5, 0.0123).
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(v))));
  const int decimals = std::max(0, 2 - magnitude);
  return fmt::format("{:.{}f}", v, decimals);
}

std::string percent_or_na(double fraction) {
  return std::isfinite(fraction) ? fmt::format("{:.1f}%", 100 * fraction) : std::string("n/a");
}

std::string memory_of_device(double bytes, double device_bytes) {
  const double gib = bytes / (1024.0 * 1024.0 * 1024.0);
  return device_bytes > 0 ? fmt::format("{:.2f} GiB ({:.1f}%)", gib, 100 * bytes / device_bytes)
                          : fmt::format("{:.2f} GiB", gib);
}

}  // namespace lmscale::jobs
