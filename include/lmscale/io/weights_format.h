#pragma once
// Which format a weights file has, by its name (train.save, prune.weights, prune.output,
// train.resume; docs/hdf5.md): safetensors when the name ends in ".safetensors" (also as
// NAME.safetensors.tmp, the file being written), HDF5 otherwise.
#include <string>

namespace lmscale::io {

enum class WeightsFormat { hdf5, safetensors };

WeightsFormat weights_format(const std::string& path);

}  // namespace lmscale::io
