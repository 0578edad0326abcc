#include "lmscale/core/cpu_model.h"

#include <fstream>

namespace lmscale {

namespace {

std::string trimmed(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\r");
  return s.substr(begin, end - begin + 1);
}

}  // namespace

std::string cpu_model_from_cpuinfo(std::istream& cpuinfo) {
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trimmed(line.substr(0, colon));
    if (key == "model name" || key == "Model name") return trimmed(line.substr(colon + 1));
  }
  return "";
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string name = cpuinfo ? cpu_model_from_cpuinfo(cpuinfo) : "";
  return name.empty() ? "cpu" : name;
}

}  // namespace lmscale
