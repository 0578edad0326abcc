#pragma once
// Peak dense floating-point rates of a device, for MFU (model FLOP/s / peak FLOP/s). Looked up by
// the device name CUDA reports (cudaDeviceProp::name); unknown GPUs fall back to an estimate from
// the multiprocessor count and clock with Hopper's per-SM rates, and say so (`source`).
// Table values are NVIDIA's datasheet dense (no sparsity) numbers:
//   H100 SXM / H200:  bf16 989, fp16 989, tf32 494, fp32 67 TFLOP/s
//   H100 PCIe:        bf16 756, fp16 756, tf32 378, fp32 51
//   H100 NVL:         bf16 835, fp16 835, tf32 418, fp32 60
//   A100:             bf16 312, fp16 312, tf32 156, fp32 19.5
#include <string>
#include <string_view>

#include "lmscale/core/dtype.h"

namespace lmscale::ops {

struct DevicePeak {
  std::string name;     // the table entry matched, or "estimate" / "unknown"
  double bf16 = 0, fp16 = 0, tf32 = 0, fp32 = 0;   // FLOP/s
  bool from_table = false;
  // The rate GEMMs in `dtype` run at (fp32 with tf32 allowed -> the tf32 rate). 0 when unknown.
  double flops_for(DType dtype, bool tf32_allowed) const;
};

// sm_count and clock_ghz (optional) feed the fallback estimate for names not in the table; with
// neither, an unknown device gets all-zero rates (MFU then reported as 0 / not available).
DevicePeak device_peak(std::string_view device_name, int sm_count = 0, double clock_ghz = 0);

}  // namespace lmscale::ops
