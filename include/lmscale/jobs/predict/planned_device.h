#pragma once
// The device of the run the accounting job plans (accounting.device): its name, which picks the
// peak FLOP/s (device_peak.h), its memory, against which the predicted peak is judged, and whether
// the CUDA or the CPU memory prediction applies. The accounting reads these instead of the
// machine it runs on, so a login node without a GPU plans an H200 run (issue 38).
//
// Datasheet figures (NVIDIA H100 Tensor Core GPU and H200 Tensor Core GPU datasheets): H100 SXM
// 80 GB HBM3, H200 141 GB HBM3e, both 989 TFLOP/s dense bf16. The memory used here is the total
// CUDA reports on those parts (cudaMemGetInfo, nvidia-smi): 81559 MiB and 143771 MiB.
#include <string>

#include "lmscale/io/config.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

struct PlannedDevice {
  std::string name;          // "NVIDIA H100 80GB HBM3", "NVIDIA H200", the visible GPU's, or "cpu"
  bool cuda = false;         // the CUDA memory prediction applies (else the CPU one)
  double memory_bytes = 0;   // the device's memory; 0 = not known (a CPU target)
  std::string source;        // where name and memory come from, for the header and the file
};

// The target of an accounting deck resolved by resolve_runtime: accounting.device = auto there
// means the GPU `rt` computes on (its name and total memory); h100-80gb, h200 and cpu are the
// table's entries whatever this machine has.
PlannedDevice planned_device(const Config& resolved, ops::Runtime& rt);
// The table entry of a named device (not auto).
PlannedDevice named_planned_device(TargetDevice which);

}  // namespace lmscale::jobs
