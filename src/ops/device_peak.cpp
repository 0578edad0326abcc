#include "lmscale/ops/device_peak.h"

#include <array>

namespace lmscale::ops {

namespace {

struct Entry {
  const char* key;         // substring of the CUDA device name
  const char* name;
  double bf16, tf32, fp32; // TFLOP/s dense; fp16 = bf16
};

// First match wins: more specific entries first.
constexpr std::array<Entry, 6> kTable{{
    {"GH200", "GH200", 989, 494, 67},
    {"H200", "H200", 989, 494, 67},
    {"H100 PCIe", "H100 PCIe", 756, 378, 51},
    {"H100 NVL", "H100 NVL", 835, 418, 60},
    {"H100", "H100 SXM", 989, 494, 67},   // "NVIDIA H100 80GB HBM3" is the SXM part
    {"A100", "A100", 312, 156, 19.5},
}};

}  // namespace

double DevicePeak::flops_for(DType dtype, bool tf32_allowed) const {
  switch (dtype) {
    case DType::bf16: return bf16;
    case DType::f16: return fp16;
    case DType::f32: return tf32_allowed ? tf32 : fp32;
    default: return 0;
  }
}

DevicePeak device_peak(std::string_view device_name, int sm_count, double clock_ghz) {
  DevicePeak p;
  for (const Entry& e : kTable) {
    if (device_name.find(e.key) == std::string_view::npos) continue;
    p.name = e.name;
    p.bf16 = p.fp16 = e.bf16 * 1e12;
    p.tf32 = e.tf32 * 1e12;
    p.fp32 = e.fp32 * 1e12;
    p.from_table = true;
    return p;
  }
  if (sm_count > 0 && clock_ghz > 0) {
    // Hopper per-SM, per-clock dense rates (H100 SXM: 132 SMs at 1.83 GHz boost for tensor work):
    // bf16 4096, tf32 2048, fp32 256 FLOP/clock/SM.
    const double per_clock = sm_count * clock_ghz * 1e9;
    p.name = "estimate";
    p.bf16 = p.fp16 = 4096 * per_clock;
    p.tf32 = 2048 * per_clock;
    p.fp32 = 256 * per_clock;
    return p;
  }
  p.name = "unknown";
  return p;
}

}  // namespace lmscale::ops
