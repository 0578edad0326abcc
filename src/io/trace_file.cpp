#include "lmscale/io/trace_file.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "output_target.h"

namespace lmscale::io {

void write_trace_file(const std::string& path, const std::string& json) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (const auto problem = detail::replace_problem(tmp, true))
    throw Error(fmt::format("run.trace: '{}' {}", tmp, *problem));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(json.data(), static_cast<std::streamsize>(json.size()));
    out.close();
    if (!out) throw Error(fmt::format("run.trace: cannot write '{}'", tmp));
  }
  // Checked again just before the rename: something else may have appeared under the name.
  if (const auto problem = detail::replace_problem(path, true))
    throw Error(fmt::format("run.trace = '{}' {}; the trace is kept in '{}'", path, *problem, tmp));
  fs::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("run.trace: cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
}

}  // namespace lmscale::io
