#include "lmscale/core/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace lmscale {

namespace {
// The first number in a one-line file ("max" or a missing file: nullopt).
std::optional<double> read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(word, &used);
    if (used != word.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
}  // namespace

namespace {
// A "Field:   N kB" line of a /proc file, in bytes.
std::optional<double> proc_kib_field(const char* path, std::string_view field) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() <= field.size() || line.compare(0, field.size(), field) != 0 || line[field.size()] != ':') continue;
    std::istringstream fields(line.substr(field.size() + 1));
    double kib = 0;
    if (fields >> kib) return kib * 1024.0;
  }
  return std::nullopt;
}
}  // namespace

std::optional<double> meminfo_bytes(std::string_view field) { return proc_kib_field("/proc/meminfo", field); }

std::optional<double> process_peak_resident_bytes() { return proc_kib_field("/proc/self/status", "VmHWM"); }

std::optional<CgroupMemory> cgroup_memory() {
  if (auto limit = read_number("/sys/fs/cgroup/memory.max"))
    return CgroupMemory{*limit, read_number("/sys/fs/cgroup/memory.current").value_or(0)};
  if (auto limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"); limit && *limit < 1e18)
    return CgroupMemory{*limit, read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes").value_or(0)};
  return std::nullopt;
}

}  // namespace lmscale
