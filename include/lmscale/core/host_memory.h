#pragma once
// What the host says about its memory (Linux): /proc/meminfo and this process's cgroup limit. The
// memory-fit check asks how much is left; progress lines show the share of the total in use.
#include <optional>
#include <string_view>

namespace lmscale {

// A /proc/meminfo field ("MemTotal", "MemAvailable") in bytes; nullopt where it is not there.
std::optional<double> meminfo_bytes(std::string_view field);

// This process's peak resident set (VmHWM of /proc/self/status: every host page it ever had
// resident at once, pinned memory included), in bytes; nullopt off Linux.
std::optional<double> process_peak_resident_bytes();

// This process's cgroup memory limit and use, in bytes (cgroup v2, else v1); nullopt without a
// limit ("max", or v1's huge sentinel).
struct CgroupMemory {
  double limit = 0, used = 0;
};
std::optional<CgroupMemory> cgroup_memory();

}  // namespace lmscale
