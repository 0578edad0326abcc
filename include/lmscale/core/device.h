#pragma once
namespace lmscale {
// Where a tensor's bytes live.
enum class Device { cpu, cuda };
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }
}  // namespace lmscale
