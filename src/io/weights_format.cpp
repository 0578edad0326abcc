#include "lmscale/io/weights_format.h"

#include <string_view>

namespace lmscale::io {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

WeightsFormat weights_format(const std::string& path) {
  return ends_with(path, ".safetensors") || ends_with(path, ".safetensors.tmp") ? WeightsFormat::safetensors
                                                                                 : WeightsFormat::hdf5;
}

}  // namespace lmscale::io
