#pragma once
// A value of an HDF5 attribute as lmscale writes and reads it: scalars, strings (variable-length
// UTF-8) and 1-D arrays. Shared by results files and checkpoints.
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace lmscale::io {

using AttrValue = std::variant<std::int64_t, double, std::string, std::vector<double>, std::vector<std::int64_t>>;

}  // namespace lmscale::io
