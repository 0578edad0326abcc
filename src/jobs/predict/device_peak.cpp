#include "lmscale/jobs/predict/device_peak.h"

namespace lmscale::jobs {

double device_peak_flops(const std::string& name, PrecisionMode precision, bool tf32) {
  const bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  const bool a100 = name.find("A100") != std::string::npos;
  if (!hopper && !a100) return 0;
  if (precision != PrecisionMode::fp32) return hopper ? 989.4e12 : 312e12;
  if (tf32) return hopper ? 494.7e12 : 156e12;
  return hopper ? 66.9e12 : 19.5e12;
}

}  // namespace lmscale::jobs
