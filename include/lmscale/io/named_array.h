#pragma once
// One parameter's values on the host for a weights file (HDF5 or safetensors): the unit both
// writers take.
#include <cstdint>
#include <string>
#include <vector>

namespace lmscale::io {

// A host array of float32 values, row-major, with its parameter name and shape.
struct NamedArray {
  std::string name;                  // no '/' (it would create groups); not empty
  std::vector<std::int64_t> shape;   // e.g. {d_out, d_in}; {} = scalar
  const float* data = nullptr;
};

}  // namespace lmscale::io
