#pragma once
// The host CPU's model name, for results files' `device_name` on CPU runs (docs/hdf5.md).
#include <istream>
#include <string>

namespace lmscale {

// The first "model name" line of a /proc/cpuinfo text (x86; "Model name" on some ARM kernels),
// value trimmed; "" when there is none (many aarch64 kernels print no model name).
std::string cpu_model_from_cpuinfo(std::istream& cpuinfo);

// cpu_model_from_cpuinfo of /proc/cpuinfo, or "cpu" when the file or the line is missing.
std::string cpu_model_name();

}  // namespace lmscale
