#include "lmscale/jobs/predict/planned_device.h"

#include <fmt/format.h>

#include "lmscale/core/error.h"
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lmscale::jobs {

PlannedDevice named_planned_device(TargetDevice which) {
  constexpr double MiB = 1024.0 * 1024.0;
  switch (which) {
    case TargetDevice::h100_80gb:
      return {"NVIDIA H100 80GB HBM3", true, 81559 * MiB, "accounting.device = h100-80gb (datasheet: 80 GB HBM3)"};
    case TargetDevice::h200:
      return {"NVIDIA H200", true, 143771 * MiB, "accounting.device = h200 (datasheet: 141 GB HBM3e)"};
    case TargetDevice::cpu:
      return {"cpu", false, 0, "accounting.device = cpu"};
    case TargetDevice::automatic: break;
  }
  throw Error("named_planned_device: accounting.device = auto has no table entry (planned_device reads the GPU)");
}

PlannedDevice planned_device(const Config& resolved, ops::Runtime& rt) {
  if (resolved.accounting.device != TargetDevice::automatic)
    return named_planned_device(resolved.accounting.device);
  // auto after resolve_runtime: the GPU this process sees (without one it became h100-80gb or cpu).
  if (rt.device() != Device::cuda)
    throw Error("planned_device: accounting.device = auto but this process computes on the CPU (resolve_runtime "
                "names the device when no GPU is visible)");
  PlannedDevice t{rt.device_name(), true, 0, "accounting.device = auto: the GPU this process sees"};
#ifdef LMSCALE_WITH_CUDA
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess)
    t.memory_bytes = static_cast<double>(total);
  else
    cudaGetLastError();
#endif
  return t;
}

}  // namespace lmscale::jobs
