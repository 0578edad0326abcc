#pragma once
// The figures of a progress line in the habit of torchtitan (docs/metrics.md): tokens/s and model
// TFLOP/s per GPU (per rank), MFU against the device's peak, and memory as GiB and % of the
// device. train, bench-model and the metrics stream share them.
#include <string>

#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

struct StepRates {
  double tokens_per_s_per_gpu = 0;
  double tflops_per_gpu = 0;   // model FLOPs (model_dims.h) / seconds / ranks, in TFLOP/s
  double mfu = 0;              // model FLOP/s per rank / peak; NaN when the peak is unknown (CPUs)
};

// `tokens` and `flops` of the whole world over `seconds`; `peak_flops`: one device's (0 = unknown).
StepRates step_rates(double tokens, double flops, double seconds, int world, double peak_flops);

// The memory of the device this rank computes on: the GPU's total (cudaMemGetInfo), or on CPUs
// the host's MemTotal, or the cgroup's limit when that is lower. 0 when unknown.
double device_memory_bytes(ops::Runtime& rt);

// Three significant digits ("145", "0.0123"): a CPU's small rates never print as 0.0.
std::string three_digits(double v);
// "14.7%", or "n/a" when not a number.
std::string percent_or_na(double fraction);
// "22.51 GiB (23.7%)", or "22.51 GiB" when the device's memory is unknown.
std::string memory_of_device(double bytes, double device_bytes);

}  // namespace lmscale::jobs
