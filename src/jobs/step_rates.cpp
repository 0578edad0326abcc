#include "lmscale/jobs/step_rates.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "lmscale/core/host_memory.h"
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


double device_memory_bytes(ops::Runtime& rt) {
  if (rt.device() == Device::cuda) {
#ifdef LMSCALE_WITH_CUDA
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return static_cast<double>(total);
    cudaGetLastError();
#endif
    return 0;
  }
  const double host = meminfo_bytes("MemTotal").value_or(0);
  const auto cgroup = cgroup_memory();
  return cgroup && (host <= 0 || cgroup->limit < host) ? cgroup->limit : host;
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
