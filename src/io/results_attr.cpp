#include "lmscale/io/results_attr.h"

#include <cmath>
#include <variant>

#include <fmt/format.h>

#include "h5_handles.h"
#include "h5_support.h"
#include "lmscale/core/error.h"

namespace lmscale::io {

AttrValue read_results_attr(const std::string& path, const std::string& object, const std::string& name) {
  const h5::QuietErrors quiet;
  const h5::PropertyList fapl = h5::file_access_properties();
  const h5::File file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), fmt::format("open '{}'", path));
  if (!h5::exists(file.get(), object)) throw Error(fmt::format("'{}' has no {}", path, object));
  const h5::Object obj(H5Oopen(file.get(), object.c_str(), H5P_DEFAULT), fmt::format("open {} in '{}'", object, path));
  if (H5Aexists(obj.get(), name.c_str()) <= 0)
    throw Error(fmt::format("'{}': {} has no attribute {}", path, object, name));
  return h5::read_attr(obj.get(), name);
}

double read_bench_mfu(const std::string& key, const std::string& path) {
  AttrValue v;
  try {
    v = read_results_attr(path, "/bench_model", "mfu");
  } catch (const Error& e) {
    throw UsageError(fmt::format("{} = '{}': {}; give the results file of a bench-model run (its /bench_model mfu "
                                 "attribute), or set cost.mfu",
                                 key, path, e.what()));
  }
  const double mfu = std::holds_alternative<double>(v) ? std::get<double>(v) : NAN;
  if (!(mfu > 0 && mfu <= 1))
    throw UsageError(fmt::format("{} = '{}' holds no usable MFU (/bench_model mfu = {}: a device without a known peak, "
                                 "e.g. a CPU run); set cost.mfu",
                                 key, path, mfu));
  return mfu;
}

}  // namespace lmscale::io
