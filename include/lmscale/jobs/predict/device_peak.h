#pragma once
// Peak dense FLOP/s of a device by name and precision, for MFU. Datasheet numbers (dense, no
// sparsity): H100 SXM / H200: bf16/fp16 989.4 TFLOP/s, tf32 494.7, fp32 66.9. Unknown devices
// and CPUs give 0 (MFU reported as n/a).
#include <string>

#include "lmscale/io/config.h"

namespace lmscale::jobs {
double device_peak_flops(const std::string& device_name, PrecisionMode precision, bool tf32);
}
